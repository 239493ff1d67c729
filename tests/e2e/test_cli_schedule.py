"""`trainyard schedule` end to end: a real process, real files, the DESIGN §3.3 JSON contract."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainyard.cli.main", "schedule", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_worked_example_json_contract() -> None:
    out = run("--jobs", "examples/seed-jobs.jsonl", "--pools", "examples/seed-pools.yaml", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)  # exactly one JSON document
    assert set(doc) == {"placements", "unplaced", "solve_time_s"}
    assert doc["unplaced"] == [] and isinstance(doc["solve_time_s"], float)
    (p,) = doc["placements"]
    assert {"job", "pool", "devices", "market", "expected_cost_usd", "reason"} <= set(p)
    # Trainium is occupied (available_devices 0): spot A100 with a 15-minute checkpoint interval
    assert (p["job"], p["pool"], p["devices"], p["market"]) == ("seed-example", "a100-spot", 1, "spot")
    assert p["checkpoint_interval_s"] == 900.0
    assert p["expected_cost_usd"] > 0 and p["reason"]


def test_table_output() -> None:
    out = run("--jobs", "examples/seed-jobs.jsonl", "--pools", "examples/seed-pools.yaml")
    assert out.returncode == 0, out.stderr
    assert "a100-spot" in out.stdout and "Placements" in out.stdout


def test_bad_files_exit_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "jobs.jsonl"
    bad.write_text('{"submit_s": 0, "tenant": "t", "spec": {"name": "x"}}\n')
    out = run("--jobs", str(bad), "--pools", "examples/seed-pools.yaml", "--json")
    assert out.returncode == 2
    assert json.loads(out.stdout)["error"]["code"] == "invalid_jobs"
    assert "Traceback" not in out.stderr
    assert out.stderr.splitlines()[0].startswith("error: ") and ":1: spec." in out.stderr
    # a spec file given as POOLS
    out = run("--jobs", "examples/seed-jobs.jsonl", "--pools", "examples/seed-example.yaml", "--json")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert json.loads(out.stdout)["error"]["code"].startswith("invalid")
