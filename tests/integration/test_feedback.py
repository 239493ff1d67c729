"""Step-time feedback in the running service: a finished CPU attempt's measured step times are stored,
folded into the predictor's calibration, and the next quote for the same spec on local-cpu predicts them;
a restarted control plane rebuilds the same calibration from the store. SQLite and PostgreSQL."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane_support import database_url, tiny_spec
from fakes import FakeExecutor
from trainyard.services.domain import Principal
from trainyard.services.lifecycle import JobState
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.services.quoting import quote_pools
from trainyard.services.scheduler_adapter import OptimizerRound
from trainyard.settings import Settings
from trainyard.spec.loader import spec_from_dict
from trainyard.store.repositories import StepTimeRepo, TenantRepo

MEASURED_S = 0.004  # what a tiny CPU model's optimizer step takes with framework overhead (4 ms)


def one_core(name: str, steps: int = 20) -> dict[str, object]:
    return {**tiny_spec(name, steps=steps), "resources": {"max_devices": 1}}


def open_platform(url: str, home: Path, ex: FakeExecutor) -> Platform:
    return Platform.open(
        Settings(home=home, database_url=url),
        PlatformOptions(executor=ex, cpu_count=2, with_catalog=False, schedule_round=OptimizerRound()),
    )


def principal(p: Platform) -> Principal:
    with p.db.session() as s:
        t = TenantRepo(s).by_name("default")
    assert t is not None
    return Principal(tenant_id=t.id, tenant_name="default", key_id="test", admin=True)


def local_step_time_s(p: Platform, name: str) -> float:
    assert p.options.quoter is not None
    spec = spec_from_dict(one_core(name))
    options = p.options.quoter(spec, quote_pools(p.pools.pools(), with_catalog=False))
    (one,) = [o for o in options if o.pool == "local-cpu" and o.devices == 1 and o.feasible]
    return float(one.step_time_s)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    with database_url(request.param, tmp_path) as url:
        yield url, tmp_path


def test_finished_cpu_attempt_teaches_the_quoter_its_step_time(db: tuple[str, Path]) -> None:
    url, home = db
    ex = FakeExecutor()
    p = open_platform(url, home, ex)
    try:
        who = principal(p)
        p.pools.update("local-cpu", {"price_usd_per_device_hour": 3.6})  # so expected costs show time
        before = local_step_time_s(p, "probe")
        assert abs(before / MEASURED_S - 1) > 0.3  # the analytic model alone is far off here

        job, _ = p.jobs.submit(who, spec_from_dict(one_core("learn", steps=220)))
        p.tick()
        placed = p.jobs.get(who, job.id)
        assert placed.state == JobState.STARTING and placed.placement.pool == "local-cpu"
        assert placed.placement.devices == 1, placed.placement
        rng = random.Random(7)
        ex.emit(job.id, "started", {"rank": 0, "pid": 1, "host": "h", "device": {"accelerator": "cpu"}})
        for step in range(1, 221):
            if step <= 3:
                t = MEASURED_S * 20  # warm-up: first steps compile and allocate
            elif step == 100:
                t = MEASURED_S * 15  # a synchronous checkpoint stalled this one
            else:
                t = MEASURED_S * rng.uniform(0.97, 1.03)
            ex.emit(job.id, "heartbeat", {"rank": 0, "step": step, "step_time_s": t, "loss": 2.0})
            ex.emit(job.id, "heartbeat", {"rank": 1, "step": step, "step_time_s": 1.0})  # other ranks ignored
        ex.emit(job.id, "succeeded", {"model_path": "/m", "model_sha256": "ab" * 32, "final_step": 220})
        p.tick()  # events applied: the attempt's steady-state step times are stored
        assert p.jobs.get(who, job.id).state == JobState.SUCCEEDED
        with p.db.session() as s:
            (row,) = StepTimeRepo(s).list()
        assert row["accelerator"] == "cpu" and row["devices"] == 1 and row["pool"] == "local-cpu"
        assert row["samples"] == 220 - 11 - 1  # warm-up (5 %) and the stall dropped
        assert row["median_step_time_s"] == pytest.approx(MEASURED_S, rel=0.02)

        p.tick()  # the next loop pass folds it into the calibration
        after = local_step_time_s(p, "probe")
        assert after == pytest.approx(MEASURED_S, rel=0.03)
        assert [c["key"].endswith("/cpu") for c in p.feedback.summary()] == [True]

        # a quote stored at submission uses it, and so does the optimiser's round that places the job
        job2, _ = p.jobs.submit(who, spec_from_dict(one_core("after", steps=200_000)))
        p.tick()
        job2 = p.jobs.get(who, job2.id)
        local = [o for o in job2.quote if o.get("pool") == "local-cpu" and o.get("devices") == 1]
        assert local and local[0]["step_time_s"] == pytest.approx(MEASURED_S, rel=0.03)
        assert job2.placement is not None and job2.placement.devices == 1
        assert job2.placement.expected_cost_usd == pytest.approx(local[0]["expected_cost_usd"], rel=0.02)
        hours_measured = 200_000 * MEASURED_S / 3600
        assert job2.placement.expected_cost_usd == pytest.approx(3.6 * hours_measured, rel=0.1)
    finally:
        p.close()

    # a restarted control plane rebuilds the calibration from the store
    p2 = open_platform(url, home, FakeExecutor())
    try:
        assert local_step_time_s(p2, "probe") == pytest.approx(after, rel=1e-6)
    finally:
        p2.close()
