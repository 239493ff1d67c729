"""The optimiser behind the ScheduleRound protocol and the re-planning supervisor, on a real SQLite file
with the scripted executor and a clock the test moves (no server). The round is checked on what it hands
the scheduler (queued and running jobs, quotas, groups, progress) and how it turns the scheduler's answer
into placements, migrations and reasons; the supervisor on the events it gives the Replanner, the
migrations it starts and records, the moved jobs it resumes, the checkpoint conversions it records and
what it hands the step-time feedback."""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from service_support import Logged, add_job, job_services, sqlite_template
from sqlalchemy import text

from fakes import FakeExecutor
from trainyard.catalog.pools import Pool
from trainyard.cost.quote import option_for, pool_accelerator
from trainyard.errors import TrainyardError
from trainyard.executors.base import ExecutorEvent
from trainyard.predict import default_calibration, predict
from trainyard.predict.fit import ingest_measurement
from trainyard.schedule import (
    CandidateCache,
    EventKind,
    JobGroup,
    Replanner,
    SchedulerConfig,
    SchedulerEvent,
    TenantQuota,
)
from trainyard.schedule import Placement as SPlacement
from trainyard.schedule import RoundResult as SRoundResult
from trainyard.schedule import Unplaced as SUnplaced
from trainyard.services import scheduler_adapter as adapter
from trainyard.services.domain import Job, Placement
from trainyard.services.execution import DEFAULT_NOTICE_S
from trainyard.services.lifecycle import JobState
from trainyard.services.scheduler_adapter import (
    OptimizerRound,
    ReplanningSupervisor,
    _fmt_usd,
    _remaining_usd,
    calibrated_predictions,
    job_group,
    progress_fraction,
    total_steps,
)
from trainyard.services.scheduling import GreedyCheapestRound, Migration, QueuedJobView, RunningJobView
from trainyard.spec.loader import spec_from_dict
from trainyard.store.repositories import EventRepo, JobRepo, insert_jobs

NOW = 1_800_000_000.0
STEPS = 200_000


def doc(name: str = "j", **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
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
    d.update(over)
    return d


BAD = {**doc("bad"), "workload": {"steps": -3}}


def bad_message() -> str:
    try:
        spec_from_dict(BAD)
    except TrainyardError as exc:
        return exc.message
    raise AssertionError("the bad document validates")


def a100(
    name: str, price: float | None = 1.0, *, nodes: int = 2, notice_s: float | None = 45.0, **kw: Any
) -> Pool:
    return Pool(
        name=name,
        accelerator=kw.pop("accelerator", "a100-40gb"),
        devices_per_node=1,
        nodes=nodes,
        market=kw.pop("market", "on_demand"),
        price_usd_per_device_hour=price,
        region="test-1",
        interruption_rate_per_hour=0.0,
        notice_s=notice_s,
        **kw,
    )


def qview(job_id: str, tenant: str = "t1", spec: dict[str, Any] | None = None, **kw: Any) -> QueuedJobView:
    return QueuedJobView(
        job_id=job_id, tenant_id=tenant, spec=spec or doc(job_id), submitted_at_s=kw.pop("at", 100.0), **kw
    )


def rview(job_id: str, pool: str = "a", spec: dict[str, Any] | None = None, **kw: Any) -> RunningJobView:
    return RunningJobView(
        job_id=job_id,
        tenant_id=kw.pop("tenant", "t1"),
        spec=spec or doc(job_id),
        submitted_at_s=kw.pop("at", 50.0),
        pool=pool,
        devices=kw.pop("devices", 1),
        market=kw.pop("market", "spot"),
        placed_s=kw.pop("placed", 60.0),
        **kw,
    )


def splacement(job_id: str, pool: str = "a", **kw: Any) -> SPlacement:
    return SPlacement(
        job_id=job_id,
        tenant=kw.pop("tenant", "t1"),
        pool=pool,
        accelerator=kw.pop("accelerator", "a100-40gb"),
        devices=kw.pop("devices", 1),
        nodes=1,
        market=kw.pop("market", "on_demand"),
        expected_cost_usd=kw.pop("cost", 12.5),
        expected_hours=3.0,
        checkpoint_interval_s=kw.pop("interval", 600.0),
        reason=kw.pop("reason", "cheapest"),
        **kw,
    )


def sresult(placements: tuple[SPlacement, ...] = (), unplaced: tuple[SUnplaced, ...] = ()) -> SRoundResult:
    return SRoundResult(
        placements=placements,
        unplaced=unplaced,
        kept=(),
        solve_time_s=0.0,
        objective_usd=0.0,
        solver_status="optimal",
        greedy_objective_usd=0.0,
    )


class StubRound:
    """Stands in for ``schedule_round``: records each call and answers what the test set."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.answer = sresult()

    def __call__(
        self, queued: Any, pools: Any, running: Any, now_s: float, cfg: Any, *, cache: Any, groups: Any
    ) -> Any:
        self.calls.append(
            {
                "queued": queued,
                "pools": pools,
                "running": running,
                "now": now_s,
                "cfg": cfg,
                "cache": cache,
                "groups": groups,
            }
        )
        return self.answer


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> Logged:
    out = Logged()
    monkeypatch.setattr(adapter, "log", out)
    return out


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> StubRound:
    s = StubRound()
    monkeypatch.setattr(adapter, "schedule_round", s)
    return s


# ---- pure helpers ------------------------------------------------------------------------------------
def test_dollars_are_written_to_the_cent_from_99_5_cents_and_to_four_places_below() -> None:
    assert _fmt_usd(1234.5) == "$1,234.50"
    assert _fmt_usd(0.996) == "$1.00"
    assert _fmt_usd(0.995) == "$0.99"  # the cent form from 0.995 on (the float just below 0.995 rounds down)
    assert _fmt_usd(0.9949) == "$0.9949"
    assert _fmt_usd(0.01234) == "$0.0123"
    assert _fmt_usd(-2.0) == "$-2.00"
    assert _fmt_usd(-0.5) == "$-0.5000"
    assert _fmt_usd(0.0) == "$0.0000"


def test_total_steps_reads_the_spec_and_is_none_for_one_that_does_not_validate() -> None:
    assert total_steps(doc()) == STEPS
    assert total_steps(BAD) is None
    assert total_steps({"workload": "x"}) is None


def test_progress_is_the_share_of_steps_done_kept_below_one() -> None:
    assert progress_fraction(50, 200) == 0.25
    assert progress_fraction(50.0, 200) == 0.25
    assert progress_fraction(200, 200) == 0.999
    assert progress_fraction(900, 200) == 0.999
    assert progress_fraction(-10, 200) == 0.0
    assert progress_fraction(50, None) == 0.0
    assert progress_fraction(50, 0) == 0.0
    assert progress_fraction(None, 200) == 0.0
    assert progress_fraction("50", 200) == 0.0
    assert progress_fraction(True, 2) == 0.0


def test_a_sweeps_trial_is_scheduled_with_its_sweep_of_its_own_tenant() -> None:
    assert job_group("t1", {"tags": {"sweep_id": "sw-1"}}) == "t1/sw-1"
    assert job_group("t2", {"tags": {"sweep_id": 7}}) == "t2/7"
    assert job_group("t1", {"tags": {"sweep_id": ""}}) is None
    assert job_group("t1", {"tags": {"other": "x"}}) is None
    assert job_group("t1", {"tags": ["sweep_id"]}) is None
    assert job_group("t1", {"tags": None}) is None
    assert job_group("t1", {}) is None


def test_the_remaining_cost_is_the_quote_for_the_share_left_kept_below_the_whole() -> None:
    s = spec_from_dict(doc())
    p = a100("a", 2.0)

    def want(done: float) -> float:
        return option_for(s, p, 1, elapsed_fraction=done, deadline_s=math.inf).expected_cost_usd

    assert _remaining_usd(s, p, 1, 0.25) == pytest.approx(want(0.25))
    assert _remaining_usd(s, p, 1, 0.25) < _remaining_usd(s, p, 1, 0.0)
    assert _remaining_usd(s, p, 1, 1.5) == want(0.999)
    assert _remaining_usd(s, p, 1, -1.0) == want(0.0)
    assert _remaining_usd(s, a100("b", 4.0), 1, 0.25) == pytest.approx(2 * want(0.25), rel=0.01)


def test_the_feedback_hook_falls_back_when_the_calibrated_predictor_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = spec_from_dict(doc())
    h = pool_accelerator(a100("a"))
    cal = ingest_measurement(default_calibration(), s, h, 1, 4 * predict(s, h, 1).step_time_s)
    hook = calibrated_predictions(cal)
    assert hook is not None
    assert hook(s, h, 1, {}).step_time_s == pytest.approx(predict(s, h, 1, calibration=cal).step_time_s)
    assert hook(s, h, 1, {}).step_time_s > 1.5 * predict(s, h, 1).step_time_s

    def refuse(*a: Any, **k: Any) -> Any:
        raise ValueError("no")

    monkeypatch.setattr("trainyard.predict.predict", refuse)
    hook = calibrated_predictions(cal)
    assert hook is not None and hook(s, h, 1, {}) is None


def test_the_feedback_hook_predicts_on_the_pools_topology() -> None:
    s = spec_from_dict(doc(resources={"min_devices": 1, "max_devices": 4}))
    h = pool_accelerator(a100("a"))
    cal = ingest_measurement(default_calibration(), s, h, 1, 4 * predict(s, h, 1).step_time_s)
    hook = calibrated_predictions(cal)
    assert hook is not None
    slow = {"devices_per_node": 1, "inter_node_gbps": 1.0}  # two devices on two nodes, a slow network
    got = hook(s, h, 2, slow).step_time_s
    assert got == pytest.approx(predict(s, h, 2, calibration=cal, **slow).step_time_s)
    assert got > 5 * predict(s, h, 2, calibration=cal).step_time_s  # the catalog's topology: one node


# ---- the round ---------------------------------------------------------------------------------------
def test_the_round_hands_the_scheduler_each_valid_queued_job_with_its_progress_and_group(
    stub: StubRound,
) -> None:
    rnd = OptimizerRound()
    views = [
        qview("q1", at=10.0, progress_fraction=0.3),
        qview("bad", spec=BAD),
        qview("q2", tenant="t2", spec=doc("q2", tags={"sweep_id": "sw"}), at=20.0, progress_fraction=0.3),
        qview("q3", progress_fraction=0.5),
        qview("q4", progress_fraction=-0.2),
    ]
    pools = [a100("a")]
    out = rnd(views, pools, 500.0, progress={"q2": 1.7, "q3": 0.6})
    (call,) = stub.calls
    got = {q.job_id: q for q in call["queued"]}
    assert list(got) == ["q1", "q2", "q3", "q4"]
    assert (
        got["q1"].tenant == "t1"
        and got["q1"].submit_s == 10.0
        and got["q1"].spec == spec_from_dict(doc("q1"))
    )
    assert got["q1"].progress_fraction == 0.3 and got["q1"].group is None
    assert got["q2"].tenant == "t2" and got["q2"].submit_s == 20.0 and got["q2"].group == "t2/sw"
    assert got["q2"].progress_fraction == 0.999  # the override, kept below the whole
    assert got["q3"].progress_fraction == 0.6
    assert got["q4"].progress_fraction == 0.0
    assert call["pools"] == pools and call["running"] == [] and call["now"] == 500.0
    assert call["cache"] is rnd.cache and call["groups"] == {}
    assert call["cfg"] is rnd.config  # no tenant quota: the configuration as it is
    assert out.unplaced == {"bad": f"stored spec no longer validates: {bad_message()}"}
    assert out.placements == {} and out.migrations == {}


def test_a_device_quota_leaves_what_the_tenants_running_jobs_hold_unless_the_round_sees_them(
    stub: StubRound,
) -> None:
    rnd = OptimizerRound(
        SchedulerConfig(quotas={"t9": TenantQuota(max_devices=2), "t1": TenantQuota(max_devices=99)})
    )
    views = [
        qview("q1", tenant_max_active_devices=4, tenant_devices_in_use=1),
        qview("q2", tenant="t2", tenant_max_active_devices=2, tenant_devices_in_use=5),
        qview("q3", tenant="t3"),
    ]
    rnd(views, [a100("a")], 1.0)
    assert dict(stub.calls[0]["cfg"].quotas) == {
        "t9": TenantQuota(max_devices=2),
        "t1": TenantQuota(max_devices=3),
        "t2": TenantQuota(max_devices=0),
    }
    assert rnd.config.quotas["t1"] == TenantQuota(max_devices=99)  # the round's own configuration is kept
    rnd(views, [a100("a")], 1.0, running=[rview("r1", tenant="t3")])
    assert dict(stub.calls[1]["cfg"].quotas) == {
        "t9": TenantQuota(max_devices=2),
        "t1": TenantQuota(max_devices=4),
        "t2": TenantQuota(max_devices=2),
    }


def test_the_groups_are_asked_for_the_names_the_queue_uses_once_each(stub: StubRound) -> None:
    rnd = OptimizerRound()
    asked: list[list[str]] = []
    limits = {"t1/b": JobGroup(max_starts=1)}

    def groups(names: Any) -> Any:
        asked.append(list(names))
        return limits

    rnd.groups = groups
    rnd([qview("q1")], [a100("a")], 1.0)
    assert asked == [] and stub.calls[0]["groups"] == {}
    views = [
        qview("q1", spec=doc("q1", tags={"sweep_id": "b"})),
        qview("q2", spec=doc("q2", tags={"sweep_id": "a"})),
        qview("q3", spec=doc("q3", tags={"sweep_id": "b"})),
        qview("q4"),
    ]
    rnd(views, [a100("a")], 1.0)
    assert asked == [["t1/a", "t1/b"]]
    assert stub.calls[1]["groups"] == limits and stub.calls[1]["groups"] is not limits
    rnd.groups = None
    rnd(views, [a100("a")], 1.0)
    assert stub.calls[2]["groups"] == {}


def test_the_scheduler_is_not_asked_when_nothing_is_queued_or_running(stub: StubRound) -> None:
    out = OptimizerRound()([qview("bad", spec=BAD)], [a100("a")], 1.0)
    assert stub.calls == []
    assert out.placements == {} and out.migrations == {}
    assert out.unplaced == {"bad": f"stored spec no longer validates: {bad_message()}"}
    OptimizerRound()([], [a100("a")], 1.0, running=[rview("r1", spec=BAD)])
    assert stub.calls == []


def test_running_jobs_go_to_the_scheduler_with_their_allocation_and_progress(stub: StubRound) -> None:
    running = [
        rview("r1", pool="a", devices=2, market="spot", placed=70.0, at=40.0, progress_fraction=0.4),
        rview("bad", spec=BAD),
        rview("r2", tenant="t2", spec=doc("r2", tags={"sweep_id": "s"}), progress_fraction=3.0),
        rview("r3", progress_fraction=-1.0),
    ]
    OptimizerRound()([], [a100("a")], 9.0, running=running)
    got = {r.job_id: r for r in stub.calls[0]["running"]}
    assert list(got) == ["r1", "r2", "r3"]
    r1 = got["r1"]
    assert (r1.tenant, r1.pool, r1.devices, r1.market, r1.placed_s, r1.submit_s) == (
        "t1",
        "a",
        2,
        "spot",
        70.0,
        40.0,
    )
    assert r1.spec == spec_from_dict(doc("r1")) and r1.progress_fraction == 0.4 and r1.group is None
    assert got["r2"].tenant == "t2" and got["r2"].group == "t2/s" and got["r2"].progress_fraction == 0.999
    assert got["r3"].progress_fraction == 0.0
    assert stub.calls[0]["queued"] == []


def test_placements_carry_the_pools_price_and_the_schedulers_choice(stub: StubRound) -> None:
    stub.answer = sresult(
        (
            splacement(
                "q1", "a", devices=2, market="spot", cost=7.25, interval=300.0, reason="cheapest spot"
            ),
            splacement("q2", "free", accelerator="a100-40gb"),
        ),
        (SUnplaced("q3", "t1", "waiting for capacity"),),
    )
    pools = [a100("a", 1.5, market="spot"), a100("free", None)]
    out = OptimizerRound()([qview("q1"), qview("q2"), qview("q3")], pools, 1.0)
    assert out.placements == {
        "q1": Placement(
            pool="a",
            devices=2,
            market="spot",
            accelerator="a100-40gb",
            price_usd_per_device_hour=1.5,
            expected_cost_usd=7.25,
            checkpoint_interval_s=300.0,
            reason="cheapest spot",
        ),
        "q2": Placement(
            pool="free",
            devices=1,
            market="on_demand",
            accelerator="a100-40gb",
            price_usd_per_device_hour=0.0,
            expected_cost_usd=12.5,
            checkpoint_interval_s=600.0,
            reason="cheapest",
        ),
    }
    assert out.unplaced == {"q3": "waiting for capacity"} and out.migrations == {}


def migration_round(
    stub: StubRound, cost: float, reason: str = "behind its deadline"
) -> tuple[Any, Migration]:
    stub.answer = sresult((splacement("r1", "b", cost=cost, migration=True, from_pool="a", reason=reason),))
    cur, tgt = a100("a", 5.0, market="spot"), a100("b", 1.5)
    out = OptimizerRound()([], [cur, tgt], 1.0, running=[rview("r1", pool="a", progress_fraction=0.25)])
    assert out.placements == {}
    return out, out.migrations["r1"]


def test_a_migration_says_what_it_saves_against_what_the_move_costs(stub: StubRound) -> None:
    s = spec_from_dict(doc("r1"))
    stay = _remaining_usd(s, a100("a", 5.0, market="spot"), 1, 0.25)
    there = _remaining_usd(s, a100("b", 1.5), 1, 0.25)
    _, mig = migration_round(stub, cost=there + 3.0)
    assert mig.job_id == "r1" and mig.from_pool == "a"
    assert mig.placement == Placement(
        pool="b",
        devices=1,
        market="on_demand",
        accelerator="a100-40gb",
        price_usd_per_device_hour=1.5,
        expected_cost_usd=there + 3.0,
        checkpoint_interval_s=600.0,
        reason="behind its deadline",
    )
    assert mig.savings_usd == pytest.approx(stay - there) and mig.savings_usd > 10
    assert mig.cost_usd == pytest.approx(3.0)
    assert mig.reason == f"migrating to b: saves ${stay - there:,.2f} > cost $3.00"
    # a move that costs more than it saves (the scheduler's own reason: a deadline) says the scheduler's words
    _, mig = migration_round(stub, cost=there + 2 * (stay - there))
    assert mig.cost_usd == pytest.approx(2 * (stay - there))
    assert mig.reason == "migrating to b: behind its deadline"
    # the scheduler's total below the remaining work there costs nothing to move
    _, mig = migration_round(stub, cost=there - 1.0)
    assert mig.cost_usd == 0.0 and mig.reason.startswith("migrating to b: saves $")
    # no total from the scheduler: the remaining work there, a move of no cost
    _, mig = migration_round(stub, cost=0.0)
    assert mig.cost_usd == 0.0 and mig.reason == f"migrating to b: saves ${stay - there:,.2f} > cost $0.0000"


def test_a_move_costing_exactly_its_savings_gives_the_schedulers_reason(
    stub: StubRound, monkeypatch: pytest.MonkeyPatch
) -> None:
    remaining = {"a": 10.0, "b": 4.0}
    monkeypatch.setattr(adapter, "_remaining_usd", lambda spec, pool, devices, progress: remaining[pool.name])
    _, mig = migration_round(stub, cost=10.0)  # savings 6 == cost 6
    assert (mig.savings_usd, mig.cost_usd) == (6.0, 6.0)
    assert mig.reason == "migrating to b: behind its deadline"
    _, mig = migration_round(stub, cost=9.99)
    assert mig.reason == "migrating to b: saves $6.00 > cost $5.99"


def test_the_remaining_cost_is_priced_on_each_allocation_at_the_jobs_progress(
    stub: StubRound, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[tuple[str, str, int, float]] = []

    def remaining(spec: Any, pool: Pool, devices: int, progress: float) -> float:
        asked.append((spec.name, pool.name, devices, progress))
        return {"a": 10.0, "b": 4.0}[pool.name]

    monkeypatch.setattr(adapter, "_remaining_usd", remaining)
    stub.answer = sresult((splacement("r1", "b", devices=2, cost=5.0, migration=True, from_pool="a"),))
    OptimizerRound()(
        [], [a100("a"), a100("b")], 1.0, running=[rview("r1", pool="a", devices=1, progress_fraction=0.25)]
    )
    assert asked == [("r1", "a", 1, 0.25), ("r1", "b", 2, 0.25)]


def test_a_migration_of_a_job_or_from_a_pool_the_round_does_not_know_is_dropped(stub: StubRound) -> None:
    stub.answer = sresult(
        (
            splacement("gone", "b", migration=True, from_pool="a"),
            splacement("r1", "b", migration=True, from_pool="nowhere"),
            splacement("r2", "b", migration=True, from_pool=None),
            splacement("r3", "b", migration=True, from_pool="a"),
        )
    )
    running = [rview("r1"), rview("r2"), rview("r3")]
    out = OptimizerRound()([], [a100("a", 5.0), a100("b", 1.0)], 1.0, running=running)
    assert list(out.migrations) == ["r3"] and out.placements == {}


def test_a_new_calibration_version_prices_on_a_new_memo_with_its_hook() -> None:
    s = spec_from_dict(doc())
    h = pool_accelerator(a100("a"))
    cal = ingest_measurement(default_calibration(), s, h, 1, 4 * predict(s, h, 1).step_time_s)
    rnd = OptimizerRound()
    first = rnd.cache
    assert first.calibrated is None and rnd.calibration is None
    rnd.set_calibration(cal, 0)
    assert rnd.calibration is cal and rnd.cache is not first and rnd.cache.calibrated is not None
    hooked = rnd.cache
    rnd.set_calibration(default_calibration(), 0)  # the same version: nothing changes
    assert rnd.calibration is cal and rnd.cache is hooked
    rnd.set_calibration(None, 1)
    assert rnd.calibration is None and rnd.cache is not hooked and rnd.cache.calibrated is None
    assert isinstance(rnd.cache, CandidateCache)


# ---- the supervisor ----------------------------------------------------------------------------------
@dataclass
class Recorder(Replanner):
    """The Replanner, recording what it is told; ``force`` answers ``due`` when set."""

    seen: list[SchedulerEvent] = field(default_factory=list)
    rounds: list[float] = field(default_factory=list)
    force: bool | None = None

    def observe(self, event: SchedulerEvent) -> bool:
        self.seen.append(event)
        return super().observe(event)

    def due(self, now_s: float) -> bool:
        return super().due(now_s) if self.force is None else self.force

    def planned(self, now_s: float) -> list[SchedulerEvent]:
        self.rounds.append(now_s)
        return super().planned(now_s)

    def take(self) -> list[tuple[Any, ...]]:
        out = [
            (e.kind, e.job_id, e.pool, e.old_price_usd_per_hour, e.new_price_usd_per_hour, e.urgent)
            for e in self.seen
        ]
        self.seen = []
        return out


class FakeFeedback:
    def __init__(self) -> None:
        self.refreshed: Any = False
        self.calibration: Any = None
        self.version = 0
        self.calls: list[tuple[Any, ...]] = []

    def refresh(self) -> bool:
        if isinstance(self.refreshed, Exception):
            raise self.refreshed
        return bool(self.refreshed)

    def observe_started(self, job: Job, ev: ExecutorEvent) -> None:
        self.calls.append(("started", job.id, job.state, ev.kind))

    def observe_heartbeat(self, job: Job, ev: ExecutorEvent) -> None:
        self.calls.append(("heartbeat", job.id, job.state, ev.data.get("step")))

    def attempt_closed(self, s: Any, job: Job, ended_s: float) -> None:
        if job.id == "boom":
            raise RuntimeError("feedback store down")
        state = s.execute(text("SELECT state FROM jobs WHERE id = :id"), {"id": job.id}).scalar()
        self.calls.append(("closed", job.id, ended_s, state))  # in the transaction that closes the attempt


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sqlite_template(
        tmp_path_factory.mktemp("adapter") / "template.sqlite", [("t1", "acme"), ("t2", "beta")]
    )


class Env:
    def __init__(self, path: Path, runs: Path) -> None:
        self.db, self.clock, self.pools, self.jobs = job_services(path, NOW)
        self.ex = FakeExecutor()
        self.feedback = FakeFeedback()
        self.replanner = Recorder()
        self.sup = ReplanningSupervisor(
            self.db,
            self.jobs,
            self.pools,
            self.ex,
            runs_dir=runs,
            checkpoint_url="file:///ck",
            schedule_round=OptimizerRound(),
            clock=self.clock,
            feedback=self.feedback,
            replanner=self.replanner,
        )

    def add(
        self,
        job_id: str,
        state: JobState = JobState.QUEUED,
        spec: dict[str, Any] | None = None,
        **fields: Any,
    ) -> None:
        add_job(self.db, job_id, state, spec or doc(job_id), NOW, **fields)

    def set(self, job_id: str, **fields: Any) -> None:
        with self.db.session() as s:
            JobRepo(s).update(job_id, **fields)

    def job(self, job_id: str) -> Job:
        with self.db.session() as s:
            j = JobRepo(s).get(job_id)
        assert j is not None
        return j

    def events(self, job_id: str, kind: str) -> list[dict[str, Any]]:
        with self.db.session() as s:
            return [e.data for e in EventRepo(s).list(job_id) if e.kind == kind]


@pytest.fixture
def env(template: Path, tmp_path: Path) -> Iterator[Env]:
    path = tmp_path / "db.sqlite"
    shutil.copy(template, path)
    e = Env(path, tmp_path / "runs")
    yield e
    e.db.dispose()


def placed(
    pool: str = "a", devices: int = 1, accelerator: str = "a100-40gb", price: float = 1.0
) -> Placement:
    return Placement(
        pool=pool,
        devices=devices,
        market="on_demand",
        accelerator=accelerator,
        price_usd_per_device_hour=price,
    )


def test_the_replanner_hears_of_arrivals_completions_preemptions_and_pool_changes(
    env: Env, stub: StubRound
) -> None:
    env.pools.put(a100("a", 1.0))
    env.pools.put(a100("b", 2.0))
    env.pools.put(a100("d", 2.0))
    env.add("q1")
    env.add("q2", spec=doc("q2", objective={"deadline": "48h"}))
    env.add("r1", JobState.RUNNING, placement=placed("a"))
    env.add("r2", JobState.RUNNING, placement=placed("a"))
    env.sup.schedule_once()
    r = EventKind
    assert env.replanner.take() == [
        (r.ARRIVAL, "q1", None, None, None, False),
        (r.ARRIVAL, "q2", None, None, None, True),
    ]
    env.sup.schedule_once()  # nothing changed: nothing to tell
    assert env.replanner.take() == []

    env.pools.update("a", {"price_usd_per_device_hour": 3.0})
    env.pools.update("b", {"available_devices": 1})
    env.pools.put(a100("a2", 1.0))  # a new pool listed before others that changed
    env.pools.delete("d")
    env.set("r1", state=JobState.QUEUED.value)  # preempted and back in the queue
    env.set("r2", state=JobState.SUCCEEDED.value)
    env.add("q3")
    env.clock.now += 7
    env.sup.schedule_once()
    t = NOW + 7
    got = env.replanner.seen
    assert all(e.time_s == t for e in got)
    assert sorted(env.replanner.take(), key=str) == sorted(
        [
            (r.PRICE_CHANGE, None, "a", 1.0, 3.0, False),
            (r.CAPACITY_CHANGE, None, "b", None, None, False),
            (r.CAPACITY_CHANGE, None, "a2", None, None, False),
            (r.CAPACITY_CHANGE, None, "d", None, None, False),
            (r.PREEMPTION, "r1", None, None, None, False),
            (r.COMPLETION, "r2", None, None, None, False),
            (r.ARRIVAL, "q3", None, None, None, False),
        ],
        key=str,
    )  # a running job back in the queue is no arrival
    env.pools.update("a", {"price_usd_per_device_hour": 3.0, "available_devices": 1})
    env.sup.schedule_once()
    assert env.replanner.take() == [(r.CAPACITY_CHANGE, None, "a", None, None, False)]


def test_queued_work_is_placed_every_tick_and_running_work_only_in_a_due_round(
    env: Env, stub: StubRound
) -> None:
    env.pools.put(a100("a", 1.0))
    env.add("q1")
    env.add("q2", checkpoints=[{"step": 50_000}, {"step": None}, {"step": 100_000}])
    env.add("q3", checkpoints=[{"path": "p"}])  # a checkpoint without a step: nothing done
    env.add(
        "r1",
        JobState.RUNNING,
        placement=placed("a"),
        attempt_started_at_s=NOW - 50,
        progress={"step": 20_000},
    )
    env.add("r2", JobState.STARTING, placement=placed("a", 1))
    env.add("r3", JobState.RUNNING)  # no placement: holds nothing the round could move
    env.replanner.force = False
    assert env.sup.schedule_once() is not None
    (call,) = stub.calls
    assert [q.job_id for q in call["queued"]] == ["q1", "q2", "q3"]
    assert {q.job_id: q.progress_fraction for q in call["queued"]} == {"q1": 0.0, "q2": 0.5, "q3": 0.0}
    assert call["running"] == [] and env.replanner.rounds == [] and env.sup.last_replan is None
    assert env.sup.schedule_round is not None and isinstance(env.sup.schedule_round, OptimizerRound)

    env.replanner.force = True
    result = env.sup.schedule_once()
    running = {r.job_id: r for r in stub.calls[1]["running"]}
    assert sorted(running) == ["r1", "r2"]
    assert running["r1"].placed_s == NOW - 50 and running["r1"].progress_fraction == 0.1
    assert running["r2"].placed_s == NOW and running["r2"].progress_fraction == 0.0  # no attempt start: now
    assert (running["r1"].pool, running["r1"].devices, running["r1"].market) == ("a", 1, "on_demand")
    assert running["r1"].submit_s == NOW - 100 and running["r1"].tenant == "t1"
    assert env.replanner.rounds == [NOW] and env.sup.last_replan is result
    assert isinstance(env.sup.schedule_round, OptimizerRound)
    env.sup.schedule_once(limit=1)  # the oldest queued job only, for the round and the Replanner
    assert [q.job_id for q in stub.calls[2]["queued"]] == ["q1"]


def test_a_round_reads_the_oldest_500_queued_jobs_by_default(env: Env, stub: StubRound) -> None:
    env.pools.put(a100("a", 1.0))
    spec = doc("q")
    jobs = [
        Job(id=f"q{i:03d}", seq=0, tenant_id="t1", name=f"q{i:03d}", state=JobState.QUEUED, spec=spec,
            created_at_s=NOW - 100, updated_at_s=NOW - 100)
        for i in range(501)
    ]  # fmt: skip
    with env.db.engine.begin() as c:
        insert_jobs(c, [(j, ("submitted", {}, NOW - 100)) for j in jobs])
    env.replanner.force = False
    env.sup.schedule_once()
    assert [q.job_id for q in stub.calls[0]["queued"]] == [f"q{i:03d}" for i in range(500)]
    assert len(env.replanner.take()) == 500  # the arrivals of the jobs read, q500 not yet


def test_a_due_round_reads_the_newest_active_jobs_up_to_its_bound(
    env: Env, stub: StubRound, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(adapter, "MAX_ACTIVE_READ", 2)
    env.pools.put(a100("a", 1.0, nodes=4))
    for job_id in ("r1", "r2", "r3"):
        env.add(job_id, JobState.RUNNING, placement=placed("a"), attempt_started_at_s=NOW - 50)
    env.replanner.force = True
    env.sup.schedule_once()
    assert [r.job_id for r in stub.calls[0]["running"]] == ["r3", "r2"]


def test_the_replanner_hears_only_of_the_queued_jobs_a_round_reads(env: Env, stub: StubRound) -> None:
    env.pools.put(a100("a", 1.0))
    env.add("q1")
    env.add("q2", spec=doc("q2", objective={"deadline": "48h"}))
    env.replanner.force = False
    env.sup.schedule_once(limit=1)  # the oldest queued job only
    r = EventKind
    assert env.replanner.take() == [(r.ARRIVAL, "q1", None, None, None, False)]
    assert [q.job_id for q in stub.calls[0]["queued"]] == ["q1"]
    env.sup.schedule_once(limit=2)
    assert env.replanner.take() == [(r.ARRIVAL, "q2", None, None, None, True)]


def test_a_due_round_with_nothing_queued_still_replans_the_running_jobs(env: Env, stub: StubRound) -> None:
    env.pools.put(a100("a", 1.0, nodes=3))
    env.add("r1", JobState.RUNNING, placement=placed("a"), attempt_started_at_s=NOW - 50)
    env.replanner.force = False
    assert env.sup.schedule_once() is None and stub.calls == []
    env.replanner.force = True
    result = env.sup.schedule_once()
    (call,) = stub.calls
    assert call["queued"] == [] and [r.job_id for r in call["running"]] == ["r1"] and call["now"] == NOW
    assert [(p.name, p.free_devices) for p in call["pools"]] == [("a", 2)]  # the free capacity
    assert result is not None and env.sup.last_replan is result and env.replanner.rounds == [NOW]
    env.set("r1", state=JobState.SUCCEEDED.value)
    assert env.sup.schedule_once() is None  # nothing running, nothing queued
    assert env.replanner.rounds == [NOW, NOW] and env.sup.last_replan is None


def test_another_round_is_run_by_the_plain_supervisor(env: Env) -> None:
    env.sup.schedule_round = GreedyCheapestRound()
    env.pools.put(a100("a", 1.0, nodes=4))
    env.add("q1", quote=[{"pool": "a", "devices": 1, "feasible": True, "expected_cost_usd": 3.0}])
    env.replanner.force = True
    result = env.sup.schedule_once()
    assert result is not None and list(result.placements) == ["q1"]
    assert env.replanner.seen == [] and env.replanner.rounds == [] and env.sup.last_replan is None
    assert env.job("q1").state == JobState.STARTING
    env.add("q2", quote=[{"pool": "a", "devices": 1, "feasible": True}])
    env.add("q3", quote=[{"pool": "a", "devices": 1, "feasible": True}])
    result = env.sup.schedule_once(limit=1)  # the oldest queued job only
    assert result is not None and list(result.placements) == ["q2"] and env.job("q3").state == JobState.QUEUED


def test_each_round_prices_on_the_feedbacks_calibration(env: Env, stub: StubRound) -> None:
    rnd = env.sup.schedule_round
    assert isinstance(rnd, OptimizerRound)
    env.pools.put(a100("a", 1.0))
    env.add("q1")
    cal = default_calibration()
    env.feedback.calibration, env.feedback.version = cal, 3
    env.sup.schedule_once()
    assert rnd.calibration is cal and rnd._calibration_version == 3
    env.sup.feedback = None
    env.feedback.version = 4
    env.sup.schedule_once()
    assert rnd._calibration_version == 3


def run_migration(env: Env, stub: StubRound, *, notice: float | None = 45.0) -> Migration:
    env.pools.put(a100("a", 5.0, market="spot", notice_s=notice))
    env.pools.put(a100("b", 1.0))
    env.add(
        "r1",
        JobState.RUNNING,
        placement=placed("a", price=5.0),
        attempt=2,
        attempt_started_at_s=NOW - 50,
        progress={"step": 50_000},
    )
    there = _remaining_usd(spec_from_dict(doc("r1")), a100("b", 1.0), 1, 0.25)
    stub.answer = sresult(
        (splacement("r1", "b", cost=there + 1.23456789, migration=True, from_pool="a", reason="cheaper"),)
    )
    env.replanner.force = True
    result = env.sup.schedule_once()
    assert result is not None
    return result.migrations["r1"]


def test_a_migration_asks_for_a_checkpoint_with_the_pools_notice_and_records_why(
    env: Env, stub: StubRound, logged: Logged
) -> None:
    mig = run_migration(env, stub)
    assert logged.take() == [
        {"event": "migrating", "job_id": "r1", "reason": mig.reason, "log_level": "info"}
    ]
    assert env.ex.preempted == [("r1", 45.0)]
    assert env.sup.migrating == {"r1": mig}
    (ev,) = env.events("r1", "migration")
    assert ev == {
        "attempt": 2,
        "from_pool": "a",
        "to_pool": "b",
        "to_accelerator": "a100-40gb",
        "to_devices": 1,
        "to_market": "on_demand",
        "savings_usd": round(mig.savings_usd, 6),
        "cost_usd": round(mig.cost_usd, 6),
        "reason": mig.reason,
        "scheduler_reason": "cheaper",
    }
    assert mig.reason.startswith("migrating to b: saves $") and mig.reason.endswith("> cost $1.23")
    assert ev["cost_usd"] == pytest.approx(1.234568, abs=1e-9)  # to the micro-dollar
    assert env.job("r1").reason == mig.reason and env.job("r1").updated_at_s == NOW
    env.clock.now += 10
    env.sup.schedule_once()  # still waiting for the checkpoint: not asked twice
    assert env.ex.preempted == [("r1", 45.0)] and len(env.events("r1", "migration")) == 1


def test_a_migration_from_a_pool_without_a_notice_gets_the_default_one(env: Env, stub: StubRound) -> None:
    run_migration(env, stub, notice=None)
    assert env.ex.preempted == [("r1", DEFAULT_NOTICE_S)]


def test_a_migration_the_executor_cannot_deliver_is_forgotten_to_be_tried_again(
    env: Env, stub: StubRound, logged: Logged
) -> None:
    def fail(job_id: str, notice_s: float) -> None:
        raise RuntimeError("unreachable" + "!" * 600)

    env.ex.preempt = fail  # type: ignore[method-assign]
    run_migration(env, stub)
    assert env.sup.migrating == {} and len(env.events("r1", "migration")) == 1
    assert logged.take() == [
        {
            "event": "migration_preempt_failed",
            "job_id": "r1",
            "error": ("unreachable" + "!" * 600)[:500],
            "log_level": "warning",
        }
    ]
    env.ex.preempt = FakeExecutor.preempt.__get__(env.ex)  # type: ignore[method-assign]
    env.sup.schedule_once()
    assert env.ex.preempted == [("r1", 45.0)] and len(env.events("r1", "migration")) == 2


def test_one_migration_waiting_or_failing_does_not_hold_up_the_others(env: Env, logged: Logged) -> None:
    env.pools.put(a100("a", 5.0))
    env.pools.put(a100("b", 1.0))
    for jid in ("w", "f", "ok"):
        env.add(jid, JobState.RUNNING, placement=placed("a"))

    def move(jid: str) -> Migration:
        return Migration(
            job_id=jid, from_pool="a", placement=placed("b"), savings_usd=1.0, cost_usd=0.5, reason=jid
        )

    env.sup.migrating = {"w": move("w")}  # already asked to checkpoint
    real = env.ex.preempt

    def preempt(job_id: str, notice_s: float) -> None:
        if job_id == "f":
            raise RuntimeError("down")
        real(job_id, notice_s)

    env.ex.preempt = preempt  # type: ignore[method-assign]
    env.sup._migrate({"w": move("w"), "f": move("f"), "ok": move("ok")}, {})
    assert env.ex.preempted == [("ok", DEFAULT_NOTICE_S)]
    assert sorted(env.sup.migrating) == ["ok", "w"] and env.events("w", "migration") == []


@pytest.mark.parametrize(
    ("state", "pool"),
    [(JobState.STARTING, "a"), (JobState.QUEUED, "a"), (JobState.RUNNING, "b"), (JobState.RUNNING, None)],
)
def test_a_migration_of_a_job_that_moved_on_is_not_started(
    env: Env, stub: StubRound, state: JobState, pool: str | None
) -> None:
    env.pools.put(a100("a", 5.0))
    env.pools.put(a100("b", 1.0))
    env.add("r1", JobState.RUNNING, placement=placed("a"))
    mig = Migration(
        job_id="r1", from_pool="a", placement=placed("b"), savings_usd=1.0, cost_usd=0.5, reason="why"
    )
    env.set("r1", state=state.value, placement=placed(pool).to_dict() if pool else None)
    env.add("ok", JobState.RUNNING, placement=placed("a"))
    ok = Migration(
        job_id="ok", from_pool="a", placement=placed("b"), savings_usd=1.0, cost_usd=0.5, reason="ok"
    )
    env.sup._migrate({"nope": mig, "r1": mig, "ok": ok}, {})
    assert env.sup.migrating == {"ok": ok} and env.events("r1", "migration") == []
    assert env.ex.preempted == [("ok", DEFAULT_NOTICE_S)]  # the others do not stop the one that can move


def test_a_migration_reason_is_kept_to_2000_characters_in_the_job(env: Env) -> None:
    env.pools.put(a100("a", 5.0))
    env.add("r1", JobState.RUNNING, placement=placed("a"))
    mig = Migration(
        job_id="r1", from_pool="a", placement=placed("b"), savings_usd=1.0, cost_usd=0.5, reason="x" * 2500
    )
    env.sup._migrate({"r1": mig}, {})
    assert env.job("r1").reason == "x" * 2000 and env.events("r1", "migration")[0]["reason"] == "x" * 2500
    assert env.ex.preempted == [("r1", DEFAULT_NOTICE_S)]


def test_a_checkpointed_migration_resumes_on_its_target_when_it_has_room(env: Env, stub: StubRound) -> None:
    mig = run_migration(env, stub)
    stub.answer = sresult()
    env.set("r1", state=JobState.QUEUED.value, checkpoints=[{"step": 50_000, "path": "file:///ck/1"}])
    env.clock.now += 20
    env.sup.schedule_once()  # back in the queue: resumes on b
    assert env.sup.migrating == {} and env.sup.moved == {}
    job = env.job("r1")
    assert job.state == JobState.STARTING and job.attempt == 3
    assert job.placement == replace_reason(mig.placement, mig.reason)
    assert job.reason == "placed on b (1 devices)"
    (launch,) = env.ex.launches
    assert launch.pool == "b" and launch.attempt == 3


def replace_reason(p: Placement, reason: str) -> Placement:
    from dataclasses import replace

    return replace(p, reason=reason)


def test_a_moved_job_waits_for_the_next_round_when_its_target_is_full(env: Env, stub: StubRound) -> None:
    run_migration(env, stub)
    stub.answer = sresult()
    env.add("other", JobState.RUNNING, placement=placed("b", 2))
    env.set("r1", state=JobState.QUEUED.value)
    env.sup.schedule_once()
    assert env.job("r1").state == JobState.QUEUED and env.sup.moved == {} and env.ex.launches == []


def test_moved_jobs_share_the_room_left_on_their_target(env: Env) -> None:
    env.pools.put(a100("b", 1.0, nodes=3))
    env.add("m1")
    env.add("m2")
    env.add("m3")
    env.add("m4")
    env.add("busy", JobState.RUNNING, placement=placed("b"))
    moves = {
        jid: Migration(
            job_id=jid,
            from_pool="a",
            placement=placed("b", 1),
            savings_usd=1,
            cost_usd=0,
            reason=f"to b {jid}",
        )
        for jid in ("m1", "m2", "m3")
    }
    moves["m4"] = Migration(
        job_id="m4", from_pool="a", placement=placed("zz"), savings_usd=1, cost_usd=0, reason="x"
    )
    env.sup.moved = dict(moves)
    env.add("plain")
    env.sup._resume_moved([env.job("plain"), env.job("m1"), env.job("m2"), env.job("m3"), env.job("m4")])
    assert env.job("plain").state == JobState.QUEUED  # not moved: the round places it
    assert [env.job(j).state for j in ("m1", "m2", "m3", "m4")] == [
        JobState.STARTING,
        JobState.STARTING,
        JobState.QUEUED,
        JobState.QUEUED,
    ]
    assert env.sup.moved == {} and env.job("m2").placement == replace_reason(placed("b"), "to b m2")


def test_a_moved_job_is_forgotten_once_it_leaves_the_queue_or_finishes(env: Env, stub: StubRound) -> None:
    run_migration(env, stub)
    stub.answer = sresult()
    env.set("r1", state=JobState.SUCCEEDED.value)  # finished before its checkpoint
    env.sup.schedule_once()
    assert env.sup.migrating == {} and env.sup.moved == {}
    m = Migration(job_id="x", from_pool="a", placement=placed("b"), savings_usd=1, cost_usd=0, reason="r")
    env.sup.moved = {"x": m}
    env.sup.schedule_once()  # "x" is in no queue
    assert env.sup.moved == {}


def test_a_resumed_move_across_families_or_sizes_records_the_checkpoint_conversion(env: Env) -> None:
    env.pools.put(a100("a", 1.0))
    env.pools.put(a100("t", 1.0, accelerator="tpu-v5e", nodes=4))
    env.pools.put(a100("h", 1.0, accelerator="h100", nodes=4))
    ck = [{"step": 10}, {"step": None}, {"step": 40}, {"step": 30}]
    env.add("x1", attempt=1, placement=placed("a"), checkpoints=ck)
    env.sup._start("x1", placed("t", 1, accelerator="tpu-v5e"), env.pools.pools()[2])
    (ev,) = env.events("x1", "checkpoint_conversion")
    assert ev == {
        "attempt": 2,
        "step": 40,
        "from_pool": "a",
        "to_pool": "t",
        "from_accelerator": "a100-40gb",
        "to_accelerator": "tpu-v5e",
        "from_devices": 1,
        "to_devices": 1,
        "cross_family": True,
    }
    env.add("x2", attempt=1, placement=placed("a"), checkpoints=ck)
    env.sup._start("x2", placed("h", 2, accelerator="h100"), env.pools.pools()[1])
    (ev,) = env.events("x2", "checkpoint_conversion")
    assert ev["cross_family"] is False and (ev["from_devices"], ev["to_devices"]) == (1, 2)
    env.add("x3", attempt=1, placement=placed("a"), checkpoints=ck)
    env.sup._start("x3", placed("h", 1, accelerator="h100"), env.pools.pools()[1])  # same family, same size
    env.add("x4", attempt=1, checkpoints=ck)  # never placed
    env.sup._start("x4", placed("t", 1, accelerator="tpu-v5e"), env.pools.pools()[2])
    env.add("x5", attempt=1, placement=placed("a"))  # no checkpoint to convert
    env.sup._start("x5", placed("t", 1, accelerator="tpu-v5e"), env.pools.pools()[2])
    env.add(
        "x6", JobState.RUNNING, attempt=1, placement=placed("a"), checkpoints=ck
    )  # not queued: not started
    env.sup._start("x6", placed("t", 1, accelerator="tpu-v5e"), env.pools.pools()[2])
    env.sup._start("nope", placed("t", 1, accelerator="tpu-v5e"), env.pools.pools()[2])
    env.add(
        "x7", attempt=1, placement=placed("a"), checkpoints=[{"path": "p"}]
    )  # a checkpoint without a step
    env.sup._start("x7", placed("t", 1, accelerator="tpu-v5e"), env.pools.pools()[2])
    assert env.events("x7", "checkpoint_conversion")[0]["step"] == 0
    for jid in ("x3", "x4", "x5", "x6"):
        assert env.events(jid, "checkpoint_conversion") == [], jid
    assert [env.job(j).state for j in ("x3", "x4", "x5", "x6")] == [JobState.STARTING] * 3 + [
        JobState.RUNNING
    ]


def test_the_step_count_of_each_job_is_read_once_and_the_memo_is_bounded(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []
    monkeypatch.setattr(adapter, "total_steps", lambda d: reads.append(d["name"]) or 100)
    job = Job(
        id="j",
        seq=1,
        tenant_id="t1",
        name="j",
        state=JobState.QUEUED,
        spec=doc("j"),
        created_at_s=0,
        updated_at_s=0,
    )
    assert env.sup._total_steps(job) == 100 and env.sup._total_steps(job) == 100 and reads == ["j"]
    env.sup._steps = {**{str(i): 1 for i in range(10_000)}, "j": 100}
    env.sup._total_steps(job)  # known: read from the memo, which is left as it is
    assert len(env.sup._steps) == 10_001 and reads == ["j"]
    other = Job(
        id="k",
        seq=1,
        tenant_id="t1",
        name="k",
        state=JobState.QUEUED,
        spec=doc("k"),
        created_at_s=0,
        updated_at_s=0,
    )
    env.sup._total_steps(other)  # past 10,000 entries the memo starts again
    assert env.sup._steps == {"k": 100} and reads == ["j", "k"]
    env.sup._steps = {str(i): 1 for i in range(10_000)}
    env.sup._total_steps(other)
    assert len(env.sup._steps) == 10_001


def test_a_new_calibration_drops_the_quotes_priced_on_the_old_one(env: Env) -> None:
    env.jobs._quote_cache["d"] = []
    env.feedback.refreshed = False
    env.sup.tick()
    assert env.jobs._quote_cache == {"d": []}
    env.feedback.refreshed = True
    env.sup.tick()
    assert env.jobs._quote_cache == {}


def test_a_failing_feedback_refresh_is_logged_and_the_tick_goes_on(env: Env, logged: Logged) -> None:
    env.jobs._quote_cache["d"] = []
    env.feedback.refreshed = RuntimeError("db gone")
    env.pools.put(a100("a"))
    env.add("q1", quote=[{"pool": "a", "devices": 1, "feasible": True}])
    env.sup.schedule_round = GreedyCheapestRound()
    env.sup.tick()
    assert logged.take() == [{"event": "feedback_refresh_failed", "log_level": "error"}]
    assert env.jobs._quote_cache == {"d": []} and env.job("q1").state == JobState.STARTING


def test_the_feedback_hears_of_starts_heartbeats_and_closed_attempts(env: Env, logged: Logged) -> None:
    env.add("j", JobState.STARTING, attempt=1, placement=placed("a"), attempt_started_at_s=NOW - 10)
    env.sup.apply_event(ExecutorEvent(job_id="j", attempt=1, kind="started", data={"rank": 0}, time_s=NOW))
    env.sup.apply_event(ExecutorEvent(job_id="j", attempt=1, kind="heartbeat", data={"step": 5}, time_s=NOW))
    env.sup.apply_event(ExecutorEvent(job_id="j", attempt=1, kind="succeeded", data={}, time_s=NOW + 5))
    assert env.feedback.calls == [
        ("started", "j", JobState.STARTING, "started"),
        ("heartbeat", "j", JobState.RUNNING, 5),
        ("closed", "j", NOW + 5, "running"),
    ]
    env.feedback.calls = []
    env.add("k", JobState.SUCCEEDED, attempt=1)
    env.sup.apply_event(ExecutorEvent(job_id="k", attempt=1, kind="heartbeat", data={"step": 5}, time_s=NOW))
    env.add("n", JobState.QUEUED, attempt=1, placement=placed("a"))  # an attempt not started is not measured
    with env.db.session() as s:
        assert env.sup._close_attempt(s, env.job("n"), NOW) == {}
    assert env.feedback.calls == []
    env.add("boom", JobState.RUNNING, attempt=1, placement=placed("a"), attempt_started_at_s=NOW - 10)
    env.sup.apply_event(ExecutorEvent(job_id="boom", attempt=1, kind="succeeded", data={}, time_s=NOW))
    assert env.job("boom").state == JobState.SUCCEEDED and env.job("boom").cost_usd == pytest.approx(
        10 / 3600
    )
    assert logged.take() == [{"event": "feedback_store_failed", "job_id": "boom", "log_level": "error"}]
    env.sup.feedback = None  # without feedback the supervisor does the same
    env.add("m", JobState.STARTING, attempt=1, placement=placed("a"), attempt_started_at_s=NOW - 10)
    env.sup.apply_event(ExecutorEvent(job_id="m", attempt=1, kind="started", data={"rank": 0}, time_s=NOW))
    env.sup.apply_event(ExecutorEvent(job_id="m", attempt=1, kind="heartbeat", data={"step": 5}, time_s=NOW))
    env.sup.apply_event(ExecutorEvent(job_id="m", attempt=1, kind="succeeded", data={}, time_s=NOW))
    assert env.job("m").state == JobState.SUCCEEDED and env.feedback.calls == []
