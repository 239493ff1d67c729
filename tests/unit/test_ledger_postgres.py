"""The usage ledger's PostgreSQL statements on a real PostgreSQL server (127.0.0.1:5432): the one-statement
admissions (a reservation with its job and first event, alone and in batches), the ungoverned insert
with its event, and the PostgreSQL forms of release, charge and charge_batch. SQLite runs the other
paths (test_ledger.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest
from sqlalchemy import Connection, Table, insert, select, update

from controlplane_support import postgres_db
from trainyard.services.domain import Job
from trainyard.services.lifecycle import JobState
from trainyard.store.db import Database
from trainyard.store.governance_models import BudgetPeriodRow, BudgetReservationRow, BudgetRow
from trainyard.store.models import JobEventRow, JobRow, TenantRow
from trainyard.tenancy import ledger

pytestmark = pytest.mark.postgres

MID = 1797292800.0  # 2026-12-15T00:00:00Z
JAN = 1798761600.0  # 2027-01-01T00:00:00Z
PERIODS = cast(Table, BudgetPeriodRow.__table__)
RESERVATIONS = cast(Table, BudgetReservationRow.__table__)
BUDGETS = cast(Table, BudgetRow.__table__)
JOBS = cast(Table, JobRow.__table__)
EVENTS = cast(Table, JobEventRow.__table__)


@pytest.fixture(autouse=True)
def _statements_built_by_each_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ledger keeps the statements it builds per process; each test builds its own."""
    monkeypatch.setattr(ledger, "_BUILT", {})
    monkeypatch.setattr(ledger, "_BATCH_STATEMENTS", {})


@pytest.fixture(scope="module")
def pg() -> Iterator[Database]:
    with postgres_db() as db:
        yield db


_tenants = iter(range(1000))


@pytest.fixture
def tenant(pg: Database) -> str:
    t = f"t{next(_tenants)}"
    with pg.engine.begin() as c:
        c.execute(insert(cast(Table, TenantRow.__table__)), {"id": t, "name": t, "created_at_s": 0.0})
    return t


def _budget(pg: Database, tenant: str, limit_usd: float) -> ledger.Budget:
    b = ledger.Budget(f"b-{tenant}", tenant, "", "", "month", limit_usd, True, 0.0, 0.0)
    with pg.engine.begin() as c:
        c.execute(
            insert(BUDGETS),
            {
                "id": b.id,
                "tenant_id": tenant,
                "tag_key": "",
                "tag_value": "",
                "period": "month",
                "limit_usd": limit_usd,
                "hard": True,
                "created_at_s": 0.0,
                "updated_at_s": 0.0,
            },
        )
        c.execute(
            insert(PERIODS),
            {
                "budget_id": b.id,
                "period_key": "2026-12",
                "spent_usd": 1.0,
                "reserved_usd": 0.0,
                "alerted_pct": 0,
            },
        )
    return b


def _job(tenant: str, job_id: str) -> Job:
    return Job(
        id=job_id,
        seq=0,
        tenant_id=tenant,
        name=f"name-{job_id}",
        state=JobState.QUEUED,
        spec={"n": 1},
        created_at_s=3.0,
        updated_at_s=4.0,
    )


def _state(c: Connection, tenant: str) -> dict[str, Any]:
    jobs = {
        r.id: (r.seq, r.name, r.state, r.spec)
        for r in c.execute(select(JOBS).where(JOBS.c.tenant_id == tenant))
    }
    ids = list(jobs)
    events = [
        (r.job_id, r.kind, r.data, r.time_s)
        for r in c.execute(select(EVENTS).where(EVENTS.c.job_id.in_(ids)).order_by(EVENTS.c.job_id))
    ]
    res = {
        r.job_id: (r.budget_id, r.period_key, r.remaining_usd)
        for r in c.execute(select(RESERVATIONS).where(RESERVATIONS.c.budget_id == f"b-{tenant}"))
    }
    period = c.execute(
        select(PERIODS.c.spent_usd, PERIODS.c.reserved_usd).where(PERIODS.c.budget_id == f"b-{tenant}")
    ).all()
    return {"jobs": jobs, "events": events, "reservations": res, "periods": [tuple(p) for p in period]}


def test_one_statement_reserves_and_inserts_the_job_with_its_first_event(pg: Database, tenant: str) -> None:
    b = _budget(pg, tenant, 5.0)  # 1.0 already spent
    with pg.write_connection(single_statement=True) as c:
        seq = ledger.reserve_one_and_insert_job(
            c,
            budget=b,
            n_hard=1,
            job=_job(tenant, f"{tenant}-j1"),
            first_event=("submitted", {"by": "x"}, 7.0),
            amount_usd=2.5,
            now_s=MID,
        )
        assert isinstance(seq, int)
        # 1.0 + 2.5 + 2.0 > 5: nothing written; a hard-budget count that changed: nothing written
        too_much = {"budget": b, "first_event": ("submitted", {}, 8.0), "amount_usd": 2.0, "now_s": MID}
        assert (
            ledger.reserve_one_and_insert_job(c, n_hard=1, job=_job(tenant, f"{tenant}-j2"), **too_much)
            is None
        )
        fits = {**too_much, "amount_usd": 0.5}
        assert (
            ledger.reserve_one_and_insert_job(c, n_hard=2, job=_job(tenant, f"{tenant}-j3"), **fits) is None
        )
        # a negative quote reserves 0
        neg = {**too_much, "amount_usd": -4.0}
        assert (
            ledger.reserve_one_and_insert_job(c, n_hard=1, job=_job(tenant, f"{tenant}-j4"), **neg) == seq + 1
        )
    with pg.engine.connect() as c:
        assert _state(c, tenant) == {
            "jobs": {
                f"{tenant}-j1": (seq, f"name-{tenant}-j1", "queued", {"n": 1}),
                f"{tenant}-j4": (seq + 1, f"name-{tenant}-j4", "queued", {"n": 1}),
            },
            "events": [
                (f"{tenant}-j1", "submitted", {"by": "x"}, 7.0),
                (f"{tenant}-j4", "submitted", {}, 8.0),
            ],
            "reservations": {
                f"{tenant}-j1": (b.id, "2026-12", 2.5),
                f"{tenant}-j4": (b.id, "2026-12", 0.0),
            },
            "periods": [(1.0, 2.5)],
        }


def test_a_batch_of_admissions_reserves_its_total_in_one_statement(pg: Database, tenant: str) -> None:
    b = _budget(pg, tenant, 5.0)
    ids = [f"{tenant}-a", f"{tenant}-b", f"{tenant}-c"]
    batch = [
        (_job(tenant, ids[0]), ("submitted", {"i": 0}, 10.0), 1.0),
        (_job(tenant, ids[1]), ("submitted", {"i": 1}, 11.0), -1.0),  # counts as 0
        (_job(tenant, ids[2]), ("queued", {"i": 2}, 12.0), 2.0),
    ]
    with pg.write_connection(single_statement=True) as c:
        seqs = ledger.reserve_and_insert_jobs(c, budget=b, n_hard=1, period="2026-12", batch=batch)
        assert seqs is not None and len(seqs) == 3 and len(set(seqs)) == 3
        # 1.0 + 3.0 + 1.5 > 5: the whole batch is refused
        more = [
            (_job(tenant, f"{tenant}-d"), ("submitted", {}, 13.0), 1.0),
            (_job(tenant, f"{tenant}-e"), ("submitted", {}, 13.0), 0.5),
        ]
        assert ledger.reserve_and_insert_jobs(c, budget=b, n_hard=1, period="2026-12", batch=more) is None
        assert ledger.reserve_and_insert_jobs(c, budget=b, n_hard=2, period="2026-12", batch=more[1:]) is None
        # exactly full
        assert (
            ledger.reserve_and_insert_jobs(c, budget=b, n_hard=1, period="2026-12", batch=more[:1])
            is not None
        )
    with pg.engine.connect() as c:
        state = _state(c, tenant)
    assert {k: v[0] for k, v in state["jobs"].items() if k in ids} == dict(zip(ids, seqs, strict=True))
    assert state["events"][:3] == [
        (ids[0], "submitted", {"i": 0}, 10.0),
        (ids[1], "submitted", {"i": 1}, 11.0),
        (ids[2], "queued", {"i": 2}, 12.0),
    ]
    assert state["reservations"] == {
        ids[0]: (b.id, "2026-12", 1.0),
        ids[1]: (b.id, "2026-12", 0.0),
        ids[2]: (b.id, "2026-12", 2.0),
        f"{tenant}-d": (b.id, "2026-12", 1.0),
    }
    assert state["periods"] == [(1.0, 4.0)]
    assert set(state["jobs"]) == {*ids, f"{tenant}-d"}


def test_an_ungoverned_job_and_its_event_in_one_statement_only_while_there_is_no_budget(
    pg: Database, tenant: str
) -> None:
    with pg.write_connection(single_statement=True) as c:
        seq = ledger.insert_job_unless_governed(
            c, _job(tenant, f"{tenant}-u"), ("submitted", {"k": "v"}, 3.0)
        )
    assert isinstance(seq, int)
    _budget(pg, tenant, 1.0)
    with pg.write_connection(single_statement=True) as c:
        assert (
            ledger.insert_job_unless_governed(c, _job(tenant, f"{tenant}-v"), ("submitted", {}, 4.0)) is None
        )
    with pg.engine.connect() as c:
        state = _state(c, tenant)
    assert state["jobs"] == {f"{tenant}-u": (seq, f"name-{tenant}-u", "queued", {"n": 1})}
    assert state["events"] == [(f"{tenant}-u", "submitted", {"k": "v"}, 3.0)]


def test_release_and_charges_on_postgresql(pg: Database, tenant: str) -> None:
    b = _budget(pg, tenant, 100.0)
    with pg.engine.begin() as c:
        ledger.reserve(
            c,
            tenant_id=tenant,
            tenant_name=tenant,
            job_id=f"{tenant}-r",
            tags={},
            amount_usd=3.0,
            basis="q",
            now_s=MID,
        )
        fact = ledger.Charge(f"{tenant}:c1", tenant, ledger.KIND_TOKENS, 1.0, "tokens", 0.5, 0.5, MID)
        assert ledger.charge(c, fact) and not ledger.charge(c, fact)
        other = ledger.Charge(f"{tenant}:c2", tenant, ledger.KIND_TOKENS, 1.0, "tokens", 0.25, 0.25, MID)
        assert ledger.charge_batch(c, [(fact, tenant), (other, tenant)]) == 1
        assert ledger.period_state(c, b.id, "2026-12") == (1.75, 3.0, 0)
        c.execute(update(PERIODS).where(PERIODS.c.budget_id == b.id).values(reserved_usd=2.0))
        ledger.release(c, [f"{tenant}-r"])  # 2.0 - 3.0 stops at 0
        assert ledger.period_state(c, b.id, "2026-12") == (1.75, 0.0, 0)
        c.execute(update(PERIODS).where(PERIODS.c.budget_id == b.id).values(reserved_usd=5.0))
        ledger.reserve(
            c,
            tenant_id=tenant,
            tenant_name=tenant,
            job_id=f"{tenant}-s",
            tags={},
            amount_usd=1.0,
            basis="q",
            now_s=MID,
        )
        ledger.release(c, [f"{tenant}-s"])
        assert ledger.period_state(c, b.id, "2026-12") == (1.75, 5.0, 0)
        # a release touches only the period the job reserved in, of the budget it reserved against
        c.execute(
            insert(BUDGETS),
            {
                "id": f"b2-{tenant}",
                "tenant_id": tenant,
                "tag_key": "team",
                "tag_value": "x",
                "period": "month",
                "limit_usd": 100.0,
                "hard": True,
                "created_at_s": 0.0,
                "updated_at_s": 0.0,
            },
        )
        c.execute(
            insert(PERIODS),
            {
                "budget_id": f"b2-{tenant}",
                "period_key": "2026-12",
                "spent_usd": 0.0,
                "reserved_usd": 4.0,
                "alerted_pct": 0,
            },
        )
        for job, now_s in ((f"{tenant}-dec", MID), (f"{tenant}-jan", JAN)):
            ledger.reserve(
                c,
                tenant_id=tenant,
                tenant_name=tenant,
                job_id=job,
                tags={},
                amount_usd=1.0,
                basis="q",
                now_s=now_s,
            )
        ledger.release(c, [f"{tenant}-dec"])
        assert ledger.period_state(c, b.id, "2026-12") == (1.75, 5.0, 0)
        assert ledger.period_state(c, b.id, "2027-01") == (0.0, 1.0, 0)
        assert ledger.period_state(c, f"b2-{tenant}", "2026-12") == (0.0, 4.0, 0)
