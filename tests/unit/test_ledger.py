"""The usage ledger on a real SQLite database: budgets and the jobs they apply to, reservations at
admission (and their refusal, with its exact numbers), charges settled against reservations and budget
periods, alerts at 50/80/100 %, usage and invoice reports, and reconciliation. Every number is worked
out by hand in the test."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from sqlalchemy import Connection, Table, func, insert, select, update

from trainyard.errors import BudgetExceededError, InvalidInputError, LedgerMismatchError
from trainyard.services.domain import Job
from trainyard.services.lifecycle import JobState
from trainyard.store.db import Database
from trainyard.store.governance_models import (
    BudgetPeriodRow,
    BudgetReservationRow,
    BudgetRow,
    GovernanceEventRow,
    LedgerEntryRow,
)
from trainyard.store.models import JobEventRow, JobRow, TenantRow
from trainyard.store.repositories import job_insert_params
from trainyard.tenancy import ledger

DEC = 1796083200.0  # 2026-12-01T00:00:00Z
JAN = 1798761600.0  # 2027-01-01T00:00:00Z
MID = DEC + 14 * 86400.0  # 2026-12-15T00:00:00Z

PERIODS = cast(Table, BudgetPeriodRow.__table__)
RESERVATIONS = cast(Table, BudgetReservationRow.__table__)
EVENTS = cast(Table, GovernanceEventRow.__table__)
LEDGER = cast(Table, LedgerEntryRow.__table__)
BUDGETS = cast(Table, BudgetRow.__table__)
JOBS = cast(Table, JobRow.__table__)


@pytest.fixture(autouse=True)
def _statements_built_by_each_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ledger keeps the statements it builds per process; each test builds its own."""
    monkeypatch.setattr(ledger, "_BUILT", {})
    monkeypatch.setattr(ledger, "_BATCH_STATEMENTS", {})


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ledger") / "template.sqlite"
    db = Database(f"sqlite:///{path}")
    db.upgrade()
    db.dispose()
    return path


@pytest.fixture
def conn(template: Path, tmp_path: Path) -> Iterator[Connection]:
    path = tmp_path / "db.sqlite"
    shutil.copy(template, path)
    db = Database(f"sqlite:///{path}")
    with db.engine.begin() as c:
        c.execute(
            insert(cast(Table, TenantRow.__table__)), [{"id": "t1", "name": "acme", "created_at_s": 0.0}]
        )
        c.execute(
            insert(cast(Table, TenantRow.__table__)), [{"id": "t2", "name": "beta", "created_at_s": 0.0}]
        )
        yield c
    db.dispose()


def _budget(
    conn: Connection,
    id: str,
    limit_usd: float,
    *,
    tenant_id: str = "t1",
    hard: bool = True,
    period: str = "month",
    tag: tuple[str, str] = ("", ""),
) -> ledger.Budget:
    conn.execute(
        insert(BUDGETS),
        {
            "id": id,
            "tenant_id": tenant_id,
            "tag_key": tag[0],
            "tag_value": tag[1],
            "period": period,
            "limit_usd": limit_usd,
            "hard": hard,
            "created_at_s": 1.0,
            "updated_at_s": 2.0,
        },
    )
    return ledger.Budget(id, tenant_id, tag[0], tag[1], period, limit_usd, hard, 1.0, 2.0)


def _fact(key: str, usd: float, time_s: float = MID, **kw: Any) -> ledger.Charge:
    return ledger.Charge(
        source_key=key,
        tenant_id=kw.pop("tenant_id", "t1"),
        kind=kw.pop("kind", ledger.KIND_TOKENS),
        quantity=kw.pop("quantity", 100.0),
        unit=kw.pop("unit", "tokens"),
        unit_price_usd=kw.pop("unit_price_usd", 0.01),
        usd=usd,
        time_s=time_s,
        **kw,
    )


def _periods(conn: Connection) -> dict[tuple[str, str], tuple[float, float, int]]:
    rows = conn.execute(
        select(
            PERIODS.c.budget_id,
            PERIODS.c.period_key,
            PERIODS.c.spent_usd,
            PERIODS.c.reserved_usd,
            PERIODS.c.alerted_pct,
        )
    )
    return {(r[0], r[1]): (r[2], r[3], r[4]) for r in rows}


def _reservations(conn: Connection) -> dict[tuple[str, str], tuple[str, float]]:
    rows = conn.execute(select(RESERVATIONS))
    return {(r.job_id, r.budget_id): (r.period_key, r.remaining_usd) for r in rows}


def _alerts(conn: Connection) -> list[tuple[str, dict[str, Any], float]]:
    rows = conn.execute(select(EVENTS.c.tenant_id, EVENTS.c.data, EVENTS.c.time_s).order_by(EVENTS.c.id))
    return [(r[0], r[1], r[2]) for r in rows]


def _job(conn: Connection, job_id: str, cost_usd: float, tenant_id: str = "t1") -> None:
    job = Job(
        id=job_id,
        seq=0,
        tenant_id=tenant_id,
        name=job_id,
        state=JobState.QUEUED,
        spec={},
        created_at_s=0.0,
        updated_at_s=0.0,
    )
    conn.execute(insert(JOBS), job_insert_params(job))
    conn.execute(update(JOBS).where(JOBS.c.id == job_id).values(cost_usd=cost_usd))


# ---- budgets and what they apply to ---------------------------------------------------------------------
def test_a_tenant_budget_applies_to_every_job_and_a_tag_budget_only_to_its_tag_value() -> None:
    whole = ledger.Budget("b", "t1", "", "", "month", 10.0, True, 0.0, 0.0)
    assert whole.tag is None
    assert whole.applies_to(None) and whole.applies_to({}) and whole.applies_to({"team": "x"})
    team = ledger.Budget("b", "t1", "team", "x", "month", 10.0, True, 0.0, 0.0)
    assert team.tag == "team=x"
    assert team.applies_to({"team": "x", "env": "prod"})
    assert not team.applies_to({"team": "y"})
    assert not team.applies_to({"env": "x"})
    assert not team.applies_to(None) and not team.applies_to({})
    assert ledger.Budget("b", "t1", "n", "1", "day", 1.0, True, 0.0, 0.0).applies_to(
        {"n": 1}
    )  # compared as text
    empty = ledger.Budget("b", "t1", "team", "", "month", 10.0, True, 0.0, 0.0)  # the tag must be present
    assert empty.applies_to({"team": ""}) and not empty.applies_to({})


def test_period_bounds_of_a_month_a_december_and_a_day() -> None:
    assert ledger.period_bounds_s("month", "2026-02") == (1769904000.0, 1772323200.0)  # 28 days
    assert ledger.period_bounds_s("month", "2026-12") == (DEC, JAN)
    assert ledger.period_bounds_s("day", "2026-12-15") == (MID, MID + 86400.0)
    assert ledger.period_key("day", MID + 86399.5) == "2026-12-15"
    assert ledger.period_key("month", JAN - 0.5) == "2026-12"


def test_tenant_budgets_reads_each_field_of_the_tenants_own_budgets(conn: Connection) -> None:
    _budget(conn, "b1", 12.5, hard=False, period="day", tag=("team", "x"))
    _budget(conn, "b9", 3.0, tenant_id="t2")
    conn.execute(update(BUDGETS).where(BUDGETS.c.id == "b1").values(created_at_s=5.0, updated_at_s=7.0))
    assert ledger.tenant_budgets(conn, "t1") == [
        ledger.Budget("b1", "t1", "team", "x", "day", 12.5, False, 5.0, 7.0)
    ]
    assert [b.id for b in ledger.tenant_budgets(conn, "t2")] == ["b9"]
    assert ledger.tenant_budgets(conn, "t3") == []


def test_single_hard_budget_is_the_one_hard_budget_that_applies_and_the_count_of_hard_ones() -> None:
    whole = ledger.Budget("a", "t1", "", "", "month", 10.0, True, 0.0, 0.0)
    team = ledger.Budget("b", "t1", "team", "x", "month", 10.0, True, 0.0, 0.0)
    soft = ledger.Budget("c", "t1", "", "", "day", 10.0, False, 0.0, 0.0)
    assert ledger.single_hard_budget([whole, soft], {}) == (whole, 1)
    assert ledger.single_hard_budget([whole, team, soft], {"team": "y"}) == (whole, 2)
    assert ledger.single_hard_budget([whole, team], {"team": "x"}) is None  # two apply
    assert ledger.single_hard_budget([soft], {}) is None
    assert ledger.single_hard_budget([team, soft], {}) is None


def test_budget_cache_keeps_budgets_per_tenant_and_starts_over_when_full() -> None:
    cache = ledger.BudgetCache(max_tenants=2)
    b = ledger.Budget("a", "t1", "", "", "month", 10.0, True, 0.0, 0.0)
    assert cache.get("t1") is None
    cache.put("t1", [b])
    cache.put("t2", [])
    assert cache.get("t1") == (b,) and cache.get("t2") == ()
    cache.put("t3", [b])  # a third tenant: the cache holds two, so it starts over
    assert cache.get("t1") is None and cache.get("t2") is None and cache.get("t3") == (b,)
    cache.invalidate("t3")
    cache.invalidate("t4")  # not there: no error
    assert cache.get("t3") is None
    cache.put("t1", [b])
    cache.clear()
    assert cache.get("t1") is None
    big = ledger.BudgetCache()
    for i in range(10_000):
        big.put(f"t{i}", [])
    assert big.get("t0") == () and big.get("t9999") == ()
    big.put("t10000", [])
    assert big.get("t0") is None


# ---- reservations at admission --------------------------------------------------------------------------
def test_reserve_holds_the_quote_against_each_hard_budget_that_applies(conn: Connection) -> None:
    _budget(conn, "b2", 100.0)
    _budget(conn, "b1", 10.0, tag=("team", "x"))
    _budget(conn, "b3", 1.0, hard=False, period="day")  # soft: never reserved against
    _budget(conn, "b4", 1.0, tag=("team", "y"))  # another tag value
    out = ledger.reserve(
        conn,
        tenant_id="t1",
        tenant_name="acme",
        job_id="j1",
        tags={"team": "x"},
        amount_usd=4.0,
        basis="quote",
        now_s=MID,
    )
    assert [(r.budget.id, r.period_key, r.amount_usd) for r in out] == [
        ("b1", "2026-12", 4.0),
        ("b2", "2026-12", 4.0),
    ]
    assert _reservations(conn) == {("j1", "b1"): ("2026-12", 4.0), ("j1", "b2"): ("2026-12", 4.0)}
    assert _periods(conn) == {("b1", "2026-12"): (0.0, 4.0, 0), ("b2", "2026-12"): (0.0, 4.0, 0)}
    # a second job of the same period adds to the reserved total
    ledger.reserve(
        conn,
        tenant_id="t1",
        tenant_name="acme",
        job_id="j2",
        tags={},
        amount_usd=2.5,
        basis="quote",
        now_s=MID,
    )
    assert _periods(conn)[("b2", "2026-12")] == (0.0, 6.5, 0)
    assert _periods(conn)[("b1", "2026-12")] == (0.0, 4.0, 0)
    assert ledger.period_state(conn, "b2", "2026-12") == (0.0, 6.5, 0)
    assert ledger.period_state(conn, "b2", "2027-01") == (0.0, 0.0, 0)


def test_reserve_admits_up_to_exactly_the_limit_and_refuses_a_cent_more(conn: Connection) -> None:
    _budget(conn, "b1", 5.0)
    ledger.reserve(
        conn, tenant_id="t1", tenant_name="acme", job_id="j1", tags={}, amount_usd=3.0, basis="q", now_s=MID
    )
    ledger.reserve(
        conn, tenant_id="t1", tenant_name="acme", job_id="j2", tags={}, amount_usd=2.0, basis="q", now_s=MID
    )
    assert ledger.period_state(conn, "b1", "2026-12") == (0.0, 5.0, 0)
    with pytest.raises(BudgetExceededError):
        ledger.reserve(
            conn,
            tenant_id="t1",
            tenant_name="acme",
            job_id="j3",
            tags={},
            amount_usd=0.01,
            basis="q",
            now_s=MID,
        )
    # a negative quote reserves nothing (and is admitted at a full budget)
    out = ledger.reserve(
        conn, tenant_id="t1", tenant_name="acme", job_id="j4", tags={}, amount_usd=-3.0, basis="q", now_s=MID
    )
    assert [r.amount_usd for r in out] == [0.0]
    assert _reservations(conn)[("j4", "b1")] == ("2026-12", 0.0)
    assert ledger.period_state(conn, "b1", "2026-12") == (0.0, 5.0, 0)
    # the next month starts empty
    ledger.reserve(
        conn, tenant_id="t1", tenant_name="acme", job_id="j5", tags={}, amount_usd=5.0, basis="q", now_s=JAN
    )
    assert ledger.period_state(conn, "b1", "2027-01") == (0.0, 5.0, 0)


def test_a_refused_reservation_names_the_budget_and_its_numbers(conn: Connection) -> None:
    _budget(conn, "b1", 5.0, tag=("team", "x"))
    ledger.charge(conn, _fact("c1", 1.25, tags={"team": "x"}), tenant_name="acme")
    ledger.reserve(
        conn,
        tenant_id="t1",
        tenant_name="acme",
        job_id="j1",
        tags={"team": "x"},
        amount_usd=3.0,
        basis="q",
        now_s=MID,
    )
    with pytest.raises(BudgetExceededError) as e:
        ledger.reserve(
            conn,
            tenant_id="t1",
            tenant_name="acme",
            job_id="j2",
            tags={"team": "x"},
            amount_usd=2.0,
            basis="p90 estimate",
            now_s=MID,
        )
    assert e.value.message == (
        "the job's quoted cost $2.00 (p90 estimate) would pass the month budget of tenant 'acme' tag team=x: "
        "$1.25 spent + $3.00 reserved of $5.00"
    )
    assert e.value.hint == (
        "Ask an admin to raise it (`trainyard budgets set acme --usd N --hard --tag team=x`), "
        "or wait for running work to finish."
    )
    assert e.value.details == {
        "budget_id": "b1",
        "tenant": "acme",
        "tag": "team=x",
        "period": "month",
        "period_key": "2026-12",
        "limit_usd": 5.0,
        "spent_usd": 1.25,
        "reserved_usd": 3.0,
        "quoted_usd": 2.0,
        "quote_basis": "p90 estimate",
        "remaining_usd": 0.75,
    }


def test_a_refusal_of_a_whole_tenant_budget_has_no_tag_and_never_a_negative_remainder(
    conn: Connection,
) -> None:
    b = _budget(conn, "b1", 2.0, period="day")
    ledger.charge(conn, _fact("c1", 3.0), tenant_name="acme")  # spent past the limit
    with pytest.raises(BudgetExceededError) as e:
        ledger.reserve(
            conn,
            tenant_id="t1",
            tenant_name="acme",
            job_id="j1",
            tags={},
            amount_usd=1.0,
            basis="q",
            now_s=MID,
            budgets=[b],
        )
    assert e.value.message == (
        "the job's quoted cost $1.00 (q) would pass the day budget of tenant 'acme': "
        "$3.00 spent + $0.00 reserved of $2.00"
    )
    assert e.value.hint == (
        "Ask an admin to raise it (`trainyard budgets set acme --usd N --hard`), "
        "or wait for running work to finish."
    )
    assert e.value.details["remaining_usd"] == 0.0
    assert e.value.details["period_key"] == "2026-12-15"
    assert e.value.details["tag"] is None


def test_reserve_uses_the_budgets_given_and_reads_them_when_none_are(conn: Connection) -> None:
    _budget(conn, "b1", 10.0)
    assert (
        ledger.reserve(
            conn,
            tenant_id="t1",
            tenant_name="acme",
            job_id="j1",
            tags={},
            amount_usd=1.0,
            basis="q",
            now_s=MID,
            budgets=[],
        )
        == []
    )
    assert _reservations(conn) == {} and _periods(conn) == {}
    out = ledger.reserve(
        conn, tenant_id="t1", tenant_name="acme", job_id="j2", tags={}, amount_usd=1.0, basis="q", now_s=MID
    )
    assert [r.budget.id for r in out] == ["b1"]


def test_the_first_reservation_of_a_period_counts_what_the_ledger_already_holds(conn: Connection) -> None:
    # charges written before the budget existed: only the tenant's positive charges inside the month,
    # under the budget's tag, count (2.0 + 0.5 = 2.5)
    for fact in [
        _fact("in", 2.0, MID, tags={"team": "x"}),
        _fact("at-start", 0.5, DEC, tags={"team": "x"}),
        _fact("at-end", 7.0, JAN, tags={"team": "x"}),  # the next month's
        _fact("before", 7.0, DEC - 1.0, tags={"team": "x"}),
        _fact("refund", -1.0, MID, tags={"team": "x"}),
        _fact("other-tag", 7.0, MID, tags={"team": "y"}),
        _fact("other-tenant", 7.0, MID, tenant_id="t2", tags={"team": "x"}),
    ]:
        assert ledger.charge(conn, fact)
    _budget(conn, "b1", 4.0, tag=("team", "x"))
    ledger.reserve(
        conn,
        tenant_id="t1",
        tenant_name="acme",
        job_id="j1",
        tags={"team": "x"},
        amount_usd=1.5,
        basis="q",
        now_s=MID,
    )
    assert _periods(conn) == {("b1", "2026-12"): (2.5, 1.5, 0)}
    with pytest.raises(BudgetExceededError):  # 2.5 + 1.5 + 0.5 > 4
        ledger.reserve(
            conn,
            tenant_id="t1",
            tenant_name="acme",
            job_id="j2",
            tags={"team": "x"},
            amount_usd=0.5,
            basis="q",
            now_s=MID,
        )


def test_reserve_one_reserves_only_while_the_budget_is_as_cached(conn: Connection) -> None:
    b = _budget(conn, "b1", 5.0)
    # no period row yet (a new period): the caller has to take reserve()
    assert not ledger.reserve_one(conn, budget=b, n_hard=1, job_id="j0", amount_usd=1.0, now_s=MID)
    ledger.reserve(
        conn, tenant_id="t1", tenant_name="acme", job_id="j1", tags={}, amount_usd=1.0, basis="q", now_s=MID
    )
    assert ledger.reserve_one(conn, budget=b, n_hard=1, job_id="j2", amount_usd=2.5, now_s=MID)
    assert _reservations(conn)[("j2", "b1")] == ("2026-12", 2.5)
    assert ledger.period_state(conn, "b1", "2026-12") == (0.0, 3.5, 0)
    assert ledger.reserve_one(conn, budget=b, n_hard=1, job_id="j3", amount_usd=-2.0, now_s=MID)  # reserves 0
    assert _reservations(conn)[("j3", "b1")] == ("2026-12", 0.0)
    assert not ledger.reserve_one(
        conn, budget=b, n_hard=2, job_id="j4", amount_usd=1.0, now_s=MID
    )  # count changed
    assert ledger.reserve_one(
        conn, budget=b, n_hard=1, job_id="j5", amount_usd=1.5, now_s=MID
    )  # exactly full
    assert ledger.period_state(conn, "b1", "2026-12") == (0.0, 5.0, 0)
    assert not ledger.reserve_one(conn, budget=b, n_hard=1, job_id="j6", amount_usd=0.01, now_s=MID)
    conn.execute(update(BUDGETS).where(BUDGETS.c.id == "b1").values(limit_usd=6.0, hard=False))  # made soft
    assert not ledger.reserve_one(conn, budget=b, n_hard=1, job_id="j7", amount_usd=0.5, now_s=MID)
    conn.execute(update(BUDGETS).where(BUDGETS.c.id == "b1").values(hard=True))  # raised to 6
    assert ledger.reserve_one(conn, budget=b, n_hard=1, job_id="j8", amount_usd=0.5, now_s=MID)
    assert set(_reservations(conn)) == {("j1", "b1"), ("j2", "b1"), ("j3", "b1"), ("j5", "b1"), ("j8", "b1")}
    assert ledger.period_state(conn, "b1", "2026-12") == (0.0, 5.5, 0)


def test_release_gives_back_what_finished_jobs_still_hold(conn: Connection) -> None:
    _budget(conn, "b1", 10.0)
    _budget(conn, "b2", 10.0, period="day")
    for job, amount in (("j1", 3.0), ("j2", 2.0), ("j3", 1.5)):
        ledger.reserve(
            conn,
            tenant_id="t1",
            tenant_name="acme",
            job_id=job,
            tags={},
            amount_usd=amount,
            basis="q",
            now_s=MID,
        )
    ledger.release(conn, [])
    ledger.release(conn, ["nobody"])
    assert _periods(conn)[("b1", "2026-12")] == (0.0, 6.5, 0)
    ledger.release(conn, iter(["j1", "j3"]))
    assert _periods(conn) == {("b1", "2026-12"): (0.0, 2.0, 0), ("b2", "2026-12-15"): (0.0, 2.0, 0)}
    assert set(_reservations(conn)) == {("j2", "b1"), ("j2", "b2")}
    # a period whose reserved total is already below what the job holds stops at 0
    conn.execute(update(PERIODS).where(PERIODS.c.budget_id == "b1").values(reserved_usd=0.5))
    ledger.release(conn, ["j2"])
    assert _periods(conn) == {("b1", "2026-12"): (0.0, 0.0, 0), ("b2", "2026-12-15"): (0.0, 0.0, 0)}
    assert _reservations(conn) == {}


# ---- charges ------------------------------------------------------------------------------------------
def test_a_fact_is_written_once_with_every_field(conn: Connection) -> None:
    fact = _fact(
        "job:j1:attempt:2:device_seconds",
        1.5,
        MID,
        kind=ledger.KIND_DEVICE,
        quantity=60.0,
        unit="device_s",
        unit_price_usd=0.025,
        job_id="j1",
        attempt=2,
        accelerator="a100",
        market="spot",
        pool="p1",
        devices=4,
        model="llama",
        deployment="chat",
        adapter="lora1",
        tags={"team": "x"},
    )
    assert ledger.charge(conn, fact)
    assert not ledger.charge(conn, fact)
    assert not ledger.charge(conn, _fact("job:j1:attempt:2:device_seconds", 9.0))  # the key names the fact
    (row,) = ledger.entries(conn, ledger.UsageQuery(by="kind", tenant_ids=None))
    row.pop("id")
    assert row == {
        "source_key": "job:j1:attempt:2:device_seconds",
        "tenant_id": "t1",
        "kind": "device_seconds",
        "quantity": 60.0,
        "unit": "device_s",
        "unit_price_usd": 0.025,
        "usd": 1.5,
        "time_s": MID,
        "job_id": "j1",
        "attempt": 2,
        "accelerator": "a100",
        "market": "spot",
        "pool": "p1",
        "devices": 4,
        "model": "llama",
        "deployment": "chat",
        "adapter": "lora1",
        "tags": {"team": "x"},
    }


def test_a_charge_moves_money_from_reserved_to_spent(conn: Connection) -> None:
    _budget(conn, "b1", 100.0)
    ledger.reserve(
        conn, tenant_id="t1", tenant_name="acme", job_id="j1", tags={}, amount_usd=4.0, basis="q", now_s=MID
    )
    assert ledger.charge(conn, _fact("c1", 1.5, MID, job_id="j1"))
    assert _periods(conn) == {("b1", "2026-12"): (1.5, 2.5, 0)}
    assert _reservations(conn) == {("j1", "b1"): ("2026-12", 2.5)}
    ledger.charge(conn, _fact("c2", 3.0, MID, job_id="j1"))  # more than is left: takes the 2.5 left
    assert _periods(conn) == {("b1", "2026-12"): (4.5, 0.0, 0)}
    assert _reservations(conn) == {("j1", "b1"): ("2026-12", 0.0)}
    ledger.charge(conn, _fact("c3", 1.0, MID, job_id="j1"))  # nothing left reserved
    assert _periods(conn) == {("b1", "2026-12"): (5.5, 0.0, 0)}
    ledger.charge(conn, _fact("c4", 2.0, MID))  # another job's charge does not touch j1's reservation
    ledger.reserve(
        conn, tenant_id="t1", tenant_name="acme", job_id="j2", tags={}, amount_usd=3.0, basis="q", now_s=MID
    )
    ledger.charge(conn, _fact("c5", 1.0, MID, job_id="j1"))
    assert _periods(conn) == {("b1", "2026-12"): (8.5, 3.0, 0)}
    assert _reservations(conn)[("j2", "b1")] == ("2026-12", 3.0)


def test_a_charge_in_the_next_month_spends_there_and_releases_the_reservation_where_it_was_made(
    conn: Connection,
) -> None:
    _budget(conn, "b1", 100.0)
    ledger.reserve(
        conn, tenant_id="t1", tenant_name="acme", job_id="j1", tags={}, amount_usd=4.0, basis="q", now_s=MID
    )
    ledger.charge(conn, _fact("c1", 1.0, JAN + 60.0, job_id="j1"))
    assert _periods(conn) == {("b1", "2026-12"): (0.0, 3.0, 0), ("b1", "2027-01"): (1.0, 0.0, 0)}
    assert _reservations(conn) == {("j1", "b1"): ("2026-12", 3.0)}


def test_the_first_charge_of_a_period_is_counted_once(conn: Connection) -> None:
    _budget(conn, "b1", 100.0)
    ledger.charge(conn, _fact("c0", 0.25, MID - 86400.0))  # the period's first charge
    assert _periods(conn) == {("b1", "2026-12"): (0.25, 0.0, 0)}
    ledger.charge(conn, _fact("c1", 2.5, MID))
    assert _periods(conn) == {("b1", "2026-12"): (2.75, 0.0, 0)}


def test_charges_settle_only_budgets_they_fall_under_and_free_facts_settle_nothing(conn: Connection) -> None:
    _budget(conn, "b1", 10.0, tag=("team", "x"))
    _budget(conn, "b2", 10.0, tenant_id="t2")
    assert ledger.charge(conn, _fact("c1", 1.0, tags={"team": "y"}))
    assert ledger.charge(conn, _fact("c2", 0.0, tags={"team": "x"}))  # written, but nothing to settle
    assert ledger.charge(conn, _fact("c3", -2.0, tags={"team": "x"}))  # a refund does not lower spent
    assert _periods(conn) == {}
    assert ledger.charge(conn, _fact("c4", 2.0, tags={"team": "x"}))
    assert _periods(conn) == {("b1", "2026-12"): (2.0, 0.0, 0)}


def test_alerts_at_50_80_and_100_percent_each_once(conn: Connection) -> None:
    _budget(conn, "b1", 10.0, tag=("team", "x"), hard=False)
    tags = {"team": "x"}
    ledger.charge(conn, _fact("c1", 4.0, tags=tags), tenant_name="acme")
    assert _alerts(conn) == []
    ledger.charge(conn, _fact("c2", 1.0, MID + 5.0, tags=tags), tenant_name="acme")  # exactly 50 %
    ledger.charge(conn, _fact("c3", 0.5, MID + 6.0, tags=tags), tenant_name="acme")  # 55 %: nothing new
    ledger.charge(conn, _fact("c4", 3.0, MID + 7.0, tags=tags), tenant_name="acme")  # 85 %
    assert _periods(conn)[("b1", "2026-12")] == (8.5, 0.0, 80)
    ledger.charge(conn, _fact("c5", 1.5, MID + 8.0, tags=tags), tenant_name="acme")  # exactly 100 %
    ledger.charge(conn, _fact("c6", 1.0, MID + 9.0, tags=tags), tenant_name="acme")  # 110 %: nothing new
    base = {
        "budget_id": "b1",
        "tenant": "acme",
        "tag": "team=x",
        "period": "month",
        "period_key": "2026-12",
        "limit_usd": 10.0,
        "hard": False,
    }
    assert _alerts(conn) == [
        ("t1", {**base, "threshold_pct": 50, "spent_usd": 5.0}, MID + 5.0),
        ("t1", {**base, "threshold_pct": 80, "spent_usd": 8.5}, MID + 7.0),
        ("t1", {**base, "threshold_pct": 100, "spent_usd": 10.0}, MID + 8.0),
    ]
    kinds = [r[0] for r in conn.execute(select(EVENTS.c.kind))]
    assert kinds == ["budget_alert"] * 3
    assert _periods(conn)[("b1", "2026-12")] == (11.0, 0.0, 100)


def test_one_charge_past_every_threshold_alerts_each_and_names_the_tenant_id_without_a_name(
    conn: Connection,
) -> None:
    _budget(conn, "b1", 3.0, period="day")
    ledger.charge(conn, _fact("c1", 1.0 / 3.0))
    ledger.charge(conn, _fact("c2", 3.0))
    alerts = _alerts(conn)
    assert [
        (a[1]["threshold_pct"], a[1]["tenant"], a[1]["tag"], a[1]["period_key"], a[1]["hard"]) for a in alerts
    ] == [
        (50, "t1", None, "2026-12-15", True),
        (80, "t1", None, "2026-12-15", True),
        (100, "t1", None, "2026-12-15", True),
    ]
    assert alerts[0][1]["spent_usd"] == 3.333333  # rounded to the micro-dollar
    assert _periods(conn)[("b1", "2026-12-15")][2] == 100


def test_a_budget_of_zero_alerts_at_every_threshold_once_anything_is_spent(conn: Connection) -> None:
    b = _budget(conn, "b1", 0.0)
    conn.execute(
        insert(PERIODS),
        {"budget_id": "b1", "period_key": "2026-12", "spent_usd": 0.0, "reserved_usd": 0.0, "alerted_pct": 0},
    )
    ledger.alert_crossings(conn, b, "2026-12", 0.0, 0, MID, "acme")
    assert _alerts(conn) == []
    ledger.alert_crossings(conn, b, "2026-12", 0.01, 0, MID, "acme")
    assert [a[1]["threshold_pct"] for a in _alerts(conn)] == [50, 80, 100]
    assert _periods(conn)[("b1", "2026-12")][2] == 100
    ledger.alert_crossings(conn, b, "2026-12", 0.02, 100, MID, "acme")  # already alerted
    assert len(_alerts(conn)) == 3


def test_charge_batch_writes_new_facts_and_settles_only_those_under_a_budget(conn: Connection) -> None:
    assert ledger.charge_batch(conn, []) == 0
    _budget(conn, "b1", 10.0, tag=("team", "x"))
    _budget(conn, "b2", 8.0, tenant_id="t2")
    ledger.charge(conn, _fact("old", 1.0, tags={"team": "x"}))
    assert _periods(conn) == {("b1", "2026-12"): (1.0, 0.0, 0)}
    batch = [
        (_fact("old", 5.0, tags={"team": "x"}), "acme"),  # already written: not settled again
        (_fact("n1", 4.0, tags={"team": "x"}), "acme"),
        (_fact("n2", 3.0, tags={"team": "y"}), "acme"),
        (_fact("n3", 0.0, tags={"team": "x"}), "acme"),
        (_fact("n4", 4.0, tenant_id="t2"), "beta"),
    ]
    assert ledger.charge_batch(conn, batch) == 4
    assert _periods(conn) == {("b1", "2026-12"): (5.0, 0.0, 50), ("b2", "2026-12"): (4.0, 0.0, 50)}
    assert [(a[0], a[1]["tenant"]) for a in _alerts(conn)] == [("t1", "acme"), ("t2", "beta")]
    assert ledger.charge_batch(conn, batch) == 0
    assert _periods(conn)[("b1", "2026-12")] == (5.0, 0.0, 50)


def test_device_charge_bills_an_attempts_device_seconds() -> None:
    placement = SimpleNamespace(
        price_usd_per_device_hour=7.2, accelerator="a100", market="spot", pool="p", devices=2
    )
    c = ledger.device_charge(
        tenant_id="t1",
        job_id="j1",
        attempt=3,
        placement=placement,
        device_s=100.0,
        usd=0.4,
        time_s=MID,
        spec={"model": {"base": "llama-7b"}, "tags": {"team": "x", "n": 1}},
    )
    assert c == ledger.Charge(
        source_key="job:j1:attempt:3:device_seconds",
        tenant_id="t1",
        kind="device_seconds",
        quantity=100.0,
        unit="device_s",
        unit_price_usd=0.002,
        usd=0.4,
        time_s=MID,
        job_id="j1",
        attempt=3,
        accelerator="a100",
        market="spot",
        pool="p",
        devices=2,
        model="llama-7b",
        tags={"team": "x", "n": "1"},
    )
    cpu = SimpleNamespace(
        price_usd_per_device_hour=0, accelerator="", market="on_demand", pool="local", devices=1
    )
    kw: dict[str, Any] = {
        "tenant_id": "t1",
        "job_id": "j",
        "attempt": 0,
        "device_s": 1.0,
        "usd": 0.0,
        "time_s": 0.0,
    }
    c = ledger.device_charge(placement=cpu, spec={"model": "not-a-dict"}, **kw)
    assert c.accelerator is None and c.model is None and c.tags == {} and c.unit_price_usd == 0.0
    assert ledger.device_charge(placement=cpu, spec={"model": {"base": ""}}, **kw).model is None
    assert ledger.device_charge(placement=cpu, spec={"model": {}, "tags": None}, **kw).model is None


def test_an_ungoverned_job_is_inserted_only_while_its_tenant_has_no_budget(conn: Connection) -> None:
    def job(job_id: str) -> Job:
        return Job(
            id=job_id,
            seq=0,
            tenant_id="t1",
            name=job_id,
            state=JobState.QUEUED,
            spec={},
            created_at_s=0.0,
            updated_at_s=0.0,
        )

    seq = ledger.insert_job_unless_governed(conn, job("j1"), ("submitted", {"by": "acme"}, 5.0))
    assert isinstance(seq, int)
    assert conn.execute(select(JOBS.c.seq).where(JOBS.c.id == "j1")).scalar() == seq
    events = cast(Table, JobEventRow.__table__)
    assert [
        tuple(r) for r in conn.execute(select(events.c.job_id, events.c.kind, events.c.data, events.c.time_s))
    ] == [("j1", "submitted", {"by": "acme"}, 5.0)]
    _budget(conn, "b1", 10.0, tenant_id="t2")  # another tenant's budget does not govern t1
    assert ledger.insert_job_unless_governed(conn, job("j2"), ("submitted", {}, 6.0)) == seq + 1
    _budget(conn, "b2", 10.0, hard=False)
    assert ledger.insert_job_unless_governed(conn, job("j3"), ("submitted", {}, 7.0)) is None
    assert conn.execute(select(func.count()).select_from(JOBS)).scalar() == 2
    assert conn.execute(select(func.count()).select_from(events)).scalar() == 2


# ---- reports --------------------------------------------------------------------------------------------
def test_parse_group_accepts_the_groupings_and_tag_keys_and_refuses_the_rest() -> None:
    for by in (*ledger.USAGE_GROUPS, "tag:team"):
        assert ledger.parse_group(by) == by
    for by in ("tag:", "tags", "Tenant", ""):
        with pytest.raises(InvalidInputError) as e:
            ledger.parse_group(by)
        assert e.value.message == f"cannot group usage by {by!r}"
        assert e.value.hint == (
            "Use --by tenant, tag:KEY, model, deployment, accelerator, market, pool, kind, job or day."
        )
        assert e.value.details == {"errors": [{"field": "by", "message": "unknown grouping"}]}
    assert ledger.UsageQuery(by="tag:team", tenant_ids=None).tag_key == "team"
    assert ledger.UsageQuery(by="tenant", tenant_ids=None).tag_key is None


def test_entries_are_the_tenants_facts_in_from_to_order_of_writing(conn: Connection) -> None:
    for key, tenant, t in (
        ("a", "t1", 100.0),
        ("b", "t2", 150.0),
        ("c", "t1", 200.0),
        ("d", "t1", 300.0),
        ("e", "t1", 50.0),
    ):
        ledger.charge(conn, _fact(key, 1.0, t, tenant_id=tenant))

    def keys(q: ledger.UsageQuery) -> list[str]:
        return [r["source_key"] for r in ledger.entries(conn, q)]

    assert keys(ledger.UsageQuery(by="kind", tenant_ids=None)) == ["a", "b", "c", "d", "e"]
    assert keys(ledger.UsageQuery(by="kind", tenant_ids=["t1"])) == ["a", "c", "d", "e"]
    assert keys(ledger.UsageQuery(by="kind", tenant_ids=[])) == []
    assert keys(ledger.UsageQuery(by="kind", tenant_ids=None, from_s=100.0, to_s=300.0)) == ["a", "b", "c"]
    assert keys(ledger.UsageQuery(by="kind", tenant_ids=["t1"], from_s=150.0)) == ["c", "d"]
    assert keys(ledger.UsageQuery(by="kind", tenant_ids=None, to_s=100.0)) == ["e"]


def _row(kind: str, quantity: float, usd: float, **kw: Any) -> dict[str, Any]:
    return {
        "kind": kind,
        "quantity": quantity,
        "usd": usd,
        "tenant_id": "t1",
        "time_s": MID,
        "tags": {},
        **kw,
    }


ROWS = [
    _row(ledger.KIND_DEVICE, 7200.0, 5.0, job_id="j1", accelerator="a100", tags={"team": "x"}),
    _row(ledger.KIND_TOKENS, 1500.0, 0.25, job_id=None, model="m", tenant_id="t2", time_s=MID + 86400.0),
    _row(ledger.KIND_REQUESTS, 3.0, 0.125, model="", tags={"team": ""}, time_s=MID - 86400.0),
    _row(ledger.KIND_STORAGE, 2.5, 0.5, job_id="j1", tags={"team": "y"}),
    _row(ledger.KIND_DEVICE, 1800.0, 1.0 / 3.0, job_id="j2", accelerator="a100", tags={"team": "x"}),
]


def test_group_usage_sums_each_kind_in_its_own_unit() -> None:
    by_tag = ledger.group_usage(ROWS, "tag:team", {})
    assert by_tag == [
        {
            "group": "x",
            "usd": 5.333333,
            "device_hours": 2.5,
            "tokens": 0,
            "requests": 0,
            "storage_gb_hours": 0.0,
            "entries": 2,
        },
        {
            "group": "y",
            "usd": 0.5,
            "device_hours": 0.0,
            "tokens": 0,
            "requests": 0,
            "storage_gb_hours": 2.5,
            "entries": 1,
        },
        {
            "group": "(none)",  # no tag and an empty one
            "usd": 0.375,
            "device_hours": 0.0,
            "tokens": 1500,
            "requests": 3,
            "storage_gb_hours": 0.0,
            "entries": 2,
        },
    ]


def test_group_usage_by_tenant_job_day_and_attribute() -> None:
    def groups(by: str, names: dict[str, str] | None = None) -> list[tuple[str, float]]:
        return [(g["group"], g["usd"]) for g in ledger.group_usage(ROWS, by, names or {})]

    assert groups("tenant", {"t1": "acme"}) == [("acme", 5.958333), ("t2", 0.25)]  # unknown id: the id
    assert groups("job") == [("j1", 5.5), ("(none)", 0.375), ("j2", 0.333333)]
    # days in date order, not by dollars
    assert groups("day") == [("2026-12-14", 0.125), ("2026-12-15", 5.833333), ("2026-12-16", 0.25)]
    assert groups("model") == [("(none)", 5.958333), ("m", 0.25)]
    assert groups("accelerator") == [("a100", 5.333333), ("(none)", 0.875)]
    # equal dollars: by group name
    tie = [_row(ledger.KIND_TOKENS, 1.0, 1.0, model="b"), _row(ledger.KIND_TOKENS, 1.0, 1.0, model="a")]
    assert [g["group"] for g in ledger.group_usage(tie, "model", {})] == ["a", "b"]
    assert ledger.group_usage([], "tenant", {}) == []


def test_invoice_lines_one_per_kind_accelerator_market_unit_and_price() -> None:
    rows = [
        {
            **_row(ledger.KIND_DEVICE, 3600.0, 2.5, accelerator="a100", market="spot"),
            "unit": "device_s",
            "unit_price_usd": 2.5 / 3600,
        },
        {
            **_row(ledger.KIND_DEVICE, 1800.0, 1.25, accelerator="a100", market="spot"),
            "unit": "device_s",
            "unit_price_usd": 2.5 / 3600 + 1e-14,
        },
        {
            **_row(ledger.KIND_DEVICE, 3600.0, 3.0, accelerator="a100", market="spot"),
            "unit": "device_s",
            "unit_price_usd": 3.0 / 3600,
        },
        {
            **_row(ledger.KIND_DEVICE, 3600.0, 1.0, accelerator="a100", market="on_demand"),
            "unit": "device_s",
            "unit_price_usd": 1.0 / 3600,
        },
        {**_row(ledger.KIND_TOKENS, 1000.0 / 3.0, 1.0 / 3.0), "unit": "tokens", "unit_price_usd": 0.001},
        {**_row(ledger.KIND_TOKENS, 100.0, 0.1), "unit": "tokens", "unit_price_usd": 0.001},
    ]
    lines = ledger.invoice_lines(rows)
    assert [
        (x["kind"], x["accelerator"], x["market"], x["unit"], x["quantity"], x["usd"], x["entries"])
        for x in lines
    ] == [
        ("device_seconds", "a100", "on_demand", "device_s", 3600.0, 1.0, 1),
        (
            "device_seconds",
            "a100",
            "spot",
            "device_s",
            5400.0,
            3.75,
            2,
        ),  # prices equal to 12 digits: one line
        ("device_seconds", "a100", "spot", "device_s", 3600.0, 3.0, 1),
        ("inference_tokens", None, None, "tokens", 433.333333, 0.433333, 2),
    ]
    assert lines[1]["unit_price_usd"] == 2.5 / 3600  # the first entry's price
    assert lines[3]["unit_price_usd"] == 0.001
    assert ledger.invoice_lines([]) == []


# ---- reconciliation -------------------------------------------------------------------------------------
def test_reconcile_finds_each_job_and_budget_that_disagrees_with_the_ledger_to_the_cent(
    conn: Connection,
) -> None:
    _budget(conn, "b1", 100.0, tag=("team", "x"))
    _job(conn, "j1", 2.0)
    _job(conn, "j2", 1.0)  # billed 1.0, ledger 1.004: within half a cent
    _job(conn, "j3", 0.5)  # ledger 0.494: off by 0.006
    _job(conn, "j4", 0.0)  # no entry
    device = {"kind": ledger.KIND_DEVICE, "tags": {"team": "x"}}
    ledger.charge(conn, _fact("d1a", 1.5, job_id="j1", **device))
    ledger.charge(conn, _fact("d1b", 0.5, job_id="j1", **device))
    ledger.charge(
        conn, _fact("tok", 9.0, job_id="j1", tags={"team": "x"})
    )  # not device-seconds: not a job cost
    ledger.charge(conn, _fact("d2", 1.004, job_id="j2", **device))
    ledger.charge(conn, _fact("d3", 0.494, job_id="j3", **device))
    ledger.charge(conn, _fact("gone", 0.25, job_id="j9", **device))  # a job that no longer exists
    ledger.charge(conn, _fact("gone-tiny", 0.004, job_id="j8", **device))
    assert ledger.reconcile(conn) == {
        "jobs_checked": 4,
        "budgets_checked": 1,
        "mismatches": [
            {"job_id": "j3", "cost_usd": 0.5, "ledger_usd": 0.494},
            {"job_id": "j9", "cost_usd": None, "ledger_usd": 0.25},
        ],
    }
    # the budget period's spent total drifts from the ledger's sum
    conn.execute(update(PERIODS).where(PERIODS.c.budget_id == "b1").values(spent_usd=10.0))
    report = ledger.reconcile(conn)
    assert report["mismatches"][2:] == [
        {"budget_id": "b1", "period_key": "2026-12", "spent_usd": 10.0, "ledger_usd": 12.752}
    ]
    with pytest.raises(LedgerMismatchError) as e:
        ledger.check_reconciled(conn)
    assert e.value.message == "the usage ledger disagrees with 3 recorded cost(s)"
    assert e.value.details == report


def test_a_budget_period_reconciles_with_the_positive_charges_under_its_tag_in_its_period(
    conn: Connection,
) -> None:
    _budget(conn, "b1", 100.0, tag=("team", "x"), hard=False)
    tags = {"team": "x"}
    ledger.charge(conn, _fact("a", 2.0, MID, tags=tags))
    ledger.charge(conn, _fact("b", 1.0, JAN, tags=tags))  # January's own period
    ledger.charge(conn, _fact("c", -0.5, MID, tags=tags))
    ledger.charge(conn, _fact("d", 4.0, MID, tags={"team": "y"}))
    ledger.charge(conn, _fact("e", 4.0, MID, tenant_id="t2", tags=tags))
    ledger.charge(conn, _fact("f", 0.5, DEC, tags=tags))
    assert _periods(conn) == {("b1", "2026-12"): (2.5, 0.0, 0), ("b1", "2027-01"): (1.0, 0.0, 0)}
    report = ledger.check_reconciled(conn)
    assert report == {"jobs_checked": 0, "budgets_checked": 2, "mismatches": []}
    conn.execute(update(PERIODS).where(PERIODS.c.period_key == "2027-01").values(spent_usd=1.004))
    assert ledger.reconcile(conn)["mismatches"] == []
    conn.execute(update(PERIODS).where(PERIODS.c.period_key == "2027-01").values(spent_usd=1.006))
    assert ledger.reconcile(conn)["mismatches"] == [
        {"budget_id": "b1", "period_key": "2027-01", "spent_usd": 1.006, "ledger_usd": 1.0}
    ]


def test_group_usage_adds_up_several_entries_of_each_kind_in_one_group() -> None:
    rows = [
        _row(ledger.KIND_TOKENS, 100.0, 0.5, model="m"),
        _row(ledger.KIND_TOKENS, 250.0, 0.5, model="m"),
        _row(ledger.KIND_REQUESTS, 2.0, 0.25, model="m"),
        _row(ledger.KIND_REQUESTS, 5.0, 0.25, model="m"),
        _row(ledger.KIND_STORAGE, 1.5, 0.125, model="m"),
        _row(ledger.KIND_STORAGE, 0.25, 0.125, model="m"),
    ]
    (g,) = ledger.group_usage(rows, "model", {})
    assert (g["tokens"], g["requests"], g["storage_gb_hours"], g["usd"], g["entries"]) == (
        350,
        7,
        1.75,
        1.75,
        6,
    )


def test_usage_by_day_is_by_utc_day_whatever_the_servers_time_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        rows = [
            _row(ledger.KIND_TOKENS, 1.0, 1.0, time_s=MID + 3600.0)
        ]  # 01:00 UTC, 20:00 the day before there
        assert [g["group"] for g in ledger.group_usage(rows, "day", {})] == ["2026-12-15"]
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_a_tag_key_of_one_character_is_a_grouping() -> None:
    assert ledger.parse_group("tag:x") == "tag:x"


def test_invoice_lines_split_by_accelerator_and_market_at_one_price() -> None:
    def line(acc: str | None, market: str | None) -> dict[str, Any]:
        return {
            **_row(ledger.KIND_DEVICE, 60.0, 1.0, accelerator=acc, market=market),
            "unit": "device_s",
            "unit_price_usd": 0.5,
        }

    rows = [line("h100", "spot"), line("a100", "spot"), line("a100", "on_demand"), line("a100", "spot")]
    assert [(x["accelerator"], x["market"], x["entries"]) for x in ledger.invoice_lines(rows)] == [
        ("a100", "on_demand", 1),
        ("a100", "spot", 2),
        ("h100", "spot", 1),
    ]


def test_group_usage_rounds_hours_to_six_digits() -> None:
    rows = [
        _row(ledger.KIND_DEVICE, 1.0, 0.0, model="m"),
        _row(ledger.KIND_STORAGE, 1.0 / 3.0, 0.0, model="m"),
    ]
    (g,) = ledger.group_usage(rows, "model", {})
    assert (g["device_hours"], g["storage_gb_hours"]) == (0.000278, 0.333333)  # 1 s is 0.000277...8 h


def test_a_refusal_gives_its_numbers_to_the_micro_dollar(conn: Connection) -> None:
    _budget(conn, "b1", 10.0 / 3.0)
    ledger.charge(conn, _fact("c1", 1.0 / 3.0))
    ledger.reserve(
        conn,
        tenant_id="t1",
        tenant_name="acme",
        job_id="j1",
        tags={},
        amount_usd=1.0 / 7.0,
        basis="q",
        now_s=MID,
    )
    with pytest.raises(BudgetExceededError) as e:
        ledger.reserve(
            conn,
            tenant_id="t1",
            tenant_name="acme",
            job_id="j2",
            tags={},
            amount_usd=28.0 / 9.0,
            basis="q",
            now_s=MID,
        )
    d = e.value.details
    assert (d["limit_usd"], d["spent_usd"], d["reserved_usd"], d["quoted_usd"], d["remaining_usd"]) == (
        3.333333,
        0.333333,
        0.142857,
        3.111111,
        2.857143,  # 10/3 - 1/3 - 1/7
    )


def test_charge_batch_settles_charges_under_a_dollar_and_never_free_ones(conn: Connection) -> None:
    _budget(conn, "b1", 10.0)
    _budget(conn, "b2", 10.0, tenant_id="t2")
    assert (
        ledger.charge_batch(conn, [(_fact("z", 0.0), "acme"), (_fact("z2", 0.0, tenant_id="t2"), "beta")])
        == 2
    )
    assert _periods(conn) == {}  # nothing to settle: no period row made
    assert ledger.charge_batch(conn, [(_fact("small", 0.5, tenant_id="t2"), "beta")]) == 1
    assert _periods(conn) == {("b2", "2026-12"): (0.5, 0.0, 0)}


def test_release_touches_only_the_periods_of_the_budgets_the_job_held(conn: Connection) -> None:
    _budget(conn, "b1", 10.0)
    _budget(conn, "b2", 10.0, tag=("team", "x"))  # the same month, another budget
    _budget(conn, "b3", 10.0, tenant_id="t2")
    ledger.reserve(
        conn,
        tenant_id="t1",
        tenant_name="acme",
        job_id="j1",
        tags={"team": "x"},
        amount_usd=2.0,
        basis="q",
        now_s=MID,
    )
    ledger.reserve(
        conn, tenant_id="t1", tenant_name="acme", job_id="j2", tags={}, amount_usd=3.0, basis="q", now_s=MID
    )
    ledger.reserve(
        conn, tenant_id="t2", tenant_name="beta", job_id="j3", tags={}, amount_usd=4.0, basis="q", now_s=JAN
    )
    ledger.release(conn, ["j2"])
    assert _periods(conn) == {
        ("b1", "2026-12"): (0.0, 2.0, 0),
        ("b2", "2026-12"): (0.0, 2.0, 0),
        ("b3", "2027-01"): (0.0, 4.0, 0),
    }


def test_reconcile_reports_to_the_micro_dollar_and_ignores_device_entries_of_no_job(conn: Connection) -> None:
    _budget(conn, "b1", 100.0, hard=False)
    _job(conn, "j1", 1.0 / 3.0)  # ledger 0.3
    _job(conn, "j0", 0.0)  # ledger 0.25
    _job(conn, "j7", 1.0)  # ledger 2/3
    device = {"kind": ledger.KIND_DEVICE}
    ledger.charge(conn, _fact("d1", 0.3, job_id="j1", **device))
    ledger.charge(conn, _fact("d0", 0.25, job_id="j0", **device))
    ledger.charge(conn, _fact("d7", 2.0 / 3.0, job_id="j7", **device))
    ledger.charge(conn, _fact("nojob", 0.25, **device))  # device-seconds of no job: not a job's cost
    ledger.charge(conn, _fact("g1", 1.0 / 3.0, job_id="gone", **device))
    ledger.charge(conn, _fact("g2+", 0.25, job_id="net-zero", **device))  # a job gone, its entries sum to 0
    ledger.charge(conn, _fact("g2-", -0.25, job_id="net-zero", **device))
    ledger.charge(conn, _fact("g3", 0.005, job_id="half-cent", **device))  # exactly the tolerance
    conn.execute(update(PERIODS).where(PERIODS.c.budget_id == "b1").values(spent_usd=10.0 / 3.0))
    assert ledger.reconcile(conn)["mismatches"] == [
        {"job_id": "j1", "cost_usd": 0.333333, "ledger_usd": 0.3},
        {"job_id": "j0", "cost_usd": 0.0, "ledger_usd": 0.25},
        {"job_id": "j7", "cost_usd": 1.0, "ledger_usd": 0.666667},
        {"job_id": "gone", "cost_usd": None, "ledger_usd": 0.333333},
        {"budget_id": "b1", "period_key": "2026-12", "spent_usd": 3.333333, "ledger_usd": 2.055},
    ]


def test_a_budget_read_back_keeps_an_empty_tag_value(conn: Connection) -> None:
    _budget(conn, "b1", 1.0, tag=("team", ""))
    (b,) = ledger.tenant_budgets(conn, "t1")
    assert (b.tag_key, b.tag_value, b.tag) == ("team", "", "team=")
    assert b.applies_to({"team": ""}) and not b.applies_to({"team": "x"})


def test_the_first_charge_under_a_new_budget_counts_the_charges_written_before_it(conn: Connection) -> None:
    ledger.charge(conn, _fact("before-1", 1.5))
    ledger.charge(conn, _fact("before-2", 0.25, MID + 1.0))
    _budget(conn, "b1", 100.0)
    ledger.charge(conn, _fact("after", 2.0, MID + 2.0))
    assert _periods(conn) == {("b1", "2026-12"): (3.75, 0.0, 0)}


def test_one_charge_settles_only_the_reservation_of_its_job_under_the_budgets_it_falls_under(
    conn: Connection,
) -> None:
    _budget(conn, "b1", 100.0)
    _budget(conn, "b2", 100.0, tag=("team", "x"))
    for job in ("j1", "j2"):
        ledger.reserve(
            conn,
            tenant_id="t1",
            tenant_name="acme",
            job_id=job,
            tags={"team": "x"},
            amount_usd=4.0,
            basis="q",
            now_s=MID,
        )
    ledger.charge(conn, _fact("c1", 1.0, MID, job_id="j1"))  # untagged: only the tenant budget applies
    assert _reservations(conn) == {
        ("j1", "b1"): ("2026-12", 3.0),
        ("j1", "b2"): ("2026-12", 4.0),
        ("j2", "b1"): ("2026-12", 4.0),
        ("j2", "b2"): ("2026-12", 4.0),
    }
    assert _periods(conn) == {("b1", "2026-12"): (1.0, 7.0, 0), ("b2", "2026-12"): (0.0, 8.0, 0)}


def test_alerts_of_several_budgets_come_in_budget_id_order_and_mark_only_their_own_period(
    conn: Connection,
) -> None:
    _budget(conn, "b2", 10.0, tag=("team", "x"))  # written first, alerted second
    _budget(conn, "b1", 4.0)
    ledger.charge(conn, _fact("dec", 1.0, MID))  # b1 at 25 %
    ledger.charge(conn, _fact("c1", 5.0, JAN, tags={"team": "x"}), tenant_name="acme")  # 125 % and 50 %
    assert [(a[1]["budget_id"], a[1]["threshold_pct"]) for a in _alerts(conn)] == [
        ("b1", 50),
        ("b1", 80),
        ("b1", 100),
        ("b2", 50),
    ]
    assert _periods(conn) == {
        ("b1", "2026-12"): (1.0, 0.0, 0),
        ("b1", "2027-01"): (5.0, 0.0, 100),
        ("b2", "2027-01"): (5.0, 0.0, 50),
    }


def test_alert_thresholds_are_percent_of_the_limit_exactly(conn: Connection) -> None:
    one = _budget(conn, "b1", 1.0)
    ten = _budget(conn, "b2", 10.0, period="day")
    for b, key in ((one, "2026-12"), (ten, "2026-12-15")):
        conn.execute(
            insert(PERIODS),
            {"budget_id": b.id, "period_key": key, "spent_usd": 0.0, "reserved_usd": 0.0, "alerted_pct": 0},
        )
    ledger.alert_crossings(conn, one, "2026-12", 0.5, 0, MID, "acme")  # a limit of $1: 50 %, not 100 %
    assert [a[1]["threshold_pct"] for a in _alerts(conn)] == [50]
    ledger.alert_crossings(conn, ten, "2026-12-15", 4.96, 0, MID, "acme")  # 49.6 %
    ledger.alert_crossings(conn, ten, "2026-12-15", 7.95, 0, MID, "acme")  # 79.5 %: only 50
    assert [(a[1]["budget_id"], a[1]["threshold_pct"]) for a in _alerts(conn)] == [("b1", 50), ("b2", 50)]


def test_periods_are_utc_whatever_the_servers_time_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        assert ledger.period_bounds_s("month", "2026-12") == (DEC, JAN)
        assert ledger.period_bounds_s("day", "2026-12-15") == (MID, MID + 86400.0)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_the_period_of_an_instant_before_1970_is_the_day_that_holds_it() -> None:
    assert ledger.period_key("day", -1.0) == "1969-12-31"
    assert ledger.period_key("month", -1.0) == "1969-12"


def test_release_gives_back_only_in_the_period_the_job_reserved_in(conn: Connection) -> None:
    _budget(conn, "b1", 10.0)
    ledger.reserve(
        conn, tenant_id="t1", tenant_name="acme", job_id="dec", tags={}, amount_usd=2.0, basis="q", now_s=MID
    )
    ledger.reserve(
        conn, tenant_id="t1", tenant_name="acme", job_id="jan", tags={}, amount_usd=3.0, basis="q", now_s=JAN
    )
    ledger.release(conn, ["dec"])
    assert _periods(conn) == {("b1", "2026-12"): (0.0, 0.0, 0), ("b1", "2027-01"): (0.0, 3.0, 0)}


def test_a_free_fact_in_a_batch_opens_no_period_even_beside_a_paid_one(conn: Connection) -> None:
    _budget(conn, "b1", 10.0)
    batch = [(_fact("paid", 1.0, MID), "acme"), (_fact("free", 0.0, JAN), "acme")]
    assert ledger.charge_batch(conn, batch) == 2
    assert _periods(conn) == {("b1", "2026-12"): (1.0, 0.0, 0)}
