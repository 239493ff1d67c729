"""Honest pools (DESIGN §3.4): cloud pools loaded from a POOLS file are planning-only on a server whose
executor does not serve them. A job whose only feasible capacity is planning-only is quoted, stays queued
with a reason saying so, is never started, and no step-time measurement appears. The real local
executor runs the server; the pools API shows ``backend`` and ``executable``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controlplane_support import ROOT, tiny_spec
from fakes import FakeExecutor
from trainyard.api.app import create_app
from trainyard.catalog.pools import load_pools
from trainyard.executors.local import LocalExecutor
from trainyard.services.domain import Principal
from trainyard.services.lifecycle import JobState
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.services.scheduler_adapter import OptimizerRound
from trainyard.settings import Settings
from trainyard.spec.loader import spec_from_dict
from trainyard.store.repositories import StepTimeRepo, TenantRepo


def _principal(p: Platform) -> Principal:
    with p.db.session() as s:
        t = TenantRepo(s).by_name("default")
    assert t is not None
    return Principal(tenant_id=t.id, tenant_name="default", key_id="test", admin=True)


@pytest.fixture
def local_platform(tmp_path: Path) -> Iterator[tuple[Platform, LocalExecutor]]:
    ex = LocalExecutor(warm_start=False, gpus=[])  # this machine: its CPU, no GPU
    p = Platform.open(
        Settings(home=tmp_path, database_url=f"sqlite:///{tmp_path / 'trainyard.db'}"),
        PlatformOptions(executor=ex, cpu_count=2, with_catalog=False, schedule_round=OptimizerRound()),
    )
    for pool in load_pools(ROOT / "examples" / "seed-pools.yaml"):
        p.pools.put(pool)
    try:
        yield p, ex
    finally:
        p.close()


@pytest.mark.parametrize("round_name", ["optimizer", "greedy"])
def test_job_feasible_only_on_planning_only_pools_is_never_started(
    local_platform: tuple[Platform, LocalExecutor], round_name: str
) -> None:
    p, ex = local_platform
    if round_name == "greedy":
        from trainyard.services.scheduling import GreedyCheapestRound

        assert p.supervisor is not None
        p.supervisor.schedule_round = GreedyCheapestRound()
    who = _principal(p)
    doc: dict[str, Any] = {**tiny_spec("nvidia-only"), "requirements": {"allow": ["nvidia"]}}
    job, _ = p.jobs.submit(who, spec_from_dict(doc))
    for _ in range(3):
        p.tick()
    got = p.jobs.get(who, job.id)
    assert got.state == JobState.QUEUED, got.state
    assert any(o["feasible"] and o["pool"].startswith("a100") for o in got.quote)  # quoted ...
    assert "planning-only" in got.reason and "never started" in got.reason, got.reason
    assert "a100-spot" in got.reason
    assert got.placement is None and got.attempt == 0  # ... never placed, never launched
    assert ex.workers(job.id) == [] and not (p.home / "runs" / job.id).exists()
    with p.db.session() as s:
        assert StepTimeRepo(s).list() == []

    # a CPU job on the same server does run on local-cpu: the executor serves that pool
    assert p.supervisor is not None
    pools = {q.name: q for q in p.pools.pools()}
    assert p.supervisor.executable(pools["local-cpu"])
    assert not any(p.supervisor.executable(pools[n]) for n in ("a100-spot", "a100-on-demand", "tpu-v4"))


def test_pools_api_shows_backend_and_executable(local_platform: tuple[Platform, LocalExecutor]) -> None:
    p, _ = local_platform
    with TestClient(create_app(p, access_log=False)) as c:
        key = (p.home / "api_key").read_text().strip()
        pools = {
            d["name"]: d
            for d in c.get("/v1/pools", headers={"Authorization": f"Bearer {key}"}).json()["pools"]
        }
        assert pools["local-cpu"]["backend"] == "local" and pools["local-cpu"]["executable"] is True
        for name in ("a100-spot", "a100-on-demand", "trainium", "tpu-v4"):
            assert pools[name]["backend"] == "none" and pools[name]["executable"] is False, pools[name]
        # an admin may declare a pool local; this machine has no A100, so it is still not executable
        r = c.patch(
            "/v1/pools/a100-spot", json={"backend": "local"}, headers={"Authorization": f"Bearer {key}"}
        )
        assert r.status_code == 200 and r.json()["backend"] == "local" and r.json()["executable"] is False


def test_measurement_is_stored_only_under_the_reported_accelerator(tmp_path: Path) -> None:
    """A scripted attempt placed on an A100 pool whose worker reports the CPU teaches nothing."""
    ex = FakeExecutor()
    p = Platform.open(
        Settings(home=tmp_path, database_url=f"sqlite:///{tmp_path / 'trainyard.db'}"),
        PlatformOptions(executor=ex, cpu_count=2, with_catalog=False, schedule_round=OptimizerRound()),
    )
    try:
        p.pools.put(
            next(q for q in load_pools(ROOT / "examples" / "seed-pools.yaml") if q.name == "a100-spot")
        )
        p.pools.delete("local-cpu")
        who = _principal(p)
        doc: dict[str, Any] = {**tiny_spec("fake-a100", steps=100), "requirements": {"allow": ["nvidia"]}}
        job, _ = p.jobs.submit(who, spec_from_dict(doc))
        p.tick()
        placed = p.jobs.get(who, job.id)
        assert placed.placement is not None and placed.placement.accelerator == "a100-40gb"
        assert ex.launches[-1].accelerator == "a100-40gb"  # the launch names the accelerator
        ex.emit(job.id, "started", {"rank": 0, "device": {"type": "cpu", "accelerator": "cpu"}})
        for step in range(1, 60):
            ex.emit(job.id, "heartbeat", {"rank": 0, "step": step, "step_time_s": 0.01})
        ex.emit(job.id, "succeeded", {"model_path": "/m", "model_sha256": "ab" * 32, "final_step": 100})
        p.tick()
        assert p.jobs.get(who, job.id).state == JobState.SUCCEEDED
        with p.db.session() as s:
            assert StepTimeRepo(s).list() == []
    finally:
        p.close()
