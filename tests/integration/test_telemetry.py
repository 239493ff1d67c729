"""Training telemetry through the service with the real local executor: every logged step of a tiny CPU
job reaches `GET /v1/jobs/{id}/metrics` (incremental polling, downsampling), and another tenant's job
is a 404."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controlplane_support import in_process_platform, tiny_spec, wait_done
from trainyard.services.platform import Platform
from trainyard.settings import Settings

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

STEPS = 30


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Platform, TestClient, dict[str, str]]]:
    settings = Settings(home=tmp_path_factory.mktemp("telemetry"), metrics_max_rows_per_s=0)
    with in_process_platform(settings) as live:
        yield live


@pytest.fixture(scope="module")
def finished_job(live: Any) -> dict[str, Any]:
    _platform, c, h = live
    spec = tiny_spec("telemetry", steps=STEPS, seed=3)
    spec["checkpoint"] = {"interval": "1h"}
    # two ranks, so that logs per rank are there to read (left to itself the scheduler keeps a job this
    # small on one of this machine's cores)
    spec["resources"] = {"min_devices": 2, "max_devices": 2}
    r = c.post("/v1/jobs", json={"spec": spec}, headers=h)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    # poll incrementally while it runs, as a live curve does
    seen: list[int] = []
    since = 0
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        page = c.get(f"/v1/jobs/{job_id}/metrics", params={"since_step": since}, headers=h).json()
        seen += [p["step"] for p in page["points"]]
        since = page["next_since_step"]
        state = c.get(f"/v1/jobs/{job_id}", headers=h).json()["state"]
        if state in ("succeeded", "failed", "cancelled"):
            page = c.get(f"/v1/jobs/{job_id}/metrics", params={"since_step": since}, headers=h).json()
            seen += [p["step"] for p in page["points"]]
            break
        time.sleep(0.3)
    doc = wait_done(c, h, job_id)
    assert doc["state"] == "succeeded", doc.get("reason")
    return {"id": job_id, "seen": seen, "doc": doc}


def test_every_step_reaches_the_metrics_endpoint(live: Any, finished_job: dict[str, Any]) -> None:
    _platform, c, h = live
    job_id = finished_job["id"]
    # incremental polling saw each step exactly once, in order
    assert finished_job["seen"] == list(range(1, STEPS + 1))
    page = c.get(f"/v1/jobs/{job_id}/metrics", headers=h).json()
    assert page["downsampled"] is False and page["complete"] is True
    assert [p["step"] for p in page["points"]] == list(range(1, STEPS + 1))
    assert page["attempts"] == [1]
    for p in page["points"]:
        assert p["attempt"] == 1
        assert p["loss"] is not None and p["loss"] > 0
        assert p["step_time_s"] is not None and p["step_time_s"] > 0
        assert p["tokens_per_s"] is not None and p["tokens_per_s"] > 0
        assert p["learning_rate"] is not None and p["learning_rate"] > 0
    # the job's final loss is the last point's
    assert page["points"][-1]["loss"] == pytest.approx(finished_job["doc"]["result"]["loss"])
    # warm-up: the learning rate grows over the first steps
    lrs = [p["learning_rate"] for p in page["points"][:3]]
    assert lrs == sorted(lrs) and lrs[0] < lrs[-1]
    # synthetic data has no eval split: no eval loss
    assert all(p["eval_loss"] is None for p in page["points"])


def test_metrics_downsample_on_read(live: Any, finished_job: dict[str, Any]) -> None:
    _platform, c, h = live
    job_id = finished_job["id"]
    full = c.get(f"/v1/jobs/{job_id}/metrics", headers=h).json()["points"]
    page = c.get(f"/v1/jobs/{job_id}/metrics", params={"max_points": 10}, headers=h).json()
    assert page["downsampled"] is True and page["total_points"] == STEPS
    assert len(page["points"]) <= 10 and page["bucket_steps"] == 3
    assert sum(p["count"] for p in page["points"]) == STEPS
    first = page["points"][0]
    assert first["step"] == 3
    assert first["loss"] == pytest.approx(sum(p["loss"] for p in full[:3]) / 3)
    assert first["loss_min"] == pytest.approx(min(p["loss"] for p in full[:3]))
    # raw pages instead of downsampling
    raw = c.get(
        f"/v1/jobs/{job_id}/metrics", params={"max_points": 10, "downsample": "false"}, headers=h
    ).json()
    assert [p["step"] for p in raw["points"]] == list(range(1, 11))
    assert raw["complete"] is False and raw["next_since_step"] == 10
    # bad input: 422 with the field named
    bad = c.get(f"/v1/jobs/{job_id}/metrics", params={"max_points": 0, "since_step": -1}, headers=h)
    assert bad.status_code == 422
    fields = {e.get("field") for e in bad.json()["error"]["details"]["errors"]}
    assert any("max_points" in str(f) for f in fields) and any("since_step" in str(f) for f in fields)


def test_another_tenants_metrics_are_404(live: Any, finished_job: dict[str, Any]) -> None:
    platform, c, h = live
    platform.tenants.create("telemetry-other")
    other = {"Authorization": f"Bearer {platform.tenants.create_key('telemetry-other')}"}
    r = c.get(f"/v1/jobs/{finished_job['id']}/metrics", headers=other)
    assert r.status_code == 404, r.text
    assert r.json()["error"]["code"] == "not_found"
    assert c.get(f"/v1/jobs/{finished_job['id']}/metrics", headers=h).status_code == 200


def test_logs_per_rank_and_attempt_with_the_built_in_trainer(live: Any, finished_job: dict[str, Any]) -> None:
    _platform, c, h = live
    job_id = finished_job["id"]
    assert finished_job["doc"]["placement"]["devices"] == 2
    r0 = c.get(f"/v1/jobs/{job_id}/logs", params={"rank": 0, "attempt": 1}, headers=h).json()
    assert r0["attempt"] == 1 and r0["attempts"] == [1] and r0["job_state"] == "succeeded"
    text = r0["text"]
    assert "[rank 0] rank 0 started" in text and "from step 0" in text
    assert f"step {STEPS}/{STEPS} loss " in text and " s/step " in text
    assert f"checkpoint of step {STEPS} committed" in text
    assert f"training finished at step {STEPS}" in text
    assert "--- attempt" not in text  # one attempt's part: without the header
    r1 = c.get(f"/v1/jobs/{job_id}/logs", params={"rank": 1, "attempt": 1}, headers=h).json()
    assert "[rank 1] rank 1 started" in r1["text"] and "[rank 0]" not in r1["text"]
    # every attempt (the default) keeps the header lines, as the rank log has them
    whole = c.get(f"/v1/jobs/{job_id}/logs", params={"rank": 0}, headers=h).json()
    assert whole["text"].startswith("--- attempt 1 rank 0 ---\n") and whole["text"].endswith(text)
    # tail and offsets
    last2 = c.get(f"/v1/jobs/{job_id}/logs", params={"attempt": 1, "tail": 2}, headers=h).json()
    assert last2["text"] == "".join(text.splitlines(keepends=True)[-2:])
    assert last2["next_offset"] == r0["size"] and last2["offset"] == r0["size"] - len(last2["text"].encode())
    part = c.get(f"/v1/jobs/{job_id}/logs", params={"attempt": 1, "offset": 10, "limit_bytes": 20}, headers=h)
    assert part.json()["text"] == text.encode()[10:30].decode() and part.json()["next_offset"] == 30
    # a finished job: following returns at once
    t0 = time.monotonic()
    done = c.get(f"/v1/jobs/{job_id}/logs", params={"offset": whole["size"], "wait_s": 10}, headers=h).json()
    assert done["text"] == "" and time.monotonic() - t0 < 5
    # no such rank or attempt: 422 naming the parameter
    for params, name in (({"rank": 5}, "query.rank"), ({"attempt": 7}, "query.attempt")):
        bad = c.get(f"/v1/jobs/{job_id}/logs", params=params, headers=h)
        assert bad.status_code == 422 and bad.json()["error"]["details"]["errors"][0]["field"] == name


def test_logs_are_kept_in_the_tenants_storage_area(live: Any, finished_job: dict[str, Any]) -> None:
    import stat

    platform, c, h = live
    job_id = finished_job["id"]
    storage = Path(platform.storage_policy.area("default", "logs")[len("file://") :])
    kept = storage / job_id / "attempt-1" / "rank-1.log"
    assert kept.is_file()
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    for d in (kept.parent, kept.parent.parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    live_text = c.get(f"/v1/jobs/{job_id}/logs", params={"rank": 1, "attempt": 1}, headers=h).json()["text"]
    assert kept.read_text() == live_text
    # the run directory's copy gone (cleaned up, another host): reads come from the storage area
    with platform.db.session() as s:
        from trainyard.store.repositories import JobRepo

        job = JobRepo(s).get(job_id)
        assert job is not None and job.run_dir
        run_log = Path(job.run_dir) / "rank-1.log"
    moved = run_log.with_name("rank-1.log.moved")
    run_log.rename(moved)
    try:
        got = c.get(f"/v1/jobs/{job_id}/logs", params={"rank": 1, "attempt": 1}, headers=h).json()
        assert got["text"] == live_text and got["attempts"] == [1]
        every = c.get(f"/v1/jobs/{job_id}/logs", params={"rank": 1}, headers=h).json()
        assert every["text"] == "--- attempt 1 rank 1 ---\n" + live_text
    finally:
        moved.rename(run_log)


def test_another_tenants_logs_are_404(live: Any, finished_job: dict[str, Any]) -> None:
    platform, c, _h = live
    platform.tenants.create("telemetry-logs-other")
    other = {"Authorization": f"Bearer {platform.tenants.create_key('telemetry-logs-other')}"}
    for params in ({}, {"attempt": 1}, {"rank": 1, "tail": 5}):
        r = c.get(f"/v1/jobs/{finished_job['id']}/logs", params=params, headers=other)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


SDK_SCRIPT = """
import torch
import trainyard.runtime as ty

session = ty.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.linspace(-1, 1, 32).unsqueeze(1).repeat(1, 4)
y = x.sum(1, keepdim=True)
for step in range(12):
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    extra = {"eval_loss": 0.5} if step + 1 == 12 else {}
    session.report(step + 1, loss=float(loss), tokens=128, learning_rate=0.05, grad_norm=1.5, **extra)
session.finish(final_step=12)
"""


def test_user_code_reports_metrics_through_the_sdk(live: Any, tmp_path: Path) -> None:
    import sys

    _platform, c, h = live
    script = tmp_path / "train.py"
    script.write_text(SDK_SCRIPT)
    spec = tiny_spec("sdk-metrics", steps=12)
    spec["resources"] = {"min_devices": 1, "max_devices": 1}
    spec["entrypoint"] = {"command": [sys.executable, str(script)]}
    r = c.post("/v1/jobs", json={"spec": spec}, headers=h)
    assert r.status_code == 201, r.text
    doc = wait_done(c, h, r.json()["id"])
    assert doc["state"] == "succeeded", doc.get("reason")
    points = c.get(f"/v1/jobs/{doc['id']}/metrics", headers=h).json()["points"]
    assert [p["step"] for p in points] == list(range(1, 13))
    assert all(p["loss"] is not None and p["learning_rate"] == 0.05 for p in points)
    assert all(p["extra"] == {"grad_norm": 1.5} for p in points)
    assert [p["eval_loss"] for p in points] == [None] * 11 + [0.5]
    assert points[0]["step_time_s"] is None and points[1]["tokens_per_s"] > 0  # measured between reports
    losses = [p["loss"] for p in points]
    assert losses[-1] < losses[0]
