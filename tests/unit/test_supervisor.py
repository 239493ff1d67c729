"""The supervisor on a real SQLite file with the scripted executor and a clock the test moves (no
server): free capacity, the concurrency caps and the round's fallback, each launch's request and its
failures (storage, user, infrastructure, with and without back-off), the executor's events turned into
state, progress, checkpoints, costs and ledger charges, preemption notices (by hand, spot and budget),
cancelled work and reconciliation after a restart. Dollars are worked by hand at $3.60 a device-hour
($0.001 a device-second)."""

from __future__ import annotations

import math
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from service_support import Logged, add_job, job_services, sqlite_template
from sqlalchemy import text

from fakes import FakeExecutor
from trainyard.catalog.pools import Pool
from trainyard.cost.quote import pool_accelerator, predict_kwargs
from trainyard.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    ServiceUnavailableError,
    StorageError,
)
from trainyard.executors.base import ExecutorEvent, RestartPolicy, WorkerInfo
from trainyard.predict import predict
from trainyard.services import execution
from trainyard.services.domain import Job, Placement, TenantLimits
from trainyard.services.execution import DEFAULT_NOTICE_S, Supervisor, attempt_cost_usd, launch_plan
from trainyard.services.lifecycle import JobState
from trainyard.services.pools import planning_only_reason
from trainyard.services.scheduling import RoundResult
from trainyard.spec.loader import spec_from_dict
from trainyard.store.repositories import EventRepo, JobRepo
from trainyard.tenancy import ledger
from trainyard.tenancy.storage import StoragePolicy

NOW = 1_800_000_000.0
PRICE = 3.6  # $ per device-hour: $0.001 per device-second
S = JobState


def doc(name: str = "tiny", **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "apiVersion": "trainyard/v1",
        "kind": "TrainingJob",
        "name": name,
        "model": {"architecture": "decoder", "n_layers": 2, "d_model": 64, "n_heads": 4, "vocab_size": 256},
        "workload": {"seq_len": 64, "global_batch": 4, "steps": 200, "precision": "fp32"},
        "requirements": {"allow": ["cpu"]},
    }
    d.update(over)
    return d


def cpu(name: str = "cpu", devices: int = 4, **kw: Any) -> Pool:
    return Pool(
        name=name,
        accelerator="cpu",
        devices_per_node=devices,
        nodes=1,
        market=kw.pop("market", "on_demand"),
        price_usd_per_device_hour=kw.pop("price", PRICE),
        region="local",
        **kw,
    )


def placed(pool: str = "cpu", devices: int = 1, **kw: Any) -> Placement:
    return Placement(
        pool=pool,
        devices=devices,
        market=kw.pop("market", "on_demand"),
        accelerator=kw.pop("accelerator", "cpu"),
        price_usd_per_device_hour=kw.pop("price", PRICE),
        **kw,
    )


class Governance:
    def __init__(self) -> None:
        self.held: set[str] = set()
        self.over: list[tuple[str, str]] = []
        self.refuse: set[str] = set()
        self.asked: list[Any] = []

    def is_held(self, s: Any, job_id: str) -> bool:
        # read in the caller's transaction, as the real hold table is
        return bool(s.execute(text("SELECT 1")).scalar()) and job_id in self.held

    def over_budget_running(self, notice_s: float) -> list[tuple[str, str]]:
        self.asked.append(notice_s)
        return list(self.over)

    def hold(self, job_id: str, budget_id: str) -> bool:
        self.asked.append((job_id, budget_id))
        if job_id in self.refuse:
            return False
        self.held.add(job_id)
        return True


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sqlite_template(
        tmp_path_factory.mktemp("sup") / "template.sqlite", [("t1", "acme"), ("t2", "beta")]
    )


class Env:
    def __init__(self, path: Path, runs: Path) -> None:
        self.db, self.clock, self.pools, self.jobs = job_services(path, NOW)
        self.ex = FakeExecutor(clock=NOW)
        self.runs = runs
        self.sup = Supervisor(
            self.db,
            self.jobs,
            self.pools,
            self.ex,
            runs_dir=runs,
            checkpoint_url="file:///ck",
            clock=self.clock,
        )
        self.pools.put(cpu())

    def add(
        self, job_id: str, state: JobState = S.QUEUED, spec: dict[str, Any] | None = None, **fields: Any
    ) -> None:
        add_job(self.db, job_id, state, spec or doc(job_id), NOW, **fields)

    def running(self, job_id: str, devices: int = 1, *, started: float = NOW - 100, **fields: Any) -> None:
        self.add(
            job_id,
            fields.pop("state", S.RUNNING),
            attempt=fields.pop("attempt", 1),
            placement=fields.pop("placement", placed(devices=devices)),
            attempt_started_at_s=started,
            run_dir=str(self.runs / job_id),
            **fields,
        )

    def set(self, job_id: str, **fields: Any) -> None:
        with self.db.session() as s:
            JobRepo(s).update(job_id, **fields)

    def job(self, job_id: str) -> Job:
        with self.db.session() as s:
            j = JobRepo(s).get(job_id)
        assert j is not None
        return j

    def events(self, job_id: str, kind: str | None = None) -> list[Any]:
        with self.db.session() as s:
            evs = EventRepo(s).list(job_id)
        if kind is None:
            return [(e.kind, e.data) for e in evs]
        return [e.data for e in evs if e.kind == kind]

    def states(self, job_id: str) -> list[tuple[str, str, str]]:
        return [(d["from"], d["to"], d["reason"]) for d in self.events(job_id, "state")]

    def ledger(self) -> list[dict[str, Any]]:
        with self.db.engine.connect() as c:
            return ledger.entries(c, ledger.UsageQuery(by="job", tenant_ids=None))

    def ev(
        self, job_id: str, kind: str, data: dict[str, Any] | None = None, *, attempt: int = 1, at: float = NOW
    ) -> None:
        self.sup.apply_event(
            ExecutorEvent(job_id=job_id, attempt=attempt, kind=kind, data=dict(data or {}), time_s=at)
        )


@pytest.fixture
def env(template: Path, tmp_path: Path) -> Iterator[Env]:
    path = tmp_path / "db.sqlite"
    shutil.copy(template, path)
    e = Env(path, tmp_path / "runs")
    yield e
    e.db.dispose()


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> Logged:
    out = Logged()
    monkeypatch.setattr(execution, "log", out)
    return out


def events_of(logged: Logged, name: str) -> list[dict[str, Any]]:
    return [r for r in logged.take() if r["event"] == name]


# ---- pure helpers ------------------------------------------------------------------------------------
def test_an_attempt_costs_its_devices_times_its_wall_seconds_at_the_placements_price() -> None:
    p = placed(devices=2)
    assert attempt_cost_usd(p, NOW, NOW + 100) == (200.0, pytest.approx(0.2))
    assert attempt_cost_usd(placed(devices=3, price=7.2), NOW, NOW + 10) == (30.0, pytest.approx(0.06))
    assert attempt_cost_usd(p, NOW, NOW - 5) == (0.0, 0.0)  # a clock that went back bills nothing
    assert attempt_cost_usd(None, NOW, NOW + 100) == (0.0, 0.0)
    assert attempt_cost_usd(p, None, NOW + 100) == (0.0, 0.0)


def test_the_launch_plan_is_the_predictors_plan_for_the_placement(logged: Logged) -> None:
    pool = cpu()
    acc = pool_accelerator(pool)
    want = dict(predict(spec_from_dict(doc()), acc, 2, **predict_kwargs(pool, acc)).plan)
    assert want and launch_plan(doc(), pool, 2) == want
    assert launch_plan(doc(), None, 2) is None
    bad = {**doc(), "workload": {"steps": -1}}
    assert launch_plan(bad, pool, 2) is None
    (rec,) = logged.take()
    try:
        spec_from_dict(bad)
    except InvalidInputError as exc:
        message = str(exc)
    assert rec == {
        "event": "launch_plan_failed",
        "pool": "cpu",
        "error": message[:300],
        "log_level": "warning",
    }


def test_the_launch_plan_is_priced_on_the_pools_topology(logged: Logged) -> None:
    pool = Pool(
        name="nodes",
        accelerator="cpu",
        devices_per_node=1,
        nodes=4,
        market="on_demand",
        price_usd_per_device_hour=PRICE,
        region="local",
        inter_node_gbps=1.0,
    )
    plan = launch_plan(doc(), pool, 2)
    assert plan is not None and (plan["data"], plan["pipeline"]) == (1, 2)  # two nodes on a slow network
    assert launch_plan(doc(), cpu(), 2)["pipeline"] == 1  # type: ignore[index]  # one node: data parallel
    long_name = {**doc(), "name": "x" * 400}
    assert launch_plan(long_name, pool, 2) is None
    try:
        spec_from_dict(long_name)
    except InvalidInputError as exc:
        message = str(exc)
    assert len(message) > 300
    (rec,) = logged.take()
    assert rec["event"] == "launch_plan_failed" and rec["error"] == message[:300]


# ---- the control loop --------------------------------------------------------------------------------
def test_a_tick_runs_every_phase_in_order_and_a_failing_one_stops_none_of_the_others(
    env: Env, logged: Logged
) -> None:
    ran: list[str] = []

    def phase(name: str, fail: bool = False) -> Any:
        def run() -> None:
            ran.append(name)
            if fail:
                raise RuntimeError(name)

        run.__name__ = name
        return run

    env.jobs.admit_pending = phase("admit_pending")  # type: ignore[method-assign]
    for name in (
        "release_restarts",
        "schedule_once",
        "poll_once",
        "sweep_cancelled",
        "spot_interruptions",
        "enforce_budgets",
        "scan_alerts",
    ):
        setattr(env.sup, name, phase(name, fail=name == "poll_once"))
    env.sup.observers = [phase("spans"), phase("counters", fail=True)]
    env.sup.tick()
    assert ran == [
        "admit_pending",
        "release_restarts",
        "schedule_once",
        "poll_once",
        "sweep_cancelled",
        "spot_interruptions",
        "enforce_budgets",
        "scan_alerts",
        "spans",
        "counters",
    ]
    assert logged.take() == [
        {"event": "control_loop_phase_failed", "phase": "poll_once", "log_level": "error"},
        {"event": "control_loop_phase_failed", "phase": "counters", "log_level": "error"},
    ]


def test_a_tick_of_a_supervisor_without_observers_places_queued_work(env: Env) -> None:
    env.add("q1", quote=[{"pool": "cpu", "devices": 1, "feasible": True}])
    env.sup.tick()
    assert env.job("q1").state == S.STARTING and len(env.ex.launches) == 1


def test_alerts_are_scanned_when_the_platform_gave_an_alert_service(env: Env) -> None:
    env.sup.scan_alerts()  # none: nothing to do

    class Alerts:
        scans = 0

        def scan(self) -> None:
            self.scans += 1

    env.sup.alerts = Alerts()
    env.sup.scan_alerts()
    assert env.sup.alerts.scans == 1


# ---- capacity and scheduling -------------------------------------------------------------------------
def test_a_pool_nothing_runs_on_offers_all_its_devices(env: Env) -> None:
    assert [(p.name, p.free_devices, p.available_devices) for p in env.sup.free_pools()] == [("cpu", 4, 4)]


def test_without_a_round_given_the_greedy_round_places_work_and_nothing_is_logged_as_failed(
    env: Env, logged: Logged
) -> None:
    env.add("q1", quote=[{"pool": "cpu", "devices": 2, "feasible": True}])
    result = env.sup.schedule_once()
    assert result is not None and result.placements["q1"].devices == 2
    assert [r["event"] for r in logged.take()] == ["launched"]


def test_free_capacity_is_what_the_served_pools_have_less_what_active_jobs_hold(env: Env) -> None:
    env.pools.put(cpu("small", devices=1))
    env.pools.put(cpu("far", devices=8))
    env.pools.put(cpu("plan", devices=8, backend="none"))
    env.ex.unserved = {"far"}
    env.running("r1", 3)
    env.running("r2", 1, state=S.STARTING)
    env.running("r3", 2, placement=placed("small", 2))  # more than the pool now has
    env.running("done", 4, state=S.SUCCEEDED)
    env.running("q", 4, state=S.QUEUED)
    free = {p.name: p.free_devices for p in env.sup.free_pools()}
    assert free == {"cpu": 0, "small": 0}
    env.set("r1", state=S.SUCCEEDED.value)
    assert {p.name: (p.free_devices, p.available_devices) for p in env.sup.free_pools()} == {
        "cpu": (3, 3),
        "small": (0, 0),
    }
    assert env.sup.executable(cpu()) and not env.sup.executable(cpu("far"))
    assert not env.sup.executable(cpu("x", backend="none"))


class Round:
    def __init__(self, answer: RoundResult | Exception | None = None) -> None:
        self.calls: list[tuple[list[Any], list[Any], float]] = []
        self.answer = answer or RoundResult(placements={}, unplaced={})

    def __call__(self, jobs: Any, pools: Any, now_s: float) -> RoundResult:
        self.calls.append((list(jobs), list(pools), now_s))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_nothing_queued_runs_no_round(env: Env) -> None:
    rnd = Round()
    env.sup.schedule_round = rnd
    env.running("r1")
    assert env.sup.schedule_once() is None and rnd.calls == [] and env.sup.last_round is None


def test_the_round_sees_each_queued_job_oldest_first_with_its_tenants_devices_and_quota(env: Env) -> None:
    with env.db.engine.begin() as c:
        c.execute(text("UPDATE tenants SET max_active_devices = 3 WHERE id = 't1'"))
    rnd = Round()
    env.sup.schedule_round = rnd
    quote = [{"pool": "cpu", "devices": 1, "feasible": True}]
    env.add("q1", quote=quote, attempt=2)
    env.add("q2", tenant="t2")
    env.running("r1", 2)
    env.clock.now += 5
    result = env.sup.schedule_once()
    assert result is rnd.answer and env.sup.last_round is result
    ((views, pools, now),) = rnd.calls
    assert now == NOW + 5 and [(p.name, p.free_devices) for p in pools] == [("cpu", 2)]
    v1, v2 = views
    assert (v1.job_id, v1.tenant_id, v1.spec, v1.submitted_at_s, v1.quote, v1.attempt) == (
        "q1",
        "t1",
        doc("q1"),
        NOW - 100,
        quote,
        2,
    )
    assert (v1.tenant_devices_in_use, v1.tenant_max_active_devices) == (2, 3)
    assert (v2.job_id, v2.quote, v2.tenant_devices_in_use, v2.tenant_max_active_devices) == (
        "q2",
        [],
        0,
        None,
    )
    assert env.sup.schedule_once(limit=1) is not None
    assert [v.job_id for v in rnd.calls[1][0]] == ["q1"]


def test_a_tenants_concurrent_job_cap_lets_its_oldest_queued_jobs_take_its_free_slots(env: Env) -> None:
    rnd = Round()
    env.sup.schedule_round = rnd
    limits = {"t1": TenantLimits(max_concurrent_jobs=2), "t2": TenantLimits(max_concurrent_jobs=None)}
    env.sup.tenant_limits = lambda: limits
    env.running("r1")
    env.running("r2", state=S.SUCCEEDED)
    for jid in ("a", "b", "c"):
        env.add(jid)
    env.add("x", tenant="t2")
    env.sup.schedule_once()
    assert [v.job_id for v in rnd.calls[0][0]] == ["a", "x"]
    env.running("r3", state=S.STARTING)  # t1 now runs two: no slot left
    env.sup.schedule_once()
    assert [v.job_id for v in rnd.calls[1][0]] == ["x"]
    env.set("x", state=S.CANCELLED.value)
    assert env.sup.schedule_once() is None and len(rnd.calls) == 2
    limits["t1"] = TenantLimits(max_concurrent_jobs=3)
    env.sup.schedule_once()
    assert [v.job_id for v in rnd.calls[2][0]] == ["a"]


def add_many(env: Env, prefix: str, n: int, state: JobState = S.QUEUED) -> list[str]:
    """``n`` jobs in ``state`` inserted oldest first in one transaction (no placement); their ids."""
    ids = [f"{prefix}{i:04d}" for i in range(n)]
    with env.db.session() as s:
        for jid in ids:
            JobRepo(s).add(
                Job(
                    id=jid,
                    seq=0,
                    tenant_id="t1",
                    name=jid,
                    state=state,
                    spec=doc(),
                    created_at_s=NOW - 100,
                    updated_at_s=NOW - 100,
                )
            )
    return ids


def test_a_round_sees_at_most_500_queued_jobs_the_oldest_first(env: Env) -> None:
    rnd = Round()
    env.sup.schedule_round = rnd
    ids = add_many(env, "q", 501)
    env.sup.schedule_once()
    assert [v.job_id for v in rnd.calls[0][0]] == ids[:500]


def test_a_capped_tenant_with_nothing_active_has_its_whole_cap_one_slot_a_job(env: Env) -> None:
    rnd = Round()
    env.sup.schedule_round = rnd
    env.sup.tenant_limits = lambda: {"t2": TenantLimits(max_concurrent_jobs=2)}
    for jid in ("x", "y", "z"):
        env.add(jid, tenant="t2")
    env.sup.schedule_once()
    assert [v.job_id for v in rnd.calls[0][0]] == ["x", "y"]


def test_a_tenants_active_jobs_past_the_fiftieth_count_against_its_cap(env: Env) -> None:
    rnd = Round()
    env.sup.schedule_round = rnd
    env.sup.tenant_limits = lambda: {"t1": TenantLimits(max_concurrent_jobs=51)}
    add_many(env, "r", 51, S.RUNNING)
    env.add("q")
    assert env.sup.schedule_once() is None and rnd.calls == []


def test_a_failing_round_falls_back_to_the_greedy_one(env: Env, logged: Logged) -> None:
    env.sup.schedule_round = Round(RuntimeError("solver crashed"))
    env.add("q1", quote=[{"pool": "cpu", "devices": 2, "feasible": True}])
    result = env.sup.schedule_once()
    assert result is not None and list(result.placements) == ["q1"] and env.sup.last_round is result
    assert env.job("q1").state == S.STARTING and env.job("q1").placement.devices == 2
    assert [r["event"] for r in logged.take()] == ["schedule_round_failed_using_greedy", "launched"]


def test_an_unplaced_jobs_reason_is_written_once_it_changes_and_kept_to_2000_characters(env: Env) -> None:
    rnd = Round(RoundResult(placements={}, unplaced={"q1": "waiting", "q2": "y" * 2500, "gone": "z"}))
    env.sup.schedule_round = rnd
    env.add("q1", reason="waiting")
    env.add("q2")
    env.clock.now += 50
    env.sup.schedule_once()
    assert env.job("q1").reason == "waiting" and env.job("q1").updated_at_s == NOW - 100
    assert env.job("q2").reason == "y" * 2000


def test_a_job_whose_only_fitting_capacity_is_planning_only_says_so(env: Env) -> None:
    env.pools.put(cpu("plan-b", backend="none"))
    env.pools.put(cpu("plan-a", backend="none"))
    opts = [
        {"pool": "plan-b", "feasible": True},
        {"pool": None, "instance_type": "m5.xl", "feasible": True},
        {"pool": None, "accelerator": "h100", "feasible": True},
        {"pool": "plan-a", "feasible": True},
        {"pool": "cpu", "feasible": False},
    ]
    env.add("q1", quote=opts)
    env.add(
        "q2", quote=[{"pool": "plan-a", "feasible": True}, {"pool": "cpu", "feasible": True, "devices": 9}]
    )
    env.add("q3", quote=[{"pool": "cpu", "feasible": False}])
    env.add("q4")
    unplaced = {"other": "x", "q3": "waiting", "q1": "waiting", "q2": "waiting", "q4": "waiting"}
    env.sup.schedule_round = Round(RoundResult(placements={}, unplaced=dict(unplaced)))
    result = env.sup.schedule_once()
    assert result is not None
    assert result.unplaced["q1"] == planning_only_reason(["h100", "m5.xl", "plan-a", "plan-b"])
    assert {k: result.unplaced[k] for k in ("q2", "q3", "q4", "other")} == {
        "q2": "waiting",
        "q3": "waiting",
        "q4": "waiting",
        "other": "x",
    }
    assert env.job("q1").reason == planning_only_reason(["h100", "m5.xl", "plan-a", "plan-b"])


# ---- launching ---------------------------------------------------------------------------------------
def test_a_placement_becomes_a_starting_attempt_and_a_launch_request(env: Env, logged: Logged) -> None:
    env.pools.put(cpu(notice_s=12.0))
    env.sup.metrics_every_steps, env.sup.metrics_max_rows_per_s = 5, 7.5
    env.add(
        "j",
        attempt=1,
        spec=doc("j", entrypoint={"code": "file:///code/x.tar.gz", "command": ["python", "t.py"]}),
    )
    p = placed(devices=2, checkpoint_interval_s=120.0, expected_cost_usd=1.5, reason="cheapest")
    env.sup._start("j", p, env.pools.pools()[0])
    job = env.job("j")
    assert job.state == S.STARTING and job.attempt == 2 and job.placement == p
    assert job.run_dir == str(env.runs / "j") and (env.runs / "j").is_dir()
    assert job.attempt_started_at_s == NOW and job.reason == "placed on cpu (2 devices)"
    assert job.updated_at_s == NOW
    assert env.events("j", "placement") == [{"attempt": 2, **p.to_dict()}]
    (req,) = env.ex.launches
    assert req.job_id == "j" and req.attempt == 2 and req.spec == job.spec and req.world_size == 2
    assert (req.pool, req.market, req.accelerator) == ("cpu", "on_demand", "cpu")
    assert req.checkpoint_url == "file:///ck" and req.checkpoint_interval_s == 120.0
    assert req.run_dir == str(env.runs / "j") and req.notice_s == 12.0
    assert req.plan == launch_plan(job.spec, env.pools.pools()[0], 2) and req.plan
    assert (req.tenant, req.storage_roots, req.code_url, req.env) == ("acme", [], "file:///code/x.tar.gz", {})
    assert (req.metrics_every_steps, req.metrics_max_rows_per_s) == (5, 7.5)
    docs = [{"rank": 0, "pid": 40_000, "host": "fakehost"}, {"rank": 1, "pid": 40_001, "host": "fakehost"}]
    assert env.job("j").workers == [WorkerInfo(**d).to_dict() for d in docs]
    assert env.events("j", "workers") == [{"attempt": 2, "workers": env.job("j").workers}]
    (rec,) = [r for r in logged.take() if r["event"] == "launched"]
    assert rec == {
        "event": "launched",
        "job_id": "j",
        "attempt": 2,
        "pool": "cpu",
        "devices": 2,
        "log_level": "info",
    }


def test_a_launch_takes_the_specs_storage_and_interval_else_the_servers(env: Env) -> None:
    env.pools.put(cpu(notice_s=None))
    env.add("a", spec=doc("a", checkpoint={"storage": "file:///mine", "interval": "10m"}))
    env.add("b", spec=doc("b", checkpoint={"interval": "auto"}))
    env.add("c")
    pool = env.pools.pools()[0]
    for jid in ("a", "b", "c"):
        env.sup._start(jid, placed(), pool)
    a, b, c = env.ex.launches
    assert (a.checkpoint_url, a.checkpoint_interval_s, a.notice_s) == (
        "file:///mine",
        600.0,
        DEFAULT_NOTICE_S,
    )
    assert (b.checkpoint_url, b.checkpoint_interval_s) == ("file:///ck", None)
    assert (c.checkpoint_url, c.checkpoint_interval_s) == ("file:///ck", None)


def test_a_storage_policy_given_to_the_supervisor_places_checkpoints_in_the_tenants_area(
    env: Env, tmp_path: Path
) -> None:
    policy = StoragePolicy(f"file://{tmp_path}/store")
    sup = Supervisor(
        env.db,
        env.jobs,
        env.pools,
        env.ex,
        runs_dir=env.runs,
        checkpoint_url="file:///ck",
        clock=env.clock,
        storage_policy=policy,
    )
    env.add("a")
    sup._start("a", placed(), env.pools.pools()[0])
    (req,) = env.ex.launches
    assert req.checkpoint_url == policy.area("acme", "checkpoints")
    assert req.storage_roots == policy.roots("acme")
    assert (req.metrics_every_steps, req.metrics_max_rows_per_s) == (1, 100.0)  # the defaults: every step


def test_with_a_storage_policy_a_launch_gets_the_tenants_roots_and_checkpoint_area(
    env: Env, tmp_path: Path
) -> None:
    policy = StoragePolicy(f"file://{tmp_path}/store")
    env.sup.storage_policy = policy
    with env.db.engine.begin() as c:
        c.execute(text("UPDATE tenants SET storage_roots = :r WHERE id = 't1'"), {"r": '["s3://granted/x"]'})
    env.add("a")
    env.add("b", spec=doc("b", checkpoint={"storage": "file:///mine"}))
    env.add("c", tenant="t2")
    pool = env.pools.pools()[0]
    for jid in ("a", "b", "c"):
        env.sup._start(jid, placed(), pool)
    a, b, c = env.ex.launches
    assert a.storage_roots == policy.roots("acme", ["s3://granted/x"]) and len(a.storage_roots) == 2
    assert a.checkpoint_url == policy.area("acme", "checkpoints") and a.tenant == "acme"
    assert b.checkpoint_url == "file:///mine" and b.storage_roots == a.storage_roots
    assert (c.tenant, c.storage_roots, c.checkpoint_url) == (
        "beta",
        policy.roots("beta"),
        policy.area("beta", "checkpoints"),
    )


def test_a_launch_carries_the_platforms_environment_for_the_job(env: Env) -> None:
    seen: list[str] = []
    env.sup.launch_env = lambda job: seen.append(job.id) or {"HF_HOME": "/models"}  # type: ignore[func-returns-value]
    env.add("j")
    env.sup._start("j", placed(), env.pools.pools()[0])
    assert seen == ["j"] and env.ex.launches[0].env == {"HF_HOME": "/models"}


def test_a_launch_environment_that_cannot_be_made_fails_the_job_as_the_users(
    env: Env, logged: Logged
) -> None:
    def gone(job: Job) -> dict[str, str]:
        raise NotFoundError("model acme/base@3 is gone" + "!" * 600)

    env.sup.launch_env = gone
    env.add("j", workers=[{"rank": 0, "pid": 1, "host": "old"}])
    env.sup._start("j", placed(), env.pools.pools()[0])
    assert env.job("j").workers == []  # the last attempt's workers are gone
    job = env.job("j")
    reason = "launch failed: model acme/base@3 is gone" + "!" * 600
    assert job.state == S.FAILED and job.reason == reason and env.ex.launches == []
    assert env.states("j")[-1] == ("starting", "failed", reason)
    assert env.events("j", "restart") == [] and job.attempt_started_at_s is None
    (rec,) = events_of(logged, "launch_env_failed")
    assert rec["job_id"] == "j" and rec["error"] == ("model acme/base@3 is gone" + "!" * 600)[:500]


def test_unusable_checkpoint_storage_fails_the_attempt_without_a_restart(env: Env, logged: Logged) -> None:
    def refuse(req: Any) -> Any:
        raise StorageError("cannot write file:///ck", hint="make it writable", details={"url": "file:///ck"})

    env.ex.launch = refuse  # type: ignore[method-assign]
    env.add("j")
    env.clock.now += 0
    env.sup._start("j", placed(), env.pools.pools()[0])
    job = env.job("j")
    assert job.state == S.FAILED and job.reason == "checkpoint storage unusable: cannot write file:///ck"
    assert env.events("j", "failed") == [
        {
            "attempt": 1,
            "classification": "storage",
            "reason": "cannot write file:///ck",
            "hint": "make it writable",
            "details": {"url": "file:///ck"},
        }
    ]
    assert env.events("j", "state")[-1]["classification"] == "storage"
    assert env.events("j", "cost") == [
        {"attempt": 1, "device_s": 0.0, "usd": 0.0, "price_usd_per_device_hour": PRICE, "pool": "cpu"}
    ]
    assert job.attempt_started_at_s is None and env.events("j", "restart") == []
    (rec,) = events_of(logged, "launch_refused_storage")
    assert rec == {
        "event": "launch_refused_storage",
        "job_id": "j",
        "attempt": 1,
        "error": "cannot write file:///ck",
        "log_level": "warning",
    }

    def refuse_long(req: Any) -> Any:
        raise StorageError("w" * 600)

    env.ex.launch = refuse_long  # type: ignore[method-assign]
    env.add("k")
    env.sup._start("k", placed(), env.pools.pools()[0])
    (rec,) = events_of(logged, "launch_refused_storage")
    assert rec["job_id"] == "k" and rec["error"] == "w" * 500


def test_a_storage_failure_of_an_attempt_that_moved_on_changes_nothing(env: Env) -> None:
    env.running("j", attempt=2)
    env.sup._fail_for_storage("j", 1, StorageError("x"))
    env.sup._fail_for_storage("nope", 1, StorageError("x"))
    env.set("j", state=S.QUEUED.value)
    env.sup._fail_for_storage("j", 2, StorageError("x"))
    assert env.job("j").state == S.QUEUED and env.events("j") == []
    env.set("j", state=S.RUNNING.value)
    env.sup._fail_for_storage("j", 2, StorageError("y" * 2100, hint="h"))
    job = env.job("j")
    assert job.state == S.FAILED and job.reason == ("checkpoint storage unusable: " + "y" * 2100)[:2000]
    assert env.events("j", "failed")[0]["reason"] == "y" * 1000


def test_a_launch_that_fails_on_infrastructure_is_restarted(env: Env, logged: Logged) -> None:
    env.ex.fail_launch = True
    env.add("j")
    env.sup._start("j", placed(), env.pools.pools()[0])
    job = env.job("j")
    reason = "launch failed: no capacity in the fake cloud"
    assert job.state == S.QUEUED and job.reason == reason and job.attempt == 1
    assert job.attempt_started_at_s is None and env.events("j", "cost")[0]["device_s"] == 0.0
    assert env.events("j", "restart") == [
        {"attempt": 1, "classification": "infra", "restart": 1, "max_restarts": 3, "reason": reason}
    ]
    assert env.states("j")[-1] == ("starting", "queued", reason)
    (rec,) = events_of(logged, "launch_failed")
    assert rec == {
        "event": "launch_failed",
        "job_id": "j",
        "attempt": 1,
        "error": "no capacity in the fake cloud",
        "log_level": "warning",
    }


def test_a_launch_failure_is_kept_to_1000_characters_and_logged_to_500(env: Env, logged: Logged) -> None:
    def fail(req: Any) -> Any:
        raise RuntimeError("z" * 1500)

    env.ex.launch = fail  # type: ignore[method-assign]
    env.add("j")
    env.sup._start("j", placed(), env.pools.pools()[0])
    assert env.job("j").reason == ("launch failed: " + "z" * 1500)[:1000]
    (rec,) = events_of(logged, "launch_failed")
    assert rec["error"] == "z" * 500


def test_a_failed_launch_waits_out_its_back_off_in_preempted_then_uses_up_its_restarts(env: Env) -> None:
    env.ex.fail_launch = True
    env.sup.restart_backoff = True
    env.sup.restart_policy = RestartPolicy(max_restarts=2, backoff_initial_s=1.5, backoff_factor=2.0)
    env.add("j")
    pool = env.pools.pools()[0]
    env.sup._start("j", placed(), pool)
    reason = "launch failed: no capacity in the fake cloud"
    assert env.job("j").attempt_started_at_s is None  # the attempt is closed while it waits
    assert env.job("j").state == S.PREEMPTED and env.job("j").reason == f"{reason}; restarting in 1.5 s"
    assert env.events("j", "state")[-1] == {
        "from": "starting",
        "to": "preempted",
        "reason": f"{reason}; restarting in 1.5 s",
        "classification": "infra",
        "backoff_s": 1.5,
    }
    assert env.sup._restart_not_before == {"j": NOW + 1.5}
    env.clock.now += 1.0
    assert env.sup.release_restarts() == 0 and env.job("j").state == S.PREEMPTED
    env.clock.now += 0.5
    assert env.sup.release_restarts() == 1
    assert env.job("j").state == S.QUEUED
    assert env.job("j").reason == "back-off over; back in the queue, resumes from its last checkpoint"
    env.sup._start("j", placed(), pool)
    assert env.job("j").reason == f"{reason}; restarting in 3 s"
    env.clock.now += 3
    env.sup.release_restarts()
    env.sup._start("j", placed(), pool)
    assert env.job("j").state == S.FAILED and env.job("j").reason == reason
    assert [e["restart"] for e in env.events("j", "restart")] == [1, 2]


def test_releasing_a_restart_skips_a_job_no_longer_waiting(env: Env) -> None:
    assert env.sup.release_restarts() == 0
    env.add("j", S.CANCELLED)
    env.sup._restart_not_before = {"j": NOW, "gone": NOW - 1, "later": NOW + 1}
    assert env.sup.release_restarts() == 2
    assert env.sup._restart_not_before == {"later": NOW + 1} and env.job("j").state == S.CANCELLED


def test_a_placement_no_executor_serves_or_of_a_job_no_longer_queued_starts_nothing(
    env: Env, logged: Logged
) -> None:
    env.ex.unserved = {"cpu"}
    env.add("j")
    env.sup._start("j", placed(), env.pools.pools()[0])
    env.sup._start("j", placed("nowhere"), None)
    assert env.job("j").state == S.QUEUED and env.ex.launches == []
    assert [(r["event"], r["job_id"], r["pool"]) for r in logged.take()] == [
        ("placement_not_executable", "j", "cpu"),
        ("placement_not_executable", "j", "nowhere"),
    ]
    env.ex.unserved = set()
    env.add("r", S.CANCELLED)
    env.sup._start("r", placed(), env.pools.pools()[0])
    env.sup._start("nope", placed(), env.pools.pools()[0])
    assert env.ex.launches == [] and env.events("r") == []


def test_the_launched_workers_are_recorded_at_the_time_the_launch_returned(env: Env) -> None:
    env.add("j")
    real = env.ex.launch

    def slow_launch(req: Any) -> Any:
        env.clock.now += 7.0  # the executor took 7 s
        return real(req)

    env.ex.launch = slow_launch  # type: ignore[method-assign]
    env.sup._start("j", placed(), env.pools.pools()[0])
    job = env.job("j")
    assert job.attempt_started_at_s == NOW and job.updated_at_s == NOW + 7.0 and len(job.workers) == 1


def test_a_terminal_event_without_a_log_keeper_archives_nothing_and_logs_no_failure(
    env: Env, logged: Logged
) -> None:
    env.running("j")
    env.ex.emit("j", "succeeded", {}, attempt=1)
    env.sup.poll_once()
    assert env.job("j").state == S.SUCCEEDED and logged.take() == []


def test_workers_of_an_attempt_that_moved_on_during_the_launch_are_not_recorded(env: Env) -> None:
    env.add("j")
    real = env.ex.launch

    def launch(req: Any) -> Any:
        env.set("j", attempt=5)
        return real(req)

    env.ex.launch = launch  # type: ignore[method-assign]
    env.sup._start("j", placed(), env.pools.pools()[0])
    assert env.job("j").workers == [] and env.events("j", "workers") == []


# ---- executor events ---------------------------------------------------------------------------------
def test_polled_events_are_applied_logs_archived_at_the_end_and_alerts_checked(
    env: Env, logged: Logged
) -> None:
    archived: list[tuple[str, int]] = []
    observed: list[tuple[str, str, int]] = []

    class Logs:
        def archive(self, job: Job, attempt: int) -> None:
            archived.append((job.id, attempt))

    class Alerts:
        def observe(self, ev: ExecutorEvent, job: Job) -> None:
            observed.append((ev.kind, job.id, ev.attempt))

    env.sup.worker_logs, env.sup.alerts = Logs(), Alerts()
    env.running("j", attempt=2)
    for kind in ("log", "metrics", "heartbeat", "failed"):
        env.ex.emit(
            "j", kind, {"reason": "oom", "classification": "user"} if kind == "failed" else {}, attempt=2
        )
    env.ex.emit("j", "log", {}, attempt=1)  # a stale attempt: no alert
    env.ex.emit("gone", "lost", {}, attempt=1)
    assert env.sup.poll_once() == 6
    assert observed == [("log", "j", 2), ("metrics", "j", 2), ("failed", "j", 2)]
    assert archived == [("j", 2)]
    assert env.job("j").state == S.FAILED
    assert env.sup.poll_once() == 0


def test_an_event_that_cannot_be_applied_is_logged_and_the_rest_still_are(env: Env, logged: Logged) -> None:
    env.running("a")
    env.running("b")

    def broken(*args: Any) -> None:
        raise RuntimeError("bad event")

    env.sup._on_checkpoint = broken  # type: ignore[method-assign]
    env.ex.emit("a", "checkpoint", {"step": 1}, attempt=1)
    env.ex.emit("b", "succeeded", {}, attempt=1)
    env.sup.poll_once()
    assert env.job("b").state == S.SUCCEEDED
    (rec,) = events_of(logged, "event_apply_failed")
    assert rec == {"event": "event_apply_failed", "job_id": "a", "kind": "checkpoint", "log_level": "error"}


def test_a_failing_alert_check_or_log_archive_is_logged_and_never_stops_the_loop(
    env: Env, logged: Logged
) -> None:
    class Broken:
        def observe(self, ev: Any, job: Any) -> None:
            raise RuntimeError("alerts down")

        def archive(self, job: Any, attempt: int) -> None:
            raise RuntimeError("storage down")

    env.sup.alerts = env.sup.worker_logs = Broken()
    env.running("j")
    env.ex.emit("j", "failed", {"classification": "user"}, attempt=1)
    env.sup.poll_once()
    recs = logged.take()
    assert {"event": "alert_check_failed", "job_id": "j", "kind": "failed", "log_level": "error"} in recs
    assert {"event": "log_archive_failed", "job_id": "j", "attempt": 1, "log_level": "error"} in recs
    env.sup.archive_logs("nope", 1)  # no such job: nothing archived, nothing logged
    assert logged.take() == []


def test_an_unknown_event_is_kept_as_a_job_event_and_a_stale_attempts_is_dropped(env: Env) -> None:
    env.running("j", attempt=2)
    env.ev("j", "oddity", {"x": 1}, attempt=2, at=NOW + 3)
    env.ev("j", "oddity", {"x": 2}, attempt=1)
    env.ev("nope", "oddity", {"x": 3})
    env.ev("j", "span", {"name": "step"}, attempt=2)
    assert env.events("j") == [("oddity", {"attempt": 2, "x": 1})]


def test_started_workers_are_recorded_by_rank_and_the_job_runs(env: Env) -> None:
    env.running(
        "j",
        state=S.STARTING,
        workers=[{"rank": 1, "pid": 5, "host": "b"}, {"rank": 0, "pid": 4, "host": "old"}],
    )
    env.ev("j", "started", {"rank": 0, "pid": 9, "host": "a"}, at=NOW + 1)
    job = env.job("j")
    assert job.state == S.RUNNING and job.reason == "workers started"
    assert job.workers == [{"rank": 0, "pid": 9, "host": "a"}, {"rank": 1, "pid": 5, "host": "b"}]
    env.ev("j", "started", {"pid": 7})
    assert env.job("j").workers[-1] == {"rank": None, "pid": 7, "host": None}
    assert env.events("j", "started") == [
        {"attempt": 1, "rank": 0, "pid": 9, "host": "a"},
        {"attempt": 1, "pid": 7},
    ]
    assert env.states("j") == [("starting", "running", "workers started")]
    env.add("q", S.QUEUED, attempt=1)
    env.ev("q", "started", {"rank": 0})
    assert env.events("q") == [] and env.job("q").workers == []


def test_a_run_record_is_stored_and_noted_in_the_jobs_events(env: Env) -> None:
    stored: list[tuple[Any, ...]] = []

    class Records:
        def store(self, s: Any, job: Job, attempt: int, data: dict[str, Any], time_s: float) -> None:
            state = s.execute(text("SELECT state FROM jobs WHERE id = :id"), {"id": job.id}).scalar()
            stored.append((job.id, attempt, data, time_s, state))  # in the event's transaction

    env.running("j")
    data = {"spec_sha256": "abc", "datasets": [{"id": "d"}], "env": {"torch": "2"}}
    env.ev("j", "record", data, at=NOW + 2)
    assert env.events("j", "record") == [{"attempt": 1, "spec_sha256": "abc", "datasets": [{"id": "d"}]}]
    env.sup.records = Records()
    env.ev("j", "record", data, at=NOW + 2)
    assert stored == [("j", 1, data, NOW + 2, "running")]


def test_heartbeats_update_progress_and_are_kept_as_events_every_10_seconds(env: Env) -> None:
    env.running("j", state=S.STARTING, progress={"loss": 3.0, "tokens": 1})
    env.ev("j", "heartbeat", {"rank": 0, "step": 5}, at=NOW)
    job = env.job("j")
    assert job.state == S.RUNNING and job.reason == "first heartbeat"
    assert job.progress == {"loss": 3.0, "tokens": 1, "step": 5, "time_s": NOW}
    env.ev("j", "heartbeat", {"rank": 1, "step": 6, "loss": 2.5}, at=NOW + 9.5)
    assert env.job("j").progress == {"loss": 2.5, "tokens": 1, "step": 6, "time_s": NOW + 9.5}
    env.ev("j", "heartbeat", {"step": 7}, at=NOW + 10)
    env.ev("j", "heartbeat", {"step": 8}, at=NOW + 19.9)
    assert [d["step"] for d in env.events("j", "heartbeat")] == [5, 7]
    assert env.events("j", "heartbeat")[0] == {"attempt": 1, "rank": 0, "step": 5}
    env.running("k")
    env.ev("k", "heartbeat", {"step": 1}, at=9.0)  # the first heartbeat event is due 10 s after time 0
    env.ev("k", "heartbeat", {"step": 2}, at=10.0)
    assert [d["step"] for d in env.events("k", "heartbeat")] == [2]
    env.running("done", state=S.SUCCEEDED)
    env.ev("done", "heartbeat", {"step": 1})
    assert env.job("done").progress == {} and env.events("done") == []


def test_step_metrics_are_stored_as_rows_and_not_as_events(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainyard.services import training_metrics

    got: list[tuple[Any, ...]] = []

    def ingest(s: Any, job_id: str, attempt: int, data: dict[str, Any]) -> None:
        state = s.execute(text("SELECT state FROM jobs WHERE id = :id"), {"id": job_id}).scalar()
        got.append((job_id, attempt, data, state))  # in the event's transaction

    monkeypatch.setattr(training_metrics, "ingest", ingest)
    env.running("j", attempt=3)
    env.ev("j", "metrics", {"steps": [1], "values": {"loss": [2.0]}}, attempt=3)
    assert got == [("j", 3, {"steps": [1], "values": {"loss": [2.0]}}, "running")] and env.events("j") == []


def test_a_checkpoint_is_recorded_with_what_storage_bills_and_replaces_what_retention_removed(
    env: Env,
) -> None:
    env.running(
        "j",
        attempt=2,
        checkpoints=[
            {"step": 10, "path": "p10", "attempt": 1},
            {"step": 20, "path": "p20", "attempt": 1},
            {"step": 30, "path": "p30", "attempt": 2, "removed_at_s": 5.0},
            {"step": 40, "path": "p40", "attempt": 2},
        ],
    )
    env.ev(
        "j",
        "checkpoint",
        {"step": 40, "path": "p40b", "bytes": 1000, "removed_steps": [10, 30]},
        attempt=2,
        at=NOW + 1,
    )
    assert env.job("j").checkpoints == [
        {"step": 10, "path": "p10", "attempt": 1, "removed_at_s": NOW + 1},
        {"step": 20, "path": "p20", "attempt": 1},
        {"step": 30, "path": "p30", "attempt": 2, "removed_at_s": 5.0},
        {"step": 40, "path": "p40", "attempt": 2, "removed_at_s": NOW + 1},
        {"step": 40, "path": "p40b", "attempt": 2, "bytes": 1000, "time_s": NOW + 1},
    ]
    env.ev("j", "checkpoint", {"step": 50, "path": "p50", "bytes": "1000"}, attempt=2, at=NOW + 2)
    assert env.job("j").checkpoints[-1] == {"step": 50, "path": "p50", "attempt": 2}
    assert env.job("j").checkpoints[-2]["step"] == 40 and "removed_at_s" not in env.job("j").checkpoints[-2]
    assert env.events("j", "checkpoint")[0] == {
        "attempt": 2,
        "step": 40,
        "path": "p40b",
        "bytes": 1000,
        "removed_steps": [10, 30],
    }


def test_a_finished_job_is_charged_for_its_attempt_and_keeps_its_result(env: Env) -> None:
    env.running("j", 2, state=S.STARTING, started=NOW - 100, name="tiny")
    env.set("j", cost_usd=0.5)
    env.ev(
        "j", "succeeded", {"model_sha256": "abc", "model_path": "/m", "final_step": 200, "loss": 1.25}, at=NOW
    )
    job = env.job("j")
    assert job.state == S.SUCCEEDED and job.reason == "training finished"
    assert job.result == {
        "model_version": "tiny@j",
        "model_sha256": "abc",
        "model_path": "/m",
        "final_step": 200,
        "loss": 1.25,
    }
    assert job.cost_usd == pytest.approx(0.5 + 0.2) and job.attempt_started_at_s is None
    assert env.states("j") == [
        ("starting", "running", "workers started"),
        ("running", "succeeded", "training finished"),
    ]
    assert env.events("j", "cost") == [
        {"attempt": 1, "device_s": 200.0, "usd": 0.2, "price_usd_per_device_hour": PRICE, "pool": "cpu"}
    ]
    (entry,) = env.ledger()
    assert (entry["job_id"], entry["usd"], entry["quantity"], entry["time_s"]) == (
        "j",
        pytest.approx(0.2),
        200.0,
        NOW,
    )
    assert entry["source_key"] == "job:j:attempt:1:device_seconds"
    assert (entry["tenant_id"], entry["attempt"], entry["pool"], entry["devices"]) == ("t1", 1, "cpu", 2)
    assert (entry["accelerator"], entry["market"], entry["unit_price_usd"]) == ("cpu", "on_demand", 0.001)
    env.running("k")
    env.ev("k", "succeeded", {"model_version": "acme/k@2", "loss": None})
    assert env.job("k").result == {
        "model_version": "acme/k@2",
        "model_sha256": None,
        "model_path": None,
        "final_step": None,
    }


def test_a_finished_jobs_model_is_registered_and_a_failed_registration_is_kept_in_its_result(
    env: Env, logged: Logged
) -> None:
    def register(s: Any, job: Job, result: dict[str, Any]) -> dict[str, Any]:
        if job.id == "bad":
            raise RuntimeError("registry down" + "!" * 600)
        s.execute(text("SELECT 1"))  # in the transaction that finishes the job
        return {"model_version": "acme/j@1", "registered": result["model_sha256"]}

    env.sup.on_job_succeeded = register
    env.running("j")
    env.running("bad")
    env.ev("j", "succeeded", {"model_sha256": "a"})
    env.ev("bad", "succeeded", {})
    assert env.job("j").result == {
        "model_version": "acme/j@1",
        "model_sha256": "a",
        "model_path": None,
        "final_step": None,
        "registered": "a",
    }
    assert env.job("bad").state == S.SUCCEEDED
    assert env.job("bad").result["registry_error"] == ("registry down" + "!" * 600)[:500]
    assert events_of(logged, "model_registration_failed") == [
        {"event": "model_registration_failed", "job_id": "bad", "log_level": "error"}
    ]


def test_events_for_a_job_that_is_no_longer_active_change_nothing(env: Env) -> None:
    for kind in ("succeeded", "failed", "lost", "preempted", "heartbeat"):
        env.running(kind, state=S.CANCELLED)
        env.ev(kind, kind, {})
        assert env.job(kind).state == S.CANCELLED and env.events(kind) == [], kind


def test_a_user_failure_fails_the_job_and_an_infrastructure_one_restarts_it_within_its_budget(
    env: Env,
) -> None:
    env.sup.restart_policy = RestartPolicy(max_restarts=1)
    env.running("u", started=NOW - 10)
    env.ev("u", "failed", {"reason": "ValueError in train.py", "classification": "user"}, at=NOW)
    job = env.job("u")
    assert job.state == S.FAILED and job.reason == "user failure: ValueError in train.py"
    assert env.events("u", "state")[-1]["classification"] == "user" and job.cost_usd == pytest.approx(0.01)
    assert env.events("u", "failed") == [
        {"attempt": 1, "reason": "ValueError in train.py", "classification": "user"}
    ]
    env.running("i", started=NOW - 10)
    env.ev("i", "failed", {}, at=NOW)
    job = env.job("i")
    assert job.state == S.QUEUED and job.reason == "back in the queue; resumes from its last checkpoint"
    assert env.states("i") == [
        ("running", "preempted", "infra failure, restarting: the job failed"),
        ("preempted", "queued", "back in the queue; resumes from its last checkpoint"),
    ]
    assert env.events("i", "state")[0]["classification"] == "infra" and job.cost_usd == pytest.approx(0.01)
    assert env.events("i", "restart") == [
        {"attempt": 1, "classification": "infra", "restart": 1, "max_restarts": 1, "reason": "the job failed"}
    ]
    env.set("i", state=S.RUNNING.value)
    env.ev("i", "failed", {"reason": "x" * 2500, "classification": "infra"})
    assert env.job("i").state == S.FAILED and env.job("i").reason == "infra failure: " + "x" * 2000


def test_an_infrastructure_failure_with_back_off_waits_in_preempted(env: Env) -> None:
    env.sup.restart_backoff = True
    env.sup.restart_policy = RestartPolicy(backoff_initial_s=2.0, backoff_factor=3.0)
    env.running("j", started=NOW - 10)
    env.clock.now = NOW + 1
    env.ev("j", "lost", {"reason": "node gone" + "y" * 2100}, at=NOW)
    job = env.job("j")
    why = "workers lost: node gone" + "y" * 2100
    assert job.state == S.PREEMPTED and job.reason == f"infra failure, restarting in 2 s: {why}"[:2000]
    assert env.events("j", "state")[-1] == {
        "from": "running",
        "to": "preempted",
        "reason": job.reason,
        "classification": "infra",
        "backoff_s": 2.0,
    }
    assert env.events("j", "restart")[0]["reason"] == why[:500]
    assert env.sup._restart_not_before == {"j": NOW + 3.0} and job.cost_usd == pytest.approx(0.01)
    env.set("j", state=S.RUNNING.value, attempt_started_at_s=NOW)
    env.ev("j", "lost", {}, at=NOW + 5)
    assert env.job("j").reason == "infra failure, restarting in 6 s: workers lost: "
    assert env.events("j", "lost") == [{"attempt": 1, "reason": "node gone" + "y" * 2100}, {"attempt": 1}]


def test_only_restarts_count_against_the_failure_budget(env: Env) -> None:
    env.running("j")
    with env.db.session() as s:
        for kind in ("restart", "preempted", "restart", "state"):
            EventRepo(s).append("j", kind, {}, NOW)
        assert env.sup._failure_restarts(s, "j") == 2


def test_restarts_recorded_after_a_thousand_other_events_still_use_up_the_budget(env: Env) -> None:
    env.sup.restart_policy = RestartPolicy(max_restarts=1)
    env.running("j")
    with env.db.session() as s:
        for i in range(1000):  # about 3 hours of heartbeat events
            EventRepo(s).append("j", "heartbeat", {"step": i}, NOW)
        EventRepo(s).append("j", "restart", {"restart": 1}, NOW)
    env.ev("j", "failed", {"classification": "infra"})
    assert env.job("j").state == S.FAILED and env.job("j").reason == "infra failure: the job failed"


def test_a_preempted_attempt_is_charged_to_its_notice_and_requeued(env: Env) -> None:
    env.running("j", 2, started=NOW - 100)
    env.ev("j", "preempted", {"step": 40}, at=NOW - 50)
    job = env.job("j")
    assert job.state == S.QUEUED and job.cost_usd == pytest.approx(0.1) and job.attempt_started_at_s is None
    assert env.states("j") == [
        ("running", "preempted", "preempted"),
        ("preempted", "queued", "back in the queue; resumes from its last checkpoint"),
    ]
    assert env.events("j", "state")[0]["attempt"] == 1
    assert env.events("j", "preempted") == [{"attempt": 1, "step": 40}]


def test_a_preempted_attempt_held_at_its_budget_stays_preempted(env: Env) -> None:
    gov = Governance()
    gov.held = {"j"}
    env.sup.governance = gov
    env.running("j", started=NOW - 100)
    env.ev("j", "preempted", {}, at=NOW)
    job = env.job("j")
    reason = "stopped at its hard budget; resumes from its last checkpoint when the budget is raised"
    assert job.state == S.PREEMPTED and job.reason == reason and job.cost_usd == pytest.approx(0.1)
    assert env.events("j", "state")[-1] == {
        "from": "running",
        "to": "preempted",
        "reason": reason,
        "attempt": 1,
        "budget_hold": True,
    }
    env.running("k")
    env.ev("k", "preempted", {})
    assert env.job("k").state == S.QUEUED


def test_closing_an_attempt_not_started_charges_nothing(env: Env) -> None:
    env.add("j", S.RUNNING, placement=placed())
    with env.db.session() as s:
        assert env.sup._close_attempt(s, env.job("j"), NOW) == {}
    env.add("k", S.RUNNING, attempt=1, attempt_started_at_s=NOW - 10)  # no placement: billed nothing
    with env.db.session() as s:
        assert env.sup._close_attempt(s, env.job("k"), NOW) == {"cost_usd": 0.0, "attempt_started_at_s": None}
    assert env.events("k", "cost") == [
        {"attempt": 1, "device_s": 0.0, "usd": 0.0, "price_usd_per_device_hour": 0.0, "pool": None}
    ]
    assert env.events("j") == [] and env.ledger() == []


def test_cost_events_round_to_the_millisecond_and_the_micro_dollar(env: Env) -> None:
    env.running("j", 3, started=NOW - 1.23456789)
    with env.db.session() as s:
        closing = env.sup._close_attempt(s, env.job("j"), NOW)
    assert closing["cost_usd"] == pytest.approx(3 * 1.23456789 / 1000)
    assert env.events("j", "cost")[0]["device_s"] == 3.704 and env.events("j", "cost")[0]["usd"] == 0.003704


# ---- preemption --------------------------------------------------------------------------------------
def test_a_preemption_notice_is_delivered_with_the_pools_notice_and_recorded(
    env: Env, logged: Logged
) -> None:
    env.pools.put(cpu(notice_s=20.0))
    env.pools.put(cpu("bare", notice_s=None))
    env.running("j", attempt=3)
    env.running("b", placement=placed("bare"))
    env.running("s", state=S.STARTING, placement=placed("gone"))
    assert env.sup.preempt("j").id == "j"
    env.sup.preempt("b", by="spot")
    env.sup.preempt("s", 7, by="budget")
    assert env.ex.preempted == [("j", 20.0), ("b", DEFAULT_NOTICE_S), ("s", 7.0)]
    assert env.events("j", "preemption_notice") == [{"attempt": 3, "notice_s": 20.0, "by": "user"}]
    assert env.events("b", "preemption_notice") == [
        {"attempt": 1, "notice_s": DEFAULT_NOTICE_S, "by": "spot"}
    ]
    assert env.events("s", "preemption_notice") == [{"attempt": 1, "notice_s": 7.0, "by": "budget"}]
    assert events_of(logged, "preemption_notice")[0] == {
        "event": "preemption_notice",
        "job_id": "j",
        "attempt": 3,
        "notice_s": 20.0,
        "by": "user",
        "log_level": "info",
    }
    env.add("np", S.RUNNING)
    env.sup.preempt("np")
    assert env.ex.preempted[-1] == ("np", DEFAULT_NOTICE_S)


def test_only_a_starting_or_running_job_can_be_preempted(env: Env) -> None:
    with pytest.raises(NotFoundError) as nf:
        env.sup.preempt("nope")
    assert (
        nf.value.message == "no job 'nope'" and nf.value.hint == "List your jobs with `trainyard jobs list`."
    )
    env.add("q")
    with pytest.raises(ConflictError) as cf:
        env.sup.preempt("q")
    assert cf.value.message == "job q is queued; only a starting or running job can be preempted"
    assert cf.value.hint == "See `trainyard jobs get ID` for its state."
    assert env.ex.preempted == [] and env.events("q") == []


def test_a_notice_the_executor_cannot_deliver_is_unavailable_and_not_recorded(env: Env) -> None:
    env.running("j")

    def fail(job_id: str, notice_s: float) -> None:
        raise OSError("connection refused")

    env.ex.preempt = fail  # type: ignore[method-assign]
    with pytest.raises(ServiceUnavailableError) as err:
        env.sup.preempt("j")
    assert err.value.message == "the executor could not deliver the notice: connection refused"
    assert isinstance(err.value.__cause__, OSError)

    def refuse(job_id: str, notice_s: float) -> None:
        raise ConflictError("already exiting")

    env.ex.preempt = refuse  # type: ignore[method-assign]
    with pytest.raises(ConflictError, match="already exiting"):
        env.sup.preempt("j")
    assert env.events("j") == []


def test_spot_capacity_is_reclaimed_at_each_pools_rate_on_the_seeded_clock(env: Env, logged: Logged) -> None:
    env.pools.put(cpu("spot", market="spot", interruption_rate_per_hour=0.5))  # one reclaim in two hours
    env.pools.put(cpu("calm", market="spot", interruption_rate_per_hour=0.0))
    env.pools.put(cpu("od", interruption_rate_per_hour=50.0))
    for jid in ("s3", "s1", "s2", "s4"):
        env.running(jid, placement=placed("spot", market="spot"))
    env.running("c", placement=placed("calm", market="spot"))
    env.running("o", placement=placed("od"))
    env.running("a-starting", state=S.STARTING, placement=placed("spot", market="spot"))  # not running
    env.running("a-done", state=S.SUCCEEDED, placement=placed("spot", market="spot"))
    env.add("q", S.RUNNING)  # running without a placement
    assert env.sup.spot_interruptions() == 0  # the first call starts the clock
    assert env.sup.spot_interruptions() == 0  # no time passed
    env.clock.now += 7200.0 * math.log(2)  # rate x dt = ln 2: each job is hit with probability 1/2
    rng = random.Random(0)
    want = [j for j in ("s1", "s2", "s3", "s4") if rng.random() < 0.5]
    assert 0 < len(want) < 4
    assert env.sup.spot_interruptions() == len(want)
    assert [j for j, _ in env.ex.preempted] == want
    assert all(env.events(j, "preemption_notice")[0]["by"] == "spot" for j in want)
    env.clock.now -= 5  # a clock that went back reclaims nothing
    assert env.sup.spot_interruptions() == 0


def test_a_spot_reclaims_probability_is_one_less_exp_of_the_hourly_rate_times_the_hours(env: Env) -> None:
    u = random.Random(0).random()  # the seeded first draw: a reclaim needs 1 - exp(-rate x dt) above it
    env.pools.put(cpu("spot", market="spot", interruption_rate_per_hour=1.0))
    env.running("s", placement=placed("spot", market="spot"))
    env.sup.spot_interruptions()
    env.clock.now += 3600.0 * -math.log(1.0 - u) * (1.0 - 1e-6)  # just short of the draw: no reclaim
    assert env.sup.spot_interruptions() == 0
    env.sup._spot_rng = random.Random(0)
    env.clock.now += 3600.0 * -math.log(1.0 - u) * (1.0 + 1e-6)  # just past it: reclaimed
    assert env.sup.spot_interruptions() == 1 and env.ex.preempted == [("s", DEFAULT_NOTICE_S)]


def test_a_spot_reclaim_whose_probability_rounds_to_zero_never_happens_even_on_a_zero_draw(env: Env) -> None:
    class Zero:
        def random(self) -> float:
            return 0.0

    env.pools.put(cpu("spot", market="spot", interruption_rate_per_hour=1e-15))
    env.running("s", placement=placed("spot", market="spot"))
    env.sup._spot_rng = Zero()  # type: ignore[assignment]
    env.sup.spot_interruptions()
    env.clock.now += 1.0
    assert 1.0 - math.exp(-1e-15 / 3600.0) == 0.0
    assert env.sup.spot_interruptions() == 0 and env.ex.preempted == []


def test_spot_reclaims_reach_running_jobs_past_the_fiftieth(env: Env) -> None:
    env.pools.put(cpu("spot", market="spot", interruption_rate_per_hour=1000.0))
    env.running("old", placement=placed("spot", market="spot"))  # the oldest of 51 running jobs
    add_many(env, "r", 50, S.RUNNING)
    env.sup.spot_interruptions()
    env.clock.now += 3600.0  # exp(-1000) rounds to 0: a sure reclaim
    assert env.sup.spot_interruptions() == 1 and env.ex.preempted == [("old", DEFAULT_NOTICE_S)]


def test_spot_reclaims_that_cannot_be_delivered_are_logged(env: Env, logged: Logged) -> None:
    env.pools.put(cpu("spot", market="spot", interruption_rate_per_hour=1e3))
    env.running("s", placement=placed("spot", market="spot"))
    env.sup.spot_interruptions()

    def refuse(job_id: str, notice_s: float) -> None:
        raise ConflictError("gone")

    env.ex.preempt = refuse  # type: ignore[method-assign]
    env.clock.now += 3600
    assert env.sup.spot_interruptions() == 0
    assert events_of(logged, "spot_preempt_failed") == [
        {"event": "spot_preempt_failed", "job_id": "s", "error": "gone", "log_level": "warning"}
    ]
    env.pools.delete("spot")
    env.clock.now += 3600
    assert env.sup.spot_interruptions() == 0


def test_work_at_a_hard_budget_is_held_and_given_a_notice(env: Env, logged: Logged) -> None:
    assert env.sup.enforce_budgets() == 0
    gov = Governance()
    env.sup.governance = gov
    env.running("a")
    env.running("b")
    env.running("c")
    gov.over = [("a", "bud1"), ("b", "bud2"), ("gone", "bud1"), ("c", "bud1")]
    gov.refuse = {"b"}
    assert env.sup.enforce_budgets() == 2
    assert gov.asked == [DEFAULT_NOTICE_S, ("a", "bud1"), ("b", "bud2"), ("gone", "bud1"), ("c", "bud1")]
    assert env.ex.preempted == [("a", DEFAULT_NOTICE_S), ("c", DEFAULT_NOTICE_S)]
    assert env.events("a", "preemption_notice")[0]["by"] == "budget"
    assert events_of(logged, "budget_stop_failed") == [
        {"event": "budget_stop_failed", "job_id": "gone", "error": "no job 'gone'", "log_level": "warning"}
    ]


# ---- cancellation and reconciliation -----------------------------------------------------------------
def test_cancelled_work_is_stopped_and_charged_once(env: Env, logged: Logged) -> None:
    archived: list[tuple[str, int]] = []

    class Logs:
        def archive(self, job: Job, attempt: int) -> None:
            archived.append((job.id, attempt))

    env.sup.worker_logs = Logs()
    env.running("c", 2, state=S.CANCELLED, attempt=2, started=NOW - 10)
    env.add("never", S.CANCELLED)
    env.running("r")
    assert env.sup.sweep_cancelled() == 1
    assert env.ex.cancelled == ["c"] and archived == [("c", 2)]
    job = env.job("c")
    assert job.attempt_started_at_s is None and job.cost_usd == pytest.approx(0.02)
    assert env.events("c", "cost")[0]["device_s"] == 20.0
    assert env.sup.sweep_cancelled() == 0 and env.ex.cancelled == ["c"]

    def fail(job_id: str) -> None:
        raise RuntimeError("cluster gone" + "!" * 600)

    env.ex.cancel = fail  # type: ignore[method-assign]
    env.running("d", state=S.CANCELLED, started=NOW - 5)
    assert env.sup.sweep_cancelled() == 1
    assert env.job("d").cost_usd == pytest.approx(0.005)
    (rec,) = events_of(logged, "cancel_failed")
    assert rec == {
        "event": "cancel_failed",
        "job_id": "d",
        "error": ("cluster gone" + "!" * 600)[:500],
        "log_level": "warning",
    }


def test_an_old_job_cancelled_late_is_stopped_however_many_cancelled_jobs_came_after_it(env: Env) -> None:
    env.running("old", state=S.CANCELLED, started=NOW - 10)  # cancelled while it ran
    add_many(env, "c", 3, S.CANCELLED)  # newer jobs cancelled before they started: nothing to stop
    assert env.sup.sweep_cancelled(limit=2) == 1
    assert env.ex.cancelled == ["old"] and env.job("old").cost_usd == pytest.approx(0.01)


def test_cancelled_work_past_the_sweeps_limit_is_stopped_on_the_next_sweep(env: Env) -> None:
    for jid in ("a", "b", "c"):
        env.running(jid, state=S.CANCELLED, started=NOW - 10)
    assert env.sup.sweep_cancelled(limit=2) == 2 and env.ex.cancelled == ["c", "b"]  # newest first
    assert env.sup.sweep_cancelled(limit=2) == 1 and env.ex.cancelled == ["c", "b", "a"]
    assert env.sup.sweep_cancelled(limit=2) == 0
    assert [env.job(j).cost_usd for j in ("a", "b", "c")] == [pytest.approx(0.01)] * 3


def test_a_cancel_already_charged_meanwhile_is_not_charged_again(env: Env) -> None:
    env.running("d", state=S.CANCELLED, started=NOW - 10)  # swept after c (newest first)
    env.running("c", state=S.CANCELLED, started=NOW - 10)

    def cancel(job_id: str) -> None:
        env.set("c", attempt_started_at_s=None)

    env.ex.cancel = cancel  # type: ignore[method-assign]
    assert env.sup.sweep_cancelled() == 2
    assert env.events("c", "cost") == [] and env.job("c").cost_usd == 0.0
    assert env.job("d").cost_usd == pytest.approx(0.01)


def test_after_a_restart_live_workers_are_adopted(env: Env, logged: Logged) -> None:
    env.ex.adopt_result = True
    workers = [{"rank": 0, "pid": 11, "host": "h"}, {"rank": 1, "pid": 12}, {"pid": 13}]
    env.running("j", attempt=2, workers=workers)
    assert env.sup.reconcile() == {"adopted": 1, "requeued": 0, "cancelled_stopped": 0}
    assert env.ex.adopted == [("j", 2, str(env.runs / "j"))]
    assert env.ex.workers("j") == [WorkerInfo(rank=0, pid=11, host="h"), WorkerInfo(rank=1, pid=12, host="")]
    assert env.events("j", "adopted") == [{"attempt": 2, "workers": workers}]
    assert env.job("j").state == S.RUNNING
    (rec,) = events_of(logged, "reconciled")
    assert rec == {
        "event": "reconciled",
        "adopted": 1,
        "requeued": 0,
        "cancelled_stopped": 0,
        "log_level": "info",
    }


def test_after_a_restart_work_whose_workers_are_gone_is_billed_to_its_last_heartbeat_and_requeued(
    env: Env,
) -> None:
    env.running("j", 2, started=NOW - 100, workers=[{"rank": 0, "pid": 1}], progress={"time_s": NOW - 40})
    env.running("s", state=S.STARTING, started=NOW - 100)  # no workers recorded: nothing to adopt
    env.set("s", updated_at_s=NOW - 70)
    env.add("p", S.PREEMPTED, attempt=1, run_dir=str(env.runs / "p"), workers=[{"rank": 0}])
    env.running("c", state=S.CANCELLED, started=NOW - 10)
    assert env.sup.reconcile() == {"adopted": 0, "requeued": 3, "cancelled_stopped": 0}
    assert env.ex.adopted == [("j", 1, str(env.runs / "j"))]
    assert env.job("j").state == S.QUEUED and env.job("j").cost_usd == pytest.approx(0.12)
    assert env.states("j")[0] == ("running", "preempted", "workers gone after a control-plane restart")
    assert env.job("s").state == S.QUEUED and env.job("s").cost_usd == pytest.approx(0.03)
    assert env.states("p") == [("preempted", "queued", "requeued after a control-plane restart")]
    assert env.ex.cancelled == ["c"] and env.job("c").cost_usd == pytest.approx(0.01)


def test_after_a_restart_active_work_past_the_fiftieth_is_reconciled_too(env: Env) -> None:
    env.running("old", started=NOW - 10, progress={"time_s": NOW})  # the oldest of 51 active jobs
    add_many(env, "p", 50, S.PREEMPTED)
    assert env.sup.reconcile() == {"adopted": 0, "requeued": 51, "cancelled_stopped": 0}
    assert env.job("old").state == S.QUEUED and env.job("old").cost_usd == pytest.approx(0.01)


def test_after_a_restart_work_held_at_its_budget_stays_held(env: Env) -> None:
    gov = Governance()
    gov.held = {"h", "hp"}
    env.sup.governance = gov
    env.running("h", started=NOW - 100, progress={"time_s": NOW - 60})
    env.add("hp", S.PREEMPTED, attempt=1)
    assert env.sup.reconcile() == {"adopted": 0, "requeued": 1, "cancelled_stopped": 0}
    assert env.job("h").state == S.PREEMPTED and env.job("h").reason == "stopped at its hard budget"
    assert env.job("h").cost_usd == pytest.approx(0.04)
    assert env.job("hp").state == S.PREEMPTED and env.events("hp") == []


def test_a_failing_adoption_is_logged_and_the_job_requeued(env: Env, logged: Logged) -> None:
    def fail(*args: Any) -> bool:
        raise RuntimeError("ray down" + "!" * 600)

    env.ex.adopt = fail  # type: ignore[method-assign]
    env.running("j", workers=[{"rank": 0}])
    env.add("nodir", S.RUNNING, attempt=1, workers=[{"rank": 0}])
    assert env.sup.reconcile()["requeued"] == 2
    assert env.job("j").state == S.QUEUED
    assert events_of(logged, "adopt_failed") == [
        {
            "event": "adopt_failed",
            "job_id": "j",
            "error": ("ray down" + "!" * 600)[:500],
            "log_level": "warning",
        }
    ]


def test_reconciling_a_job_that_changed_meanwhile_leaves_it_alone(env: Env) -> None:
    env.ex.adopt_result = True
    env.running("j", workers=[{"rank": 0}])
    real = env.ex.adopt

    def adopt(job_id: str, attempt: int, run_dir: str, workers: list[WorkerInfo]) -> bool:
        env.set(job_id, attempt=attempt + 1)
        return real(job_id, attempt, run_dir, workers)

    env.ex.adopt = adopt  # type: ignore[method-assign]
    assert env.sup.reconcile() == {"adopted": 0, "requeued": 0, "cancelled_stopped": 0}
    assert env.events("j") == []


def test_reconciling_goes_on_past_jobs_adopted_held_or_changed_meanwhile(env: Env) -> None:
    gov = Governance()
    gov.held = {"h1", "h2"}
    env.sup.governance = gov
    env.ex.adopt_result = True
    # reconciled newest first: moved, a1, a2, h1, h2, last
    env.running("last")
    env.running("h2", started=NOW - 10)
    env.running("h1", started=NOW - 10)
    env.running("a2", workers=[{"rank": 0}])
    env.running("a1", workers=[{"rank": 0}])
    env.running("moved", workers=[{"rank": 0}])
    real = env.ex.adopt

    def adopt(job_id: str, attempt: int, run_dir: str, workers: list[WorkerInfo]) -> bool:
        if job_id == "moved":
            env.set("moved", state=S.SUCCEEDED.value)  # finished while it was looked at
        return bool(real(job_id, attempt, run_dir, workers))

    env.ex.adopt = adopt  # type: ignore[method-assign]
    assert env.sup.reconcile() == {"adopted": 2, "requeued": 3, "cancelled_stopped": 0}
    assert env.events("moved") == [] and env.job("moved").state == S.SUCCEEDED
    assert [env.job(j).state for j in ("a1", "a2", "h1", "h2", "last")] == [S.RUNNING] * 2 + [
        S.PREEMPTED
    ] * 2 + [S.QUEUED]


def test_ending_an_attempt_that_moved_on_changes_nothing(env: Env) -> None:
    env.running("j", attempt=2)
    env.sup._end_attempt_with_failure("j", 1, "launch failed: x", "infra")
    env.sup._end_attempt_with_failure("nope", 1, "launch failed: x", "infra")
    assert env.job("j").state == S.RUNNING and env.events("j") == []
