"""Re-planning in the running service: the optimiser sees running jobs, migrates one when a price jump
makes the move pay (and does not flap back), and takes a spot job that falls behind its deadline to
on-demand capacity. The control loop runs against the scripted executor on a real SQLite store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fakes import FakeExecutor, ManualClock
from trainyard.catalog.pools import Pool
from trainyard.schedule import Replanner
from trainyard.services.domain import Principal
from trainyard.services.lifecycle import JobState
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.services.scheduler_adapter import OptimizerRound, ReplanningSupervisor
from trainyard.settings import Settings
from trainyard.spec.loader import spec_from_dict

STEPS = 200_000  # about 12 h on one A100


def spec(name: str, **objective: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "trainyard/v1",
        "kind": "TrainingJob",
        "name": name,
        "model": {
            "architecture": "decoder",
            "n_layers": 12,
            "d_model": 768,
            "n_heads": 12,
            "vocab_size": 32000,
        },
        "workload": {"seq_len": 1024, "global_batch": 32, "steps": STEPS, "precision": "bf16-mixed"},
        "resources": {"min_devices": 1, "max_devices": 1},
    }
    if objective:
        doc["objective"] = objective
    return doc


def a100(name: str, market: str, price: float) -> Pool:
    return Pool(
        name=name,
        accelerator="a100-40gb",
        devices_per_node=1,
        nodes=2,
        market=market,  # type: ignore[arg-type]
        price_usd_per_device_hour=price,
        region="test-1",
        interruption_rate_per_hour=0.0,  # no simulated reclaims: the tests decide every preemption
        notice_s=45.0,
    )


class Env:
    def __init__(self, home: Path) -> None:
        self.clock = ManualClock()
        self.ex = FakeExecutor()
        self.p = Platform.open(
            Settings(home=home, database_url=f"sqlite:///{home / 'trainyard.db'}"),
            PlatformOptions(
                executor=self.ex,
                schedule_round=OptimizerRound(),
                register_local_pool=False,
                with_catalog=False,
                clock=self.clock,
            ),
        )
        sup = self.p.supervisor
        assert isinstance(sup, ReplanningSupervisor)
        self.sup = sup
        self.principal = Principal(
            tenant_id=self._default_tenant_id(), tenant_name="default", key_id="test", admin=True
        )

    def _default_tenant_id(self) -> str:
        from trainyard.store.repositories import TenantRepo

        with self.p.db.session() as s:
            t = TenantRepo(s).by_name("default")
        assert t is not None
        return t.id

    def submit(self, doc: dict[str, Any]) -> str:
        job, _ = self.p.jobs.submit(self.principal, spec_from_dict(doc))
        return str(job.id)

    def job(self, job_id: str) -> Any:
        return self.p.jobs.get(self.principal, job_id)

    def events(self, job_id: str, kind: str) -> list[dict[str, Any]]:
        return [e.data for e in self.p.jobs.events(self.principal, job_id) if e.kind == kind]

    def advance(self, seconds: float) -> None:
        self.clock.now += seconds
        self.ex.clock = self.clock.now

    def run(self, job_id: str, step: int, seconds: float) -> None:
        """Time passes while the job runs; it reports its step and a committed checkpoint."""
        self.advance(seconds)
        self.ex.emit(job_id, "heartbeat", {"rank": 0, "step": step}, time_s=self.clock.now)
        self.ex.emit(
            job_id, "checkpoint", {"step": step, "path": f"file:///ck/{step}"}, time_s=self.clock.now
        )
        self.p.tick()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    e.sup.replanner = Replanner(debounce_s=5.0, max_delay_s=30.0, period_s=300.0)
    yield e
    e.p.close()


def test_price_jump_migrates_running_spot_job_once_and_it_does_not_flap(env: Env) -> None:
    env.p.pools.put(a100("spot-a", "spot", 1.0))
    env.p.pools.put(a100("spot-b", "spot", 1.5))
    jid = env.submit(spec("mover"))
    env.p.tick()
    job = env.job(jid)
    assert job.state == JobState.STARTING and job.placement.pool == "spot-a", job.reason
    env.ex.emit(jid, "started", {"rank": 0, "pid": 1, "host": "h"}, time_s=env.clock.now)
    env.run(jid, 2_000, 600)
    # one hour in: still on the cheap pool; the small wiggle of spot-b below changes nothing
    env.p.pools.update("spot-b", {"price_usd_per_device_hour": 1.45})
    for _ in range(6):
        env.run(jid, 4_000, 600)
    assert env.ex.preempted == [] and env.events(jid, "migration") == []

    env.p.pools.update("spot-a", {"price_usd_per_device_hour": 5.0})  # the spot price jumps
    env.p.tick()
    assert env.ex.preempted == []  # debounced: the round waits for the burst to settle
    env.advance(6)
    env.p.tick()
    assert env.ex.preempted == [(jid, 45.0)]
    (mig,) = env.events(jid, "migration")
    assert mig["from_pool"] == "spot-a" and mig["to_pool"] == "spot-b"
    assert mig["savings_usd"] > mig["cost_usd"] > 0
    assert mig["reason"] == (
        f"migrating to spot-b: saves ${mig['savings_usd']:,.2f} > cost ${mig['cost_usd']:,.2f}"
    ) or mig["reason"].startswith("migrating to spot-b: saves $")
    assert env.job(jid).reason.startswith("migrating to spot-b")
    for _ in range(3):  # waiting for the emergency checkpoint does not ask twice
        env.advance(10)
        env.p.tick()
    assert len(env.ex.preempted) == 1

    # the worker checkpoints and exits; the job resumes on the new pool at the next round
    env.ex.emit(jid, "checkpoint", {"step": 4_100, "path": "file:///ck/4100"}, time_s=env.clock.now)
    env.ex.emit(jid, "preempted", {"step": 4_100}, time_s=env.clock.now)
    env.p.tick()  # the job is back in the queue with its checkpoint
    assert env.job(jid).state == JobState.QUEUED
    env.p.tick()
    job = env.job(jid)
    assert job.state == JobState.STARTING and job.attempt == 2, job.reason
    assert job.placement.pool == "spot-b"
    assert env.ex.launches[-1].pool == "spot-b"
    assert env.events(jid, "checkpoint_conversion") == []  # same accelerator, same devices

    # the old pool gets a little cheaper than the new one again: not worth moving back (hysteresis)
    env.ex.emit(jid, "started", {"rank": 0, "pid": 2, "host": "h"}, time_s=env.clock.now)
    env.p.pools.update("spot-a", {"price_usd_per_device_hour": 1.4})
    for i in range(8):
        env.run(jid, 4_200 + 200 * i, 600)
    assert len(env.ex.preempted) == 1 and len(env.events(jid, "migration")) == 1
    assert env.job(jid).placement.pool == "spot-b"


def test_spot_job_behind_its_deadline_moves_to_on_demand(env: Env) -> None:
    env.p.pools.put(a100("spot-a", "spot", 1.0))
    env.p.pools.put(a100("od", "on_demand", 3.0))
    jid = env.submit(spec("late", deadline="30h"))
    env.p.tick()
    job = env.job(jid)
    assert job.placement.pool == "spot-a" and job.placement.market == "spot", job.reason
    env.ex.emit(jid, "started", {"rank": 0, "pid": 1, "host": "h"}, time_s=env.clock.now)
    env.run(jid, 10_000, 1800)  # on track: 5 % done after 1/60 of the window
    assert env.ex.preempted == []
    # repeated reclaims and slow nodes: 10 hours later only 10 % is done (a third of the window spent)
    for h in range(10):
        env.run(jid, 12_000 + 800 * h, 3600)
        if env.ex.preempted:
            break
    assert env.ex.preempted and env.ex.preempted[0][0] == jid
    (mig,) = env.events(jid, "migration")
    assert mig["to_pool"] == "od" and mig["to_market"] == "on_demand"
    assert "deadline" in mig["reason"] and "progress" in mig["reason"]
    env.ex.emit(jid, "preempted", {}, time_s=env.clock.now)
    env.p.tick()
    env.p.tick()
    job = env.job(jid)
    assert job.attempt == 2 and job.placement.pool == "od" and job.placement.market == "on_demand"
