"""GovernanceService on a real SQLite file, called directly (no server): budgets (set, changed, read,
each tenant's own only), what a budget document reports, hard budgets stopping running work and
resuming it when raised, usage and invoices within the caller's tenant, reconciliation for admins only,
and the inference gate. Every number is worked out by hand."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from service_support import Clock, Logged, sqlite_template
from sqlalchemy import Table, insert, select, text, update

from trainyard.errors import InvalidInputError, LedgerMismatchError, NotFoundError, PermissionDeniedError
from trainyard.services import governance as gov_module
from trainyard.services.domain import Job, Placement, Principal
from trainyard.services.governance import (
    GovernanceService,
    InferenceBudgetGate,
    _accrued_usd,
    _rate_usd_per_s,
    parse_tag,
    parse_time,
)
from trainyard.services.jobs import JobService
from trainyard.services.lifecycle import JobState
from trainyard.store.db import Database
from trainyard.store.governance_models import BudgetHoldRow, BudgetRow, GovernanceEventRow
from trainyard.store.models import JobRow, TenantRow
from trainyard.store.repositories import insert_jobs
from trainyard.tenancy import ledger

DEC = 1796083200.0  # 2026-12-01T00:00:00Z
JAN = 1798761600.0  # 2027-01-01T00:00:00Z
FEB = JAN + 31 * 86400.0  # 2027-02-01T00:00:00Z
MID = DEC + 14 * 86400.0  # 2026-12-15T00:00:00Z
TENANTS = cast(Table, TenantRow.__table__)
JOBS = cast(Table, JobRow.__table__)
HOLDS = cast(Table, BudgetHoldRow.__table__)
EVENTS = cast(Table, GovernanceEventRow.__table__)
ADMIN = Principal(tenant_id="t0", tenant_name="root", key_id="k0", admin=True)
ACME = Principal(tenant_id="t1", tenant_name="acme", key_id="k1", admin=False)
BETA = Principal(tenant_id="t2", tenant_name="beta", key_id="k2", admin=False)


@pytest.fixture(autouse=True)
def _statements_built_by_each_test(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger, "_BUILT", {})
    monkeypatch.setattr(ledger, "_BATCH_STATEMENTS", {})


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sqlite_template(
        tmp_path_factory.mktemp("governance") / "template.sqlite",
        [("t0", "root"), ("t1", "acme"), ("t2", "beta")],
    )


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> Logged:
    out = Logged()
    monkeypatch.setattr(gov_module, "log", out)
    return out


class Env:
    def __init__(self, path: Path) -> None:
        self.db = Database(f"sqlite:///{path}")
        self.clock = Clock(MID)
        self.gov = GovernanceService(self.db, self.clock)
        self.jobs = JobService(self.db, clock=self.clock, with_catalog=False)
        self.gov.jobs = self.jobs
        self.n = 0

    def charge(self, usd: float, *, tenant: str = "t1", time_s: float = MID, **kw: Any) -> None:
        self.n += 1
        c = ledger.Charge(
            source_key=f"fact-{self.n}",
            tenant_id=tenant,
            kind=kw.pop("kind", ledger.KIND_TOKENS),
            quantity=kw.pop("quantity", 100.0),
            unit=kw.pop("unit", "tokens"),
            unit_price_usd=kw.pop("unit_price_usd", 0.01),
            usd=usd,
            time_s=time_s,
            **kw,
        )
        with self.db.engine.begin() as conn:
            assert ledger.charge(conn, c)

    def job(
        self,
        job_id: str,
        state: JobState,
        *,
        tenant: str = "t1",
        tags: dict[str, str] | None = None,
        devices: int = 1,
        price: float = 900.0,
        started: float | None = None,
    ) -> Job:
        placement = Placement(pool="p", devices=devices, market="on_demand", accelerator="cpu",
                              price_usd_per_device_hour=price)  # fmt: skip
        job = Job(id=job_id, seq=0, tenant_id=tenant, name=job_id, state=state, spec={"tags": tags or {}},
                  created_at_s=MID, updated_at_s=MID, spec_sha256="d")  # fmt: skip
        with self.db.engine.begin() as conn:
            insert_jobs(conn, [(job, ("state", {}, MID))])
            conn.execute(
                update(JOBS)
                .where(JOBS.c.id == job_id)
                .values(placement=placement.to_dict(), attempt_started_at_s=started)
            )
        return job

    def state(self, job_id: str) -> JobState:
        with self.db.session() as s:
            from trainyard.store.repositories import JobRepo

            j = JobRepo(s).get(job_id)
            assert j is not None
            return j.state

    def holds(self) -> dict[str, str]:
        with self.db.engine.connect() as c:
            return {str(j): str(b) for j, b in c.execute(select(HOLDS.c.job_id, HOLDS.c.budget_id))}

    def gov_events(self, tenant: str = "t1") -> list[tuple[str, dict[str, Any]]]:
        with self.db.engine.connect() as c:
            rows = c.execute(
                select(EVENTS.c.kind, EVENTS.c.data).where(EVENTS.c.tenant_id == tenant).order_by(EVENTS.c.id)
            )
            return [(str(k), dict(d)) for k, d in rows]

    def version(self) -> int:
        with self.db.engine.connect() as c:
            return int(c.execute(text("SELECT version FROM settings_version WHERE id = 1")).scalar_one())


@pytest.fixture
def env(template: Path, tmp_path: Path) -> Iterator[Env]:
    shutil.copy(template, tmp_path / "db.sqlite")
    e = Env(tmp_path / "db.sqlite")
    yield e
    e.db.dispose()


# ---- parsing -----------------------------------------------------------------------------------------------
def test_a_tag_is_key_equals_value_both_trimmed() -> None:
    assert parse_tag(None) == ("", "")
    assert parse_tag("") == ("", "")
    assert parse_tag("team=a") == ("team", "a")
    assert parse_tag(" team = a b ") == ("team", "a b")
    assert parse_tag("k=v=w") == ("k", "v=w")


@pytest.mark.parametrize("tag", ["team", "=a", "team=", " =a", "team= ", "="])
def test_a_tag_without_a_key_or_a_value_is_refused(tag: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        parse_tag(tag)
    assert err.value.message == f"tag {tag!r} is not KEY=VALUE"
    assert err.value.hint == "Name one tag value, e.g. --tag team=support."
    assert err.value.details == {"errors": [{"field": "tag", "message": "expected KEY=VALUE"}]}


def test_a_time_is_a_utc_date_or_an_iso_timestamp() -> None:
    assert parse_time(None, field="from") is None
    assert parse_time("", field="from") is None
    assert parse_time("2026-12-01", field="from") == DEC
    assert parse_time("2026-12-01", field="to", end_of_day=True) == DEC + 86400.0
    assert parse_time("2026-12-01T12:00:00Z", field="from") == DEC + 43200.0
    assert parse_time("2026-12-01T12:00:00Z", field="from", end_of_day=True) == DEC + 43200.0
    assert parse_time("2026-12-01T12:00:00", field="from") == DEC + 43200.0  # no zone: UTC
    assert parse_time("2026-12-01T12:00:00+01:00", field="from") == DEC + 39600.0
    # RFC 3339 §5.6: "T" and "Z" may be lowercase
    assert parse_time("2026-12-01t12:00:00z", field="from") == DEC + 43200.0
    assert parse_time("2026-12-01T12:00:00.5z", field="from") == DEC + 43200.5
    assert parse_time("2026-12-01t12:00:00-01:00", field="from") == DEC + 46800.0


def test_dates_and_naive_timestamps_are_utc_whatever_the_servers_time_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        assert parse_time("2026-12-01", field="from") == DEC
        assert parse_time("2026-12-01", field="to", end_of_day=True) == DEC + 86400.0
        assert parse_time("2026-12-01T12:00:00", field="from") == DEC + 43200.0
        assert parse_time("2026-12-01T12:00:00Z", field="from") == DEC + 43200.0
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize("value", ["2026-13-01", "yesterday", "2026-12-01T25:00"])
def test_a_time_that_is_not_a_date_is_refused_naming_its_field(value: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        parse_time(value, field="to")
    assert err.value.message == f"to {value!r} is not a date"
    assert err.value.hint == "Use YYYY-MM-DD or an ISO-8601 timestamp such as 2026-12-01T00:00:00Z."
    assert err.value.details == {"errors": [{"field": "to", "message": "expected YYYY-MM-DD or ISO-8601"}]}


# ---- budgets -----------------------------------------------------------------------------------------------
def test_a_budget_is_set_reported_and_changed_in_place(env: Env) -> None:
    told: list[str] = []
    env.gov.on_budgets_changed = told.append
    before = env.version()
    doc = env.gov.set_budget("acme", usd=100.0, hard=True)
    assert doc["id"].startswith("bud-") and len(doc["id"]) == 16
    assert doc == {
        "id": doc["id"], "tenant": "acme", "tag": None, "period": "month", "period_key": "2026-12",
        "usd": 100.0, "hard": True, "spent_usd": 0.0, "reserved_usd": 0.0, "remaining_usd": 100.0,
        "used_pct": 0.0,
        "alerted_pct": 0, "held_jobs": [], "created_at": "2026-12-15T00:00:00Z",
        "updated_at": "2026-12-15T00:00:00Z",
    }  # fmt: skip
    assert told == ["t1"] and env.version() == before + 1
    assert env.gov_events()[-1] == (
        "budget_set",
        {"budget_id": doc["id"], "tag": None, "period": "month", "limit_usd": 100.0, "hard": True},
    )
    env.clock.now += 60
    changed = env.gov.set_budget("acme", usd=50, hard=False)
    assert changed["id"] == doc["id"]
    assert (changed["usd"], changed["hard"], changed["updated_at"], changed["created_at"]) == (
        50.0, False, "2026-12-15T00:01:00Z", "2026-12-15T00:00:00Z",
    )  # fmt: skip
    tagged = env.gov.set_budget("acme", usd=10.0, tag="team=a", period="day")
    assert tagged["id"] != doc["id"] and (tagged["tag"], tagged["period"], tagged["period_key"]) == (
        "team=a", "day", "2026-12-15",
    )  # fmt: skip
    assert env.gov.get_budget(ACME, "acme") == changed
    assert env.gov.get_budget(ACME, "acme", tag="team=a", period="day")["id"] == tagged["id"]


@pytest.mark.parametrize("usd", [-0.01, float("nan"), float("inf")])
def test_a_budget_is_a_finite_amount_of_dollars(env: Env, usd: float) -> None:
    with pytest.raises(InvalidInputError) as err:
        env.gov.set_budget("acme", usd=usd)
    assert err.value.message == "usd must be a finite amount of dollars >= 0"
    assert err.value.details == {"errors": [{"field": "usd", "message": "must be >= 0"}]}
    assert env.gov.list_budgets(ADMIN) == []


def test_a_budget_period_is_a_month_or_a_day(env: Env) -> None:
    with pytest.raises(InvalidInputError) as err:
        env.gov.set_budget("acme", usd=1.0, period="week")
    assert err.value.message == "period 'week' is not supported"
    assert err.value.hint == "Use --period month or --period day."
    assert err.value.details == {"errors": [{"field": "period", "message": "month or day"}]}
    soft = env.gov.set_budget("acme", usd=0.0)
    assert (soft["usd"], soft["hard"]) == (0.0, False)  # soft unless asked
    with pytest.raises(NotFoundError) as nf:
        env.gov.set_budget("ghost", usd=1.0)
    assert nf.value.message == "no tenant named 'ghost'"
    assert nf.value.hint == "List tenants with `trainyard tenants list`."


def test_a_budget_document_reports_spent_reserved_remaining_and_use(env: Env) -> None:
    env.charge(30.0)
    env.charge(5.0, tags={"team": "a"})
    env.charge(7.0, tenant="t2")
    env.charge(9.0, time_s=DEC - 1)  # November
    env.charge(0.0)
    doc = env.gov.set_budget("acme", usd=40.0, hard=True)
    assert (doc["spent_usd"], doc["used_pct"], doc["remaining_usd"], doc["alerted_pct"]) == (
        35.0,
        87.5,
        5.0,
        80,
    )
    assert [k for k, _ in env.gov_events()] == ["budget_alert", "budget_alert", "budget_set"]
    assert [
        (d["threshold_pct"], d["tenant"], d["spent_usd"]) for k, d in env.gov_events() if k == "budget_alert"
    ] == [
        (50, "acme", 35.0),
        (80, "acme", 35.0),
    ]
    tagged = env.gov.set_budget("acme", usd=4.0, tag="team=a")
    assert (tagged["spent_usd"], tagged["used_pct"], tagged["remaining_usd"]) == (5.0, 125.0, 0.0)
    with env.db.engine.begin() as c:  # work admitted against it holds part of what is left
        ledger.reserve(c, tenant_id="t1", tenant_name="acme", job_id="j1", tags={}, amount_usd=2.5,
                       basis="p90", now_s=MID)  # fmt: skip
    doc = env.gov.budget_document(doc["id"])
    assert (doc["spent_usd"], doc["reserved_usd"], doc["remaining_usd"]) == (35.0, 2.5, 2.5)
    zero = env.gov.set_budget("beta", usd=0.0)
    assert (zero["used_pct"], zero["remaining_usd"]) == (100.0, 0.0)
    nothing = env.gov.set_budget("root", usd=0.0)
    assert nothing["used_pct"] == 0.0
    with pytest.raises(NotFoundError) as err:
        env.gov.budget_document("bud-none")
    assert err.value.message == "no budget 'bud-none'"


def test_a_budget_document_to_the_micro_dollar_and_at_small_limits(env: Env) -> None:
    doc = env.gov.set_budget("acme", usd=10.5, hard=True)
    with env.db.engine.begin() as c:
        ledger.reserve(c, tenant_id="t1", tenant_name="acme", job_id="j1", tags={}, amount_usd=1.23456789,
                       basis="p90", now_s=MID)  # fmt: skip
    env.charge(7.12345678)
    got = env.gov.budget_document(doc["id"])
    assert (got["spent_usd"], got["reserved_usd"], got["remaining_usd"], got["used_pct"]) == (
        7.123457, 1.234568, 2.141975, 67.84,
    )  # fmt: skip
    half = env.gov.set_budget("beta", usd=0.5)
    env.charge(0.1, tenant="t2")
    assert env.gov.budget_document(half["id"])["used_pct"] == 20.0
    env.gov.set_budget("root", usd=0.0)
    env.charge(0.5, tenant="t0")
    assert env.gov.get_budget(ADMIN, "root")["used_pct"] == 100.0
    with env.db.engine.begin() as c:  # a budget whose tenant row is gone is named by its tenant id
        c.execute(
            insert(cast(Table, BudgetRow.__table__)),
            {"id": "bud-orphan", "tenant_id": "tn-gone", "tag_key": "", "tag_value": "", "period": "month",
             "limit_usd": 1.0, "hard": False, "created_at_s": MID, "updated_at_s": MID},
        )  # fmt: skip
    assert env.gov.budget_document("bud-orphan")["tenant"] == "tn-gone"


def test_a_budget_read_in_a_new_period_counts_that_periods_ledger(env: Env) -> None:
    doc = env.gov.set_budget("acme", usd=100.0, tag="team=a")  # its December period is written now
    other = env.gov.set_budget("acme", usd=100.0)
    env.clock.now = JAN + 3600
    env.charge(4.0, time_s=JAN + 60, tags={"team": "a"})  # January's first charge, its period not yet read
    env.charge(2.0, time_s=JAN + 61, tags={"team": "b"})
    env.charge(-1.0, time_s=JAN + 62, tags={"team": "a"})  # a refund is not spending
    env.charge(8.0, time_s=MID, tags={"team": "a"})  # December
    env.charge(1.5, time_s=JAN + 63, tenant="t2", tags={"team": "a"})
    env.charge(0.25, time_s=JAN, tags={"team": "a"})  # the period's first instant
    env.charge(0.5, time_s=JAN + 64, tags={"team": "a"})
    env.charge(16.0, time_s=FEB, tags={"team": "a"})  # the next period's first instant
    with env.db.engine.begin() as c:  # as before its January period was first written (the other's was)
        c.execute(
            text("DELETE FROM budget_periods WHERE budget_id = :b AND period_key = '2027-01'"),
            {"b": doc["id"]},
        )
    fresh = env.gov.budget_document(doc["id"])
    assert (fresh["period_key"], fresh["spent_usd"], fresh["used_pct"]) == ("2027-01", 4.75, 4.75)
    assert env.gov.budget_document(other["id"])["spent_usd"] == 6.75


def test_each_tenant_reads_only_its_own_budgets(env: Env) -> None:
    a = env.gov.set_budget("acme", usd=1.0)
    a2 = env.gov.set_budget("acme", usd=2.0, tag="team=x")
    b = env.gov.set_budget("beta", usd=3.0)
    assert [d["id"] for d in env.gov.list_budgets(ACME)] == [a["id"], a2["id"]]
    assert [d["id"] for d in env.gov.list_budgets(ACME, "acme")] == [a["id"], a2["id"]]
    assert [d["id"] for d in env.gov.list_budgets(ADMIN)] == [a["id"], a2["id"], b["id"]]
    assert [d["id"] for d in env.gov.list_budgets(ADMIN, "beta")] == [b["id"]]
    b1 = env.gov.set_budget("beta", usd=1.0, tag="b=1")
    b0 = env.gov.set_budget("beta", usd=1.0, tag="b=0")
    a2b = env.gov.set_budget("beta", usd=1.0, tag="a=2")
    day = env.gov.set_budget("beta", usd=1.0, period="day")
    ordered = [d["id"] for d in env.gov.list_budgets(BETA)]  # by tag key, tag value, then period
    assert ordered == [day["id"], b["id"], a2b["id"], b0["id"], b1["id"]]
    same_value = env.gov.set_budget("acme", usd=4.0, tag="env=x")  # the value of team=x, another key
    assert env.gov.get_budget(ACME, "acme", tag="env=x")["id"] == same_value["id"]
    assert env.gov.get_budget(ACME, "acme", tag="team=x")["id"] == a2["id"]
    every = [a["id"], a2["id"], b["id"], b1["id"], b0["id"], a2b["id"], day["id"], same_value["id"]]
    assert [d["id"] for d in env.gov.all_budgets()] == sorted(every)
    assert len(env.gov.all_budgets(limit=2)) == 2

    for call in (
        lambda: env.gov.list_budgets(ACME, "beta"),
        lambda: env.gov.get_budget(ACME, "beta"),
        lambda: env.gov.events(ACME, "beta"),
        lambda: env.gov.usage(ACME, tenant_name="beta"),
        lambda: env.gov.invoice(ACME, "beta"),
    ):
        with pytest.raises(NotFoundError) as err:
            call()
        assert err.value.message == "no tenant named 'beta'"
    assert env.gov.get_budget(ADMIN, "beta")["id"] == b["id"]
    with pytest.raises(NotFoundError) as missing:
        env.gov.get_budget(ACME, "acme", tag="team=y")
    assert missing.value.message == "tenant 'acme' tag team=y has no month budget"
    assert missing.value.hint == "Set one with `trainyard budgets set acme --usd N`."
    with pytest.raises(NotFoundError) as no_day:
        env.gov.get_budget(ACME, "acme", period="day")
    assert no_day.value.message == "tenant 'acme' has no day budget"
    with pytest.raises(NotFoundError):
        env.gov.list_budgets(ADMIN, "ghost")


def test_every_budget_is_listed_for_the_metrics_in_id_order_at_most_1000(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    with env.db.engine.begin() as c:  # ids inserted in descending order
        c.execute(
            insert(cast(Table, BudgetRow.__table__)),
            [
                {"id": f"bud-{i:04d}", "tenant_id": "t1", "tag_key": "n", "tag_value": str(i),
                 "period": "month", "limit_usd": 1.0, "hard": False, "created_at_s": MID, "updated_at_s": MID}
                for i in reversed(range(1001))
            ],
        )  # fmt: skip
    monkeypatch.setattr(env.gov, "budget_document", lambda budget_id: {"id": budget_id})
    listed = [d["id"] for d in env.gov.all_budgets()]
    assert listed == [f"bud-{i:04d}" for i in range(1000)]
    assert [d["id"] for d in env.gov.all_budgets(limit=2)] == ["bud-0000", "bud-0001"]


def test_governance_events_are_the_tenants_own_oldest_first_the_last_1000(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.gov.set_budget("acme", usd=1.0)
    env.clock.now += 1
    env.gov.set_budget("acme", usd=2.0)
    env.gov.set_budget("beta", usd=3.0)
    events = env.gov.events(ACME)
    assert [(e["kind"], e["data"]["limit_usd"], e["time"]) for e in events] == [
        ("budget_set", 1.0, "2026-12-15T00:00:00Z"),
        ("budget_set", 2.0, "2026-12-15T00:00:01Z"),
    ]
    assert events[0]["id"] < events[1]["id"]
    assert env.gov.events(ADMIN, "acme") == events
    assert [e["data"]["limit_usd"] for e in env.gov.events(BETA)] == [3.0]
    monkeypatch.setattr(gov_module, "MAX_EVENTS", 1)
    assert [e["data"]["limit_usd"] for e in env.gov.events(ACME)] == [2.0]


# ---- hard limits on running work ---------------------------------------------------------------------------
def test_running_work_stops_when_spent_accrued_and_notice_reach_a_hard_budget(env: Env) -> None:
    env.charge(5.0)
    bid = env.gov.set_budget("acme", usd=10.0, hard=True)["id"]
    # 1 device at $900/device-hour: $0.25 a second; started 16 s ago: $4 accrued
    env.job("j1", JobState.RUNNING, started=MID - 16)
    env.job("j2", JobState.STARTING, started=None)  # nothing accrued yet
    env.job("j3", JobState.QUEUED, started=MID - 99999)  # not running
    env.job("j4", JobState.RUNNING, tenant="t2", started=MID - 99999)  # another tenant
    # 5 + 4 + notice (2 jobs x $0.25 x 2 s = $1) = 10: at the limit
    assert env.gov.over_budget_running(2.0) == [("j1", bid), ("j2", bid)]
    assert env.gov.over_budget_running(1.5) == []
    env.gov.hold("j1", bid)
    assert env.gov.over_budget_running(20.0) == [("j2", bid)]  # a held job is already stopping
    assert env.gov.over_budget_running(19.0) == []


def test_every_hard_budget_stops_the_running_work_it_covers(env: Env) -> None:
    idle = env.gov.set_budget("acme", usd=1.0, hard=True, tag="team=z")["id"]  # nothing of it runs
    team = env.gov.set_budget("acme", usd=1.0, hard=True, tag="team=a")["id"]
    whole = env.gov.set_budget("acme", usd=1.0, hard=True)["id"]
    env.job("a", JobState.RUNNING, tags={"team": "a"}, started=MID - 1000)
    env.job("b", JobState.RUNNING, tags={"team": "b"}, started=MID - 1000)
    assert sorted(env.gov.over_budget_running(0.0)) == sorted([("a", team), ("a", whole), ("b", whole)])
    assert idle not in {b for _, b in env.gov.over_budget_running(0.0)}


def test_more_than_50_running_jobs_are_all_stopped(env: Env) -> None:
    bid = env.gov.set_budget("acme", usd=1.0, hard=True)["id"]
    for i in range(51):
        env.job(f"j{i:02d}", JobState.RUNNING, started=MID - 1000)
    assert len(env.gov.over_budget_running(0.0)) == 51
    assert {b for _, b in env.gov.over_budget_running(0.0)} == {bid}


def test_a_pass_reads_the_oldest_running_jobs_up_to_its_bound(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gov_module, "MAX_RUNNING_SCANNED", 2)
    bid = env.gov.set_budget("acme", usd=1.0, hard=True)["id"]
    for job_id in ("j0", "j1", "j2"):
        env.job(job_id, JobState.RUNNING, started=MID - 1000)
    assert env.gov.over_budget_running(0.0) == [("j0", bid), ("j1", bid)]
    with env.db.engine.begin() as c:  # the oldest has stopped: the next pass reaches the newest
        c.execute(update(JOBS).where(JOBS.c.id == "j0").values(state=JobState.SUCCEEDED.value))
    assert env.gov.over_budget_running(0.0) == [("j1", bid), ("j2", bid)]


def test_no_hard_budget_stops_nothing(env: Env) -> None:
    env.charge(50.0)
    env.gov.set_budget("acme", usd=10.0, hard=False)
    env.job("j1", JobState.RUNNING, started=MID - 2000)
    assert env.gov.over_budget_running(0.0) == []


def test_a_tagged_hard_budget_stops_only_the_work_with_its_tag(env: Env) -> None:
    bid = env.gov.set_budget("acme", usd=1.0, hard=True, tag="team=a")["id"]
    env.job("a", JobState.RUNNING, tags={"team": "a"}, started=MID - 1000)
    env.job("b", JobState.RUNNING, tags={"team": "b"}, started=MID - 1000)
    assert env.gov.over_budget_running(0.0) == [("a", bid)]


def test_the_rate_and_the_accrued_cost_of_a_job() -> None:
    base = Job(id="j", seq=1, tenant_id="t1", name="j", state=JobState.RUNNING, spec={}, created_at_s=0.0,
               updated_at_s=0.0)  # fmt: skip
    assert _rate_usd_per_s(base) == 0.0
    at_9 = Placement(pool="p", devices=4, market="spot", accelerator="cpu", price_usd_per_device_hour=9.0)
    placed = replace(base, placement=at_9)
    assert _rate_usd_per_s(placed) == pytest.approx(0.01)
    assert _accrued_usd(placed, 100.0) == 0.0  # not started
    started = replace(placed, attempt_started_at_s=40.0)
    assert _accrued_usd(started, 100.0) == pytest.approx(0.6)
    assert _accrued_usd(started, 10.0) == 0.0  # a clock behind the start accrues nothing


def test_exhausted_hard_budgets_are_those_spent_and_reserved_to_the_limit(env: Env) -> None:
    env.charge(6.0)
    full = env.gov.set_budget("acme", usd=10.0, hard=True, tag="team=a")
    whole = env.gov.set_budget("acme", usd=10.0, hard=True)
    env.gov.set_budget("acme", usd=1.0, hard=False, tag="team=b")
    env.charge(2.0, tags={"team": "b"})  # past the soft budget: that refuses nothing
    assert env.gov.exhausted_hard_budgets("t1") == []
    with env.db.engine.begin() as c:
        ledger.reserve(c, tenant_id="t1", tenant_name="acme", job_id="j1", tags={"team": "a"}, amount_usd=2.0,
                       basis="p90", now_s=MID)  # fmt: skip
    assert env.gov.exhausted_hard_budgets("t1") == [
        {"id": whole["id"], "tag_key": "", "tag_value": "", "period": "month", "usd": 10.0, "spent_usd": 8.0,
         "reserved_usd": 2.0},
    ]  # fmt: skip
    with env.db.engine.begin() as c:
        ledger.release(c, ["j1"])
        ledger.reserve(c, tenant_id="t1", tenant_name="acme", job_id="j2", tags={"team": "a"}, amount_usd=1.5,
                       basis="p90", now_s=MID)  # fmt: skip
    assert env.gov.exhausted_hard_budgets("t1") == []  # 8 + 1.5 of 10
    assert env.gov.exhausted_hard_budgets("t2") == []
    assert full["spent_usd"] == 0.0


def test_an_exhausted_budget_reports_what_it_spent_and_holds_to_the_micro_dollar(env: Env) -> None:
    whole = env.gov.set_budget("acme", usd=10.0, hard=True)
    with env.db.engine.begin() as c:
        ledger.reserve(c, tenant_id="t1", tenant_name="acme", job_id="j1", tags={}, amount_usd=3.12345678,
                       basis="p90", now_s=MID)  # fmt: skip
    env.charge(7.12345678)  # charges are not refused: 10.25 of 10 spent or held
    assert env.gov.exhausted_hard_budgets("t1") == [
        {"id": whole["id"], "tag_key": "", "tag_value": "", "period": "month", "usd": 10.0,
         "spent_usd": 7.123457, "reserved_usd": 3.123457},
    ]  # fmt: skip


def test_a_budget_spent_short_of_its_limit_with_nothing_held_is_not_exhausted(env: Env) -> None:
    whole = env.gov.set_budget("acme", usd=10.0, hard=True)
    env.charge(9.5)
    assert env.gov.exhausted_hard_budgets("t1") == []
    env.charge(0.5)
    assert env.gov.exhausted_hard_budgets("t1") == [
        {"id": whole["id"], "tag_key": "", "tag_value": "", "period": "month", "usd": 10.0,
         "spent_usd": 10.0, "reserved_usd": 0.0},
    ]  # fmt: skip


def test_a_stop_is_recorded_once_and_a_raised_budget_requeues_the_stopped_work(
    env: Env, logged: Logged
) -> None:
    bid = env.gov.set_budget("acme", usd=1.0, hard=True)["id"]
    env.charge(1.0)
    env.job("j1", JobState.PREEMPTED)
    env.job("j2", JobState.SUCCEEDED)  # held first: it has finished meanwhile, and is only let go
    env.job("j3", JobState.PREEMPTED)
    other = env.gov.set_budget("acme", usd=0.5, hard=True, tag="team=z")["id"]
    assert env.gov.hold("j2", bid) is True
    assert env.gov.hold("j1", bid) is True
    assert env.gov.hold("j1", bid) is False
    assert env.gov.hold("j3", other) is True
    assert [k for k, _ in env.gov_events()].count("budget_stop") == 3  # the second hold of j1 says nothing
    assert env.gov_events()[-3:-1] == [
        ("budget_stop", {"job_id": "j2", "budget_id": bid}),
        ("budget_stop", {"job_id": "j1", "budget_id": bid}),
    ]
    with env.db.session() as s:
        assert GovernanceService.is_held(s, "j1") and not GovernanceService.is_held(s, "j4")
    assert env.gov.budget_document(bid)["held_jobs"] == ["j1", "j2"]
    assert env.gov.release_holds(bid) == []  # still spent to its limit
    assert set(env.holds()) == {"j1", "j2", "j3"}
    env.clock.now += 5
    logged.take()
    doc = env.gov.set_budget("acme", usd=2.0, hard=True)
    logs = logged.take()
    assert env.state("j1") == JobState.QUEUED and env.state("j2") == JobState.SUCCEEDED
    assert env.holds() == {"j3": other} and doc["held_jobs"] == []  # another budget's stop stays
    assert ("budget_resume", {"job_id": "j1", "budget_id": bid}) in env.gov_events()
    assert [e for e in logs if e["event"] == "budget_holds_released"] == [
        {"event": "budget_holds_released", "budget_id": bid, "jobs": ["j1"], "log_level": "info"}
    ]
    _, events = env.jobs.get_with_events(ACME, "j1")
    assert events[-1].data == {
        "from": "preempted", "to": "queued",
        "reason": "budget raised: back in the queue, resumes from its last checkpoint",
    }  # fmt: skip
    assert events[-1].time_s == MID + 5


def test_a_soft_budget_releases_its_holds_whatever_it_spent(env: Env) -> None:
    bid = env.gov.set_budget("acme", usd=1.0, hard=True)["id"]
    env.charge(5.0)
    env.job("j1", JobState.PREEMPTED)
    env.gov.hold("j1", bid)
    env.gov.set_budget("acme", usd=1.0, hard=False)
    assert env.state("j1") == JobState.QUEUED


def test_holds_are_kept_without_a_job_service_or_a_budget(env: Env) -> None:
    bid = env.gov.set_budget("acme", usd=5.0, hard=True)["id"]
    env.job("j1", JobState.PREEMPTED)
    env.gov.hold("j1", bid)
    assert env.gov.release_holds("bud-none") == []
    assert GovernanceService(env.db, env.clock).release_holds(bid) == []  # not wired to the jobs yet
    env.gov.jobs = None
    assert env.gov.release_holds(bid) == []
    assert env.holds() == {"j1": bid}
    env.gov.jobs = env.jobs
    assert env.gov.release_holds(bid) == ["j1"]


# ---- usage, invoices, reconciliation -----------------------------------------------------------------------
def test_usage_is_grouped_within_the_callers_tenant_and_dates(env: Env) -> None:
    env.charge(1.0, tags={"team": "a"})
    env.charge(2.0, time_s=DEC + 86400 * 2, tags={"team": "b"})
    env.charge(4.0, tenant="t2")
    env.charge(8.0, time_s=JAN)
    env.charge(16.0, time_s=DEC - 1, tags={"team": "a"})  # November
    mine = env.gov.usage(ACME)
    assert (mine["by"], mine["from"], mine["to"], mine["total_usd"]) == ("tenant", None, None, 27.0)
    assert [(r["group"], r["usd"]) for r in mine["rows"]] == [("acme", 27.0)]
    everyone = env.gov.usage(ADMIN)
    assert [(r["group"], r["usd"]) for r in everyone["rows"]] == [("acme", 27.0), ("beta", 4.0)]
    assert env.gov.usage(ADMIN, tenant_name="beta")["total_usd"] == 4.0
    december = env.gov.usage(ACME, by="tag:team", from_="2026-12-01", to="2026-12-31")
    assert (december["from"], december["to"]) == ("2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z")
    assert [(r["group"], r["usd"]) for r in december["rows"]] == [("b", 2.0), ("a", 1.0)]
    assert december["total_usd"] == 3.0
    one_day = env.gov.usage(ACME, by="day", from_="2026-12-03", to="2026-12-03")
    assert [(r["group"], r["usd"]) for r in one_day["rows"]] == [("2026-12-03", 2.0)]
    with pytest.raises(InvalidInputError):
        env.gov.usage(ACME, by="colour")
    with pytest.raises(InvalidInputError) as err:
        env.gov.usage(ACME, from_="soon")
    assert err.value.details == {"errors": [{"field": "from", "message": "expected YYYY-MM-DD or ISO-8601"}]}
    with pytest.raises(InvalidInputError) as err_to:
        env.gov.usage(ACME, to="later")
    assert err_to.value.details["errors"][0]["field"] == "to"


def test_a_usage_total_is_the_sum_of_its_rows_to_the_micro_dollar(env: Env) -> None:
    env.charge(0.1, tags={"team": "a"})
    env.charge(0.2, tags={"team": "b"})
    usage = env.gov.usage(ACME, by="tag:team")
    assert [(r["group"], r["usd"]) for r in usage["rows"]] == [("b", 0.2), ("a", 0.1)]
    assert usage["total_usd"] == 0.3  # 0.1 + 0.2 is 0.30000000000000004 in floating point


def test_an_invoice_is_a_months_lines_tags_and_totals(env: Env) -> None:
    env.charge(1.0049, tags={"team": "a"}, quantity=100.49, unit_price_usd=0.01)
    env.charge(2.0, tags={"team": "b", "env": "prod"}, quantity=200.0, unit_price_usd=0.01)
    env.charge(
        0.5, tags={"team": "a"}, kind=ledger.KIND_REQUESTS, quantity=5.0, unit="requests", unit_price_usd=0.1
    )
    env.charge(9.0, time_s=JAN)
    env.charge(3.0, tenant="t2")
    inv = env.gov.invoice(ACME)
    assert (inv["tenant"], inv["month"], inv["from"], inv["to"]) == (
        "acme", "2026-12", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z",
    )  # fmt: skip
    assert (inv["total_usd"], inv["total_usd_exact"]) == (3.5, 3.5049)
    assert inv["by_tag"] == {"team": {"a": 1.5049, "b": 2.0}, "env": {"prod": 2.0}}
    assert [(line["kind"], line["quantity"], line["usd"]) for line in inv["lines"]] == [
        (ledger.KIND_REQUESTS, 5.0, 0.5),
        (ledger.KIND_TOKENS, 300.49, 3.0049),
    ]
    assert env.gov.invoice(ACME, month="2027-01")["total_usd"] == 9.0
    env.charge(0.12345678, time_s=FEB, tags={"env": "dev"})
    february = env.gov.invoice(ACME, month="2027-02")
    assert (february["by_tag"], february["total_usd"], february["total_usd_exact"]) == (
        {"env": {"dev": 0.123457}},
        0.12,
        0.123457,
    )
    assert env.gov.invoice(ADMIN, "beta")["total_usd"] == 3.0
    with pytest.raises(InvalidInputError) as err:
        env.gov.invoice(ACME, month="December")
    assert err.value.message == "month 'December' is not YYYY-MM"
    assert err.value.details == {"errors": [{"field": "month", "message": "expected YYYY-MM"}]}


def test_only_an_admin_reconciles_and_a_disagreement_fails_loudly(env: Env) -> None:
    with pytest.raises(PermissionDeniedError) as err:
        env.gov.reconcile(ACME)
    assert err.value.message == "reconciling the ledger needs an admin key"
    assert env.gov.reconcile(ADMIN) == {"jobs_checked": 0, "budgets_checked": 0, "mismatches": []}
    env.job("j1", JobState.SUCCEEDED)
    with env.db.engine.begin() as c:
        c.execute(update(JOBS).where(JOBS.c.id == "j1").values(cost_usd=1.0))
    with pytest.raises(LedgerMismatchError):
        env.gov.reconcile(ADMIN)


# ---- the inference gate ------------------------------------------------------------------------------------
def test_the_inference_gate_refuses_under_an_exhausted_hard_budget_that_applies(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [100.0]
    monkeypatch.setattr(gov_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    gate = InferenceBudgetGate(env.gov, ttl_s=1.0)
    tagged = env.gov.set_budget("acme", usd=1.0, hard=True, tag="team=a")
    env.charge(1.0, tags={"team": "a"})
    hit = asyncio.run(gate.refusal("t1", {"team": "a"}))
    assert hit is not None and hit["id"] == tagged["id"]
    assert asyncio.run(gate.refusal("t1", {"team": "b"})) is None
    assert asyncio.run(gate.refusal("t1", {})) is None
    assert asyncio.run(gate.refusal("t2", {"team": "a"})) is None
    whole = env.gov.set_budget("acme", usd=0.5, hard=True)
    now[0] = 101.0  # within the TTL: the budgets read at 100 s
    assert asyncio.run(gate.refusal("t1", {"team": "b"})) is None
    now[0] = 101.01
    assert asyncio.run(gate.refusal("t1", {"team": "b"}))["id"] == whole["id"]  # type: ignore[index]
    env.gov.set_budget("acme", usd=100.0, hard=True)
    env.gov.set_budget("acme", usd=100.0, hard=True, tag="team=a")
    assert asyncio.run(gate.refusal("t1", {"team": "a"})) is not None  # still cached
    gate.forget("t1")
    assert asyncio.run(gate.refusal("t1", {"team": "a"})) is None
    env.gov.set_budget("acme", usd=0.0, hard=True)
    asyncio.run(gate.refusal("t2", {}))
    gate.forget()
    assert asyncio.run(gate.refusal("t1", {})) is not None
    gate.forget("t-never-asked")  # forgetting a tenant it never read is no error


def test_the_inference_gate_reads_budgets_once_a_second_and_bounds_its_cache(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [100.0]
    monkeypatch.setattr(gov_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    gate = InferenceBudgetGate(env.gov)
    assert asyncio.run(gate.refusal("t1", {})) is None
    env.gov.set_budget("acme", usd=0.0, hard=True)
    now[0] = 101.0
    assert asyncio.run(gate.refusal("t1", {})) is None  # read at 100 s, kept for 1 s
    now[0] = 101.5
    assert asyncio.run(gate.refusal("t1", {})) is not None
    cache = gate._cache
    cache.clear()
    cache.update({f"t-{i}": (now[0], []) for i in range(9_999)})
    asyncio.run(gate.refusal("t1", {}))
    assert len(cache) == 10_000
    asyncio.run(gate.refusal("t2", {}))
    assert len(cache) == 10_001  # 10,000 is not more than 10,000
    asyncio.run(gate.refusal("t0", {}))
    assert len(cache) == 1 and "t0" in cache
