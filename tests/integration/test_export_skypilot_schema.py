"""Exported SkyPilot tasks validate against SkyPilot's own task schema (``sky.utils.schemas``), from the
real ``skypilot`` package.

SkyPilot cannot be installed beside trainyard's pins (it pins an older uvicorn and click), so `make test`
installs it into a virtual environment of its own (`.venv-skypilot`) and the test validates there. Building
a ``sky.Task`` would fetch SkyPilot's cloud catalogs from the internet; the schema check is the part of
its parser that runs offline.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from trainyard.cli.main import app

SKYPILOT = "skypilot==0.14.1"
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
VALIDATE = """
import json, sys, yaml
from sky.utils import common_utils, schemas
for path in sys.argv[1:]:
    task = yaml.safe_load(open(path))
    common_utils.validate_schema(task, schemas.get_task_schema(), f"{path}: ")
    res = task["resources"]
    for r in res.get("any_of", [res]):
        common_utils.validate_schema(r, schemas.get_resources_schema(), f"{path} resources: ")
    print(json.dumps({"path": path, "ok": True}))
"""


@pytest.fixture(scope="module")
def sky_python() -> Path:
    """The interpreter of the SkyPilot environment that `make test` installs (.venv-skypilot)."""
    python = REPO / ".venv-skypilot" / "bin" / "python"
    if not (REPO / ".venv-skypilot" / ".installed").exists():
        pytest.fail(f"{python} is missing: `make test` installs {SKYPILOT} there for this test")
    return python


def _export(args: list[str], out: Path) -> dict[str, object]:
    result = CliRunner().invoke(app, ["export", "skypilot", *args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load(out.read_text())
    assert isinstance(doc, dict)
    return doc


def test_exported_tasks_pass_skypilots_schema(sky_python: Path, tmp_path: Path) -> None:
    spec = str(EXAMPLES / "lora-7b.yaml")
    pools = str(EXAMPLES / "seed-pools.yaml")
    s3_spec = tmp_path / "s3.yaml"
    doc = yaml.safe_load((EXAMPLES / "lora-7b.yaml").read_text())
    doc.setdefault("checkpoint", {})["storage"] = "s3://team-bucket/ckpt"
    s3_spec.write_text(yaml.safe_dump(doc))
    cases = {
        "cheapest": [spec],
        "multi-node": [spec, "--option", "3"],
        "any-of": [spec, "--any-of", "3"],
        "seed-pools": [spec, "--pools", pools, "--setup", "pip install trainyard"],
        "bucket": [str(s3_spec)],
    }
    paths = []
    for name, args in cases.items():
        out = tmp_path / f"{name}.yaml"
        _export(args, out)
        paths.append(str(out))
    proc = subprocess.run(
        [str(sky_python), "-c", VALIDATE, *paths], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [json.loads(line)["ok"] for line in proc.stdout.splitlines()] == [True] * len(paths)


def test_skypilots_schema_rejects_a_wrong_field(sky_python: Path, tmp_path: Path) -> None:
    """The check has teeth: a misspelt resources field fails SkyPilot's validation."""
    out = tmp_path / "task.yaml"
    doc = _export([str(EXAMPLES / "lora-7b.yaml")], out)
    doc["resources"]["use_spots"] = True  # type: ignore[index]
    out.write_text(yaml.safe_dump(doc))
    proc = subprocess.run(
        [str(sky_python), "-c", VALIDATE, str(out)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0
    assert "use_spots" in proc.stderr
