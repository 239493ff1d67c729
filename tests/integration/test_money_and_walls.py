"""Behaviours where a bug costs money or crosses a tenant wall: free capacity counts running jobs, the
device quota holds, preempt answers 404 across tenants, the Idempotency-Key digest covers the whole spec,
and an attempt requeued after a control-plane restart is billed to its last heartbeat. The control loop
runs against the scripted executor on a real SQLite store, with a clock the test moves."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controlplane_support import tiny_spec
from fakes import FakeExecutor, ManualClock
from trainyard.api.app import create_app
from trainyard.services.lifecycle import JobState
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.services.scheduling import GreedyCheapestRound
from trainyard.settings import Settings

PRICE_USD_PER_DEVICE_HOUR = 3.6  # $0.001 per device-second


def one_device(name: str, **workload: Any) -> dict[str, Any]:
    return {**tiny_spec(name, **workload), "resources": {"min_devices": 1, "max_devices": 1}}


class Env:
    def __init__(self, home: Path, cores: int) -> None:
        self.clock = ManualClock()
        self.ex = FakeExecutor(clock=self.clock.now)
        self.p = Platform.open(
            Settings(home=home, database_url=f"sqlite:///{home / 'trainyard.db'}"),
            PlatformOptions(
                executor=self.ex,
                schedule_round=GreedyCheapestRound(),
                cpu_count=cores,
                clock=self.clock,
                with_catalog=False,
            ),
        )
        self.p.pools.update("local-cpu", {"price_usd_per_device_hour": PRICE_USD_PER_DEVICE_HOUR})
        self.c = TestClient(create_app(self.p, access_log=False))
        self.admin = {"Authorization": f"Bearer {self.p.settings.api_key_path.read_text().strip()}"}

    def tenant(self, name: str, **quotas: Any) -> dict[str, str]:
        r = self.c.post("/v1/tenants", json={"name": name, **quotas}, headers=self.admin)
        assert r.status_code == 201, r.text
        return {"Authorization": f"Bearer {r.json()['api_key']}"}

    def submit(self, spec: dict[str, Any], headers: dict[str, str] | None = None) -> str:
        r = self.c.post("/v1/jobs", json={"spec": spec}, headers=headers or self.admin)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def job(self, job_id: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
        r = self.c.get(f"/v1/jobs/{job_id}", headers=headers or self.admin)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def advance(self, seconds: float) -> None:
        self.clock.now += seconds
        self.ex.clock = self.clock.now

    def heartbeat(self, job_id: str, step: int) -> None:
        self.ex.emit(job_id, "heartbeat", {"rank": 0, "step": step}, time_s=self.clock.now)


@pytest.fixture
def env1(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path, cores=1)
    yield e
    e.p.close()


@pytest.fixture
def env2(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path, cores=2)
    yield e
    e.p.close()


def test_a_running_job_holds_its_device_so_a_second_job_waits(env1: Env) -> None:
    first = env1.submit(one_device("first"))
    env1.p.tick()
    assert env1.job(first)["state"] in ("starting", "running")
    env1.heartbeat(first, 1)
    second = env1.submit(one_device("second"))
    env1.p.tick()
    env1.p.tick()
    assert env1.job(first)["state"] == "running"
    assert env1.job(second)["state"] == "queued"
    assert [r.job_id for r in env1.ex.launches] == [first]
    # when the first one finishes, the device is free again and the second starts
    env1.ex.emit(first, "succeeded", {"rank": 0}, time_s=env1.clock.now)
    env1.p.tick()
    env1.p.tick()
    assert [r.job_id for r in env1.ex.launches] == [first, second]


def test_max_active_devices_quota_keeps_a_tenant_to_its_devices(env2: Env) -> None:
    capped = env2.tenant("capped", max_active_devices=1)
    a = env2.submit(one_device("a"), capped)
    b = env2.submit(one_device("b"), capped)
    env2.p.tick()
    env2.p.tick()
    launched = [r.job_id for r in env2.ex.launches]
    assert len(launched) == 1 and launched[0] in (a, b)
    waiting = b if launched[0] == a else a
    assert env2.job(waiting, capped)["state"] == "queued"
    # the pool has a free device: another tenant's job takes it at once
    other = env2.submit(one_device("other"))
    env2.p.tick()
    assert [r.job_id for r in env2.ex.launches] == [launched[0], other]


def test_another_tenants_preempt_is_404_and_delivers_no_notice(env1: Env) -> None:
    victim = env1.submit(one_device("victim"))
    env1.p.tick()
    env1.heartbeat(victim, 1)
    env1.p.tick()
    assert env1.job(victim)["state"] == "running"
    intruder = env1.tenant("intruder")
    r = env1.c.post(f"/v1/jobs/{victim}/preempt", json={"notice_s": 5}, headers=intruder)
    assert r.status_code == 404, r.text
    assert env1.ex.preempted == []
    assert env1.job(victim)["state"] == "running"
    # the owner's own preempt goes through, so the 404 above is the wall and not a broken route
    r = env1.c.post(f"/v1/jobs/{victim}/preempt", json={"notice_s": 5}, headers=env1.admin)
    assert r.status_code == 200, r.text
    assert env1.ex.preempted == [(victim, 5.0)]


def test_idempotency_key_with_a_different_step_count_is_a_conflict(env1: Env) -> None:
    h = {**env1.admin, "Idempotency-Key": "same-name-other-steps"}
    first = env1.c.post("/v1/jobs", json={"spec": one_device("same", steps=20)}, headers=h)
    assert first.status_code == 201, first.text
    again = env1.c.post("/v1/jobs", json={"spec": one_device("same", steps=20)}, headers=h)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    other = env1.c.post("/v1/jobs", json={"spec": one_device("same", steps=21)}, headers=h)
    assert other.status_code == 409, other.text
    assert other.json()["error"]["details"]["job_id"] == first.json()["id"]


def test_attempt_requeued_after_a_restart_is_billed_to_its_last_heartbeat(env1: Env) -> None:
    job_id = env1.submit(one_device("billed"))
    env1.p.tick()
    env1.heartbeat(job_id, 1)
    env1.p.tick()
    env1.advance(10.0)
    env1.heartbeat(job_id, 10)
    env1.p.tick()
    # the control plane is down for 1000 s; its workers died meanwhile (the executor adopts nothing)
    env1.advance(1000.0)
    counts = env1.p.supervisor.reconcile()  # type: ignore[union-attr]
    assert counts["requeued"] == 1
    doc = env1.job(job_id)
    assert doc["state"] == JobState.QUEUED.value
    # one device × 10 s (start to last heartbeat) at $0.001 per device-second, not the 1010 s to restart
    assert doc["cost_usd"] == pytest.approx(10.0 * 0.001)
