"""Shared fixtures. Tests talk only to 127.0.0.1; a missing service fails loudly, never skips."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


@pytest.fixture
def examples_dir() -> Path:
    return EXAMPLES


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never touch the user's ~/.trainyard from a test."""
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path_factory.mktemp("home")))
