"""Preemption through the service with the real local executor: `POST /v1/jobs/{id}/preempt` mid-run, the
job checkpoints, goes preempted -> queued, is placed again and resumes; its final weights are
bit-identical to an uninterrupted run of the same spec, and its cost counts both attempts.

Also, with a scripted executor and a fake clock: spot pools preempt running jobs at their
interruption rate (a seeded Poisson process), and infrastructure restarts wait their back-off."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controlplane_support import in_process_platform, tiny_spec
from fakes import FakeExecutor, ManualClock
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.services.scheduling import GreedyCheapestRound
from trainyard.settings import Settings
from trainyard.spec.models import JobSpec

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

STEPS = 40


def spec(name: str) -> dict[str, Any]:
    doc = tiny_spec(name, steps=STEPS, seq_len=128, global_batch=8, seed=11)
    # big enough that a step takes tens of milliseconds even on a fast, idle machine: progress is
    # reported by heartbeats (one a second), and the drill must land while the job is mid-run
    doc["model"] = {**doc["model"], "n_layers": 4, "d_model": 128, "vocab_size": 1024}
    doc["checkpoint"] = {"interval": "1s", "keep_last": 2}
    return doc


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Platform, TestClient, dict[str, str]]]:
    settings = Settings(home=tmp_path_factory.mktemp("preempt"))
    with in_process_platform(settings, price_usd_per_device_hour=3.6) as live:
        yield live


def wait_for(client: TestClient, h: dict[str, str], job_id: str, pred: Any, timeout_s: float = 150.0) -> dict:
    deadline = time.monotonic() + timeout_s
    doc: dict[str, Any] = {}
    while time.monotonic() < deadline:
        doc = client.get(f"/v1/jobs/{job_id}", headers=h).json()
        if pred(doc):
            return doc
        if doc["state"] in ("failed", "cancelled"):
            raise AssertionError(f"{job_id} ended {doc['state']}: {doc.get('reason')}")
        time.sleep(0.1)
    raise AssertionError(f"condition not met in {timeout_s} s: {doc.get('state')} {doc.get('progress')}")


def test_preempt_mid_run_resumes_and_matches_an_uninterrupted_run(live: Any) -> None:
    _platform, c, h = live
    plain = c.post("/v1/jobs", json={"spec": spec("plain")}, headers=h).json()["id"]
    drill = c.post("/v1/jobs", json={"spec": spec("drill")}, headers=h).json()["id"]
    # not running yet (or not this tenant's) -> clear 4xx, never a 5xx
    assert c.post("/v1/jobs/job-000000000000/preempt", json={}, headers=h).status_code == 404

    wait_for(c, h, drill, lambda d: d["state"] == "running" and (d["progress"] or {}).get("step", 0) >= 8)
    r = c.post(f"/v1/jobs/{drill}/preempt", json={"notice_s": 10}, headers=h)
    assert r.status_code == 200, r.text
    done = wait_for(c, h, drill, lambda d: d["state"] == "succeeded")
    base = wait_for(c, h, plain, lambda d: d["state"] == "succeeded")

    assert done["attempt"] == 2 and base["attempt"] == 1
    assert done["result"]["final_step"] == STEPS
    assert done["result"]["model_sha256"] == base["result"]["model_sha256"]

    events = c.get(f"/v1/jobs/{drill}/events", params={"limit": 5000}, headers=h).json()["events"]
    kinds = [e["kind"] for e in events]
    assert "preemption_notice" in kinds and "preempted" in kinds
    moves = [(e["data"]["from"], e["data"]["to"]) for e in events if e["kind"] == "state"]
    assert ("running", "preempted") in moves and ("preempted", "queued") in moves
    assert moves[-1] == ("running", "succeeded")
    started = [e["data"] for e in events if e["kind"] == "started"]
    assert started[-1]["attempt"] == 2 and (started[-1]["resumed_from_step"] or 0) >= 1
    # a preemption is not a done job: the job is still owned once, and finished once
    assert moves.count(("running", "succeeded")) == 1
    # every attempt is charged: one cost event per attempt, and the job's cost is their sum
    costs = [e["data"] for e in events if e["kind"] == "cost"]
    assert sorted(d["attempt"] for d in costs) == [1, 2]
    assert all(d["device_s"] > 0 and d["price_usd_per_device_hour"] == 3.6 for d in costs)
    assert done["cost_usd"] == pytest.approx(sum(d["usd"] for d in costs), rel=1e-3, abs=1e-6)

    # a finished job cannot be preempted
    again = c.post(f"/v1/jobs/{drill}/preempt", json={}, headers=h)
    assert again.status_code == 409 and again.json()["error"]["code"] in ("conflict", "illegal_transition")


# ---- scripted executor, fake clock ------------------------------------------------------------------


def scripted(tmp_path: Path, clock: ManualClock) -> tuple[Platform, FakeExecutor]:
    ex = FakeExecutor()
    platform = Platform.open(
        Settings(home=tmp_path),
        PlatformOptions(
            executor=ex, schedule_round=GreedyCheapestRound(), cpu_count=8, with_catalog=False, clock=clock
        ),
    )
    return platform, ex


def test_spot_pool_preempts_at_its_rate(tmp_path: Path) -> None:
    clock = ManualClock()
    platform, ex = scripted(tmp_path, clock)
    try:
        # one preemption per hour on average; 8 jobs for 2 simulated hours -> about 16 notices
        platform.pools.update(
            "local-cpu", {"market": "spot", "interruption_rate_per_hour": 1.0, "notice_s": 7}
        )
        for i in range(8):
            platform.jobs.submit(
                _principal(platform), JobSpec.model_validate(tiny_spec(f"spot-{i}", steps=10_000_000))
            )
        platform.tick()
        for jid in [r.job_id for r in ex.launches]:
            ex.emit(jid, "started", {"rank": 0, "pid": 1, "host": "h"}, time_s=clock.now)
        platform.tick()
        running = [j for j in platform.jobs.list(_principal(platform), states=["running"]).jobs]
        assert running
        notices = 0
        for _ in range(120):  # 2 h in 1-minute ticks
            clock.now += 60
            before = len(ex.preempted)
            platform.tick()
            notices += len(ex.preempted) - before
        expected = 2.0 * len(running)  # rate 1/h x 2 h per running job (the fake never stops them)
        assert 0.4 * expected <= notices <= 1.8 * expected, (notices, expected)
        assert all(n == 7 for _, n in ex.preempted)
    finally:
        platform.close()


def _principal(platform: Platform) -> Any:
    from trainyard.services.domain import Principal

    t = next(t for t in platform.tenants.list() if t.name == "default")
    return Principal(tenant_id=t.id, tenant_name=t.name, key_id="test", admin=True)


def test_preemptions_do_not_use_up_the_restart_budget(tmp_path: Path) -> None:
    clock = ManualClock()
    platform, ex = scripted(tmp_path, clock)
    try:
        (job, _) = platform.jobs.submit(
            _principal(platform), JobSpec.model_validate(tiny_spec("often-preempted"))
        )
        for attempt in range(1, 6):  # five preemptions in a row
            platform.tick()  # placed and launched
            assert platform.jobs.get(_principal(platform), job.id).attempt == attempt
            ex.emit(job.id, "preempted", {"rank": 0, "step": attempt}, time_s=clock.now)
            clock.now += 10
            platform.tick()  # preempted -> queued
        platform.tick()
        ex.emit(job.id, "lost", {"reason": "rank 0 stopped heart-beating", "rank": 0}, time_s=clock.now)
        platform.tick()  # lost -> restart -> queued
        platform.tick()  # placed again
        doc = platform.jobs.get(_principal(platform), job.id)
        assert doc.state.value in ("starting", "running"), doc.reason  # restarted, not failed
        assert doc.attempt == 7
        events = platform.jobs.events(_principal(platform), job.id, limit=5000)
        restarts = [e.data for e in events if e.kind == "restart"]
        assert len(restarts) == 1 and restarts[0]["classification"] == "infra"
        assert restarts[0]["restart"] == 1 and restarts[0]["max_restarts"] == 3
    finally:
        platform.close()


class StorageRefusingExecutor(FakeExecutor):
    """An executor whose launches are refused for unusable checkpoint storage (as Ray refuses a local
    path that not every node mounts)."""

    def launch(self, req: Any) -> Any:
        from trainyard.errors import StorageError

        raise StorageError(
            f"checkpoint storage {req.checkpoint_url} is not shared by every node",
            hint="Use an object store or a path under --ray-shared-paths.",
        )


def test_storage_error_at_launch_fails_at_once(tmp_path: Path) -> None:
    clock = ManualClock()
    ex = StorageRefusingExecutor()
    platform = Platform.open(
        Settings(home=tmp_path),
        PlatformOptions(
            executor=ex, schedule_round=GreedyCheapestRound(), cpu_count=2, with_catalog=False, clock=clock
        ),
    )
    try:
        (job, _) = platform.jobs.submit(
            _principal(platform), JobSpec.model_validate(tiny_spec("bad-storage"))
        )
        platform.tick()
        doc = platform.jobs.get(_principal(platform), job.id)
        assert doc.state.value == "failed" and doc.attempt == 1
        assert "checkpoint storage unusable" in (doc.reason or "")
        events = platform.jobs.events(_principal(platform), job.id, limit=5000)
        failed = [e.data for e in events if e.kind == "failed"]
        assert failed and failed[0]["classification"] == "storage" and "ray-shared-paths" in failed[0]["hint"]
        assert not [e for e in events if e.kind == "restart"]
    finally:
        platform.close()


def test_infra_restarts_wait_their_backoff_and_user_errors_fail(tmp_path: Path) -> None:
    clock = ManualClock()
    platform, ex = scripted(tmp_path, clock)
    assert platform.supervisor is not None
    platform.supervisor.restart_backoff = True  # as `trainyard up` runs it
    p = _principal(platform)
    try:
        (job, _) = platform.jobs.submit(p, JobSpec.model_validate(tiny_spec("flaky")))
        delays = []
        for n in range(3):  # RestartPolicy(): 1 s, 2 s, 4 s
            platform.tick()
            assert platform.jobs.get(p, job.id).state.value == "starting"
            ex.emit(job.id, "lost", {"reason": "rank 0 stopped heart-beating", "rank": 0}, time_s=clock.now)
            platform.tick()
            doc = platform.jobs.get(p, job.id)
            assert doc.state.value == "preempted" and "restarting in" in (doc.reason or "")
            delay = platform.supervisor.restart_policy.backoff_s(n)
            delays.append(delay)
            clock.now += delay * 0.5
            platform.tick()
            assert platform.jobs.get(p, job.id).state.value == "preempted"  # still waiting
            clock.now += delay * 0.6
        assert delays == [1.0, 2.0, 4.0]
        platform.tick()  # released and placed: the 4th attempt
        ex.emit(job.id, "lost", {"reason": "again", "rank": 0}, time_s=clock.now)
        platform.tick()
        doc = platform.jobs.get(p, job.id)
        assert doc.state.value == "failed" and doc.attempt == 4  # budget of 3 restarts used up

        (bug, _) = platform.jobs.submit(p, JobSpec.model_validate(tiny_spec("bug")))
        platform.tick()
        tail = 'Traceback (most recent call last):\n  File "train.py"\nZeroDivisionError: division by zero'
        ex.emit(
            bug.id,
            "failed",
            {"reason": "ZeroDivisionError", "classification": "user", "traceback_tail": tail},
            time_s=clock.now,
        )
        platform.tick()
        doc = platform.jobs.get(p, bug.id)
        assert doc.state.value == "failed" and doc.attempt == 1
        events = platform.jobs.events(p, bug.id, limit=5000)
        failed = [e.data for e in events if e.kind == "failed"]
        assert failed and "ZeroDivisionError: division by zero" in failed[0]["traceback_tail"]
        assert not [e for e in events if e.kind == "restart"]
    finally:
        platform.close()
