"""Training telemetry through the service with the real local executor: every logged step of a tiny CPU
job reaches `GET /v1/jobs/{id}/metrics` (incremental polling, downsampling), and another tenant's job
is a 404."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controlplane_support import tiny_spec
from trainyard.api.app import create_app
from trainyard.executors.local import LocalExecutor
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.services.scheduling import GreedyCheapestRound
from trainyard.settings import Settings

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

STEPS = 30


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Platform, TestClient, dict[str, str]]]:
    home = tmp_path_factory.mktemp("telemetry")
    executor = LocalExecutor(heartbeat_timeout_s=60.0)
    platform = Platform.open(
        Settings(home=home, metrics_max_rows_per_s=0),
        PlatformOptions(
            executor=executor,
            schedule_round=GreedyCheapestRound(),
            cpu_count=2,
            with_catalog=False,
            loop_interval_s=0.1,
        ),
    )
    platform.start_loop()
    client = TestClient(create_app(platform, access_log=False))
    headers = {"Authorization": f"Bearer {platform.settings.api_key_path.read_text().strip()}"}
    with client:
        yield platform, client, headers
    platform.stop_loop()
    executor.shutdown(kill_workers=True)
    platform.close()


def wait_done(client: TestClient, h: dict[str, str], job_id: str, timeout_s: float = 180.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    doc: dict[str, Any] = {}
    while time.monotonic() < deadline:
        doc = client.get(f"/v1/jobs/{job_id}", headers=h).json()
        if doc["state"] in ("succeeded", "failed", "cancelled"):
            return doc
        time.sleep(0.2)
    raise AssertionError(f"{job_id} did not finish in {timeout_s} s: {doc.get('state')}")


@pytest.fixture(scope="module")
def finished_job(live: Any) -> dict[str, Any]:
    _platform, c, h = live
    spec = tiny_spec("telemetry", steps=STEPS, seed=3)
    spec["checkpoint"] = {"interval": "1h"}
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
