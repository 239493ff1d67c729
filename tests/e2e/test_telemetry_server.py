"""Training telemetry against a real `trainyard up` (local executor, sandboxed workers): a tiny CPU job's
every step reaches `GET /v1/jobs/{id}/metrics` through the Python client, and `trainyard jobs logs
--follow` (a real subprocess) streams each rank's log of the built-in trainer until the job ends."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from controlplane_support import ROOT, ServerProcess, tiny_spec
from trainyard.client.client import TrainyardClient as Client

STEPS = 25


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("telemetry-home"), executor="local")
    # every step is a metrics row: the default rate cap (100 rows/s) drops rows of steps shorter than
    # 10 ms, which this tiny model's are on an idle machine (the cap has tests of its own)
    srv.env["TRAINYARD_METRICS_MAX_ROWS_PER_S"] = "0"
    srv.start()
    yield srv
    assert srv.stop() == 0, srv.log_text()


def cli(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "trainyard.cli.main", *args],
        env=env,
        cwd=str(ROOT),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_metrics_and_followed_logs_of_a_real_job(server: ServerProcess, tmp_path: Path) -> None:
    env = server.cli_env()
    spec = tiny_spec("telemetry-e2e", steps=STEPS, seed=5)
    spec["resources"] = {"min_devices": 2, "max_devices": 2}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    with Client(server.url, api_key=server.api_key) as c:
        job_id = c.submit(spec)["id"]
        follow = ["jobs", "logs", job_id, "--follow", "--poll-s", "1", "--rank"]
        followers = {r: cli([*follow, str(r)], env) for r in (0, 1)}
        outs = {}
        for r, proc in followers.items():
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err
            outs[r] = out
        doc = c.get_job(job_id)
        assert doc["state"] == "succeeded", doc.get("reason")
        assert doc["placement"]["devices"] == 2
        page = c.job_metrics(job_id)
        assert [p["step"] for p in page["points"]] == list(range(1, STEPS + 1))
        assert all(p["loss"] is not None and p["step_time_s"] for p in page["points"])
        assert page["points"][-1]["loss"] == pytest.approx(doc["result"]["loss"])
    for r in (0, 1):
        assert outs[r].startswith(f"--- attempt 1 rank {r} ---\n"), outs[r][:200]
        assert f"[rank {r}] rank {r} started" in outs[r]
        assert f"step {STEPS}/{STEPS} loss" in outs[r]
        assert f"training finished at step {STEPS}" in outs[r]
    assert f"checkpoint of step {STEPS} committed" in outs[0]
    # one attempt's tail, as a user reads it after the fact
    tail = subprocess.run(
        [sys.executable, "-m", "trainyard.cli.main", "jobs", "logs", job_id, "--attempt", "1", "--tail", "2"],
        env=env,
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert tail.returncode == 0, tail.stderr
    assert tail.stdout.count("\n") == 2 and f"training finished at step {STEPS}" in tail.stdout
