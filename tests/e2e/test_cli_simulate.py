"""`trainyard simulate` and `trainyard trace generate` end to end: real processes, real files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEYS = [
    "policy", "jobs_total", "jobs_completed", "total_cost_usd", "committed_cost_usd", "mean_jct_s",
    "p99_jct_s", "deadline_misses", "preemptions", "lost_work_device_s", "solver_time_p99_s",
    "lower_bound_cost_usd",
]  # fmt: skip


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainyard.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


def test_generate_then_simulate_json_contract_and_report(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    gen = run(
        "trace",
        "generate",
        "--jobs",
        "12",
        "--days",
        "0.3",
        "--seed",
        "3",
        "--hours",
        "0.3:2",
        "--out",
        str(trace),
    )
    assert gen.returncode == 0, gen.stderr
    assert len(trace.read_text().splitlines()) == 12

    args = ("simulate", "--trace", str(trace), "--pools", "examples/sim-pools.yaml", "--seed", "2")
    out = run(*args, "--policy", "cheapest-hourly", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)  # exactly one JSON document
    assert list(doc) == KEYS
    assert doc["policy"] == "cheapest-hourly" and doc["jobs_total"] == 12 and doc["jobs_completed"] == 12
    assert doc["total_cost_usd"] >= doc["lower_bound_cost_usd"] > 0

    report = tmp_path / "report"
    both = run(*args, "--policy", "trainyard,on-demand-only", "--json", "--report", str(report))
    assert both.returncode == 0, both.stderr
    docs = json.loads(both.stdout)
    assert [d["policy"] for d in docs] == ["trainyard", "on-demand-only"]
    assert docs[0]["total_cost_usd"] < docs[1]["total_cost_usd"]
    for name in ("summary.csv", "jobs.csv", "timeline.csv", "pools.csv", "summary.md"):
        assert (report / name).stat().st_size > 0
    for name in ("cost_over_time.png", "queue_length.png", "pool_utilisation.png", "preemptions.png"):
        assert (report / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = (report / "summary.csv").read_text().splitlines()
    assert rows[0].split(",") == KEYS and len(rows) == 3

    # replaying a packaged spot preemption trace on a pool
    spot = run(
        *args, "--policy", "cheapest-hourly", "--spot-trace", "aws-l4-spot=aws-preemption-4node-us-west-2c"
    )
    assert spot.returncode == 0, spot.stderr
    assert "cheapest-hourly" in spot.stdout and "lower bound" in spot.stdout


def test_bad_input_exits_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"submit_s": 0, "tenant": "t", "spec": {"name": "x"}}\n')
    cases = [
        ("--trace", str(bad), "--pools", "examples/sim-pools.yaml"),
        (
            "--trace",
            "examples/trace-small.jsonl",
            "--pools",
            "examples/sim-pools.yaml",
            "--policy",
            "cheapest",
        ),
    ]
    for case in cases:
        out = run("simulate", *case, "--json")
        assert out.returncode == 2, (case, out.stderr)
        # --json: the error document on stdout (the same envelope the API answers with)
        assert set(json.loads(out.stdout)["error"]) == {"code", "message", "hint", "details"}
        assert "Traceback" not in out.stderr
        assert out.stderr.splitlines()[0].startswith("error: ")
