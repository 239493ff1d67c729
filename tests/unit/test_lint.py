"""The code base stays lint-clean, formatted and type-checked (the same checks as `make lint`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PATHS = ["src", "tests", "benchmarks"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_check_is_clean() -> None:
    r = run(str(BIN / "ruff"), "check", *PATHS)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_is_clean() -> None:
    r = run(str(BIN / "ruff"), "format", "--check", *PATHS)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_is_clean() -> None:
    r = run(str(BIN / "mypy"))
    assert r.returncode == 0, r.stdout + r.stderr
