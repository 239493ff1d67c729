"""The usage ledger: one append-only entry per billable fact, and the budget bookkeeping that follows it.

Every function here runs on the caller's connection, inside the caller's transaction: a charge is
written in the same transaction as the event it bills (the job row's ``cost_usd`` for device-seconds),
so a crash neither loses nor doubles it. Each entry names its fact in ``source_key`` (unique), so
writing a fact twice is refused by the database.

Budgets keep, per period, what was spent (the sum of their ledger charges) and what is reserved
(admitted work's quoted cost not yet spent). A charge moves money from reserved to spent; a finished
job releases what it still had reserved. A reservation is one conditional UPDATE of the period row
(``spent + reserved + amount <= limit``): the row lock (PostgreSQL) or the single writer (SQLite)
serialises concurrent submissions of one tenant, so they cannot overshoot.
"""

from __future__ import annotations

import builtins
import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    Table,
    and_,
    bindparam,
    delete,
    exists,
    func,
    insert,
    select,
    union_all,
    update,
)
from sqlalchemy import cast as sa_cast

from trainyard.errors import BudgetExceededError, InvalidInputError, LedgerMismatchError
from trainyard.store.governance_models import (
    BudgetPeriodRow,
    BudgetReservationRow,
    BudgetRow,
    GovernanceEventRow,
    LedgerEntryRow,
)
from trainyard.store.models import JobEventRow, JobRow
from trainyard.store.repositories import job_insert_params

KIND_DEVICE = "device_seconds"
KIND_STORAGE = "storage_gb_hours"
KIND_TOKENS = "inference_tokens"
KIND_REQUESTS = "api_requests"
KINDS = (KIND_DEVICE, KIND_STORAGE, KIND_TOKENS, KIND_REQUESTS)
PERIODS = ("month", "day")
ALERT_THRESHOLDS_PCT = (50, 80, 100)
RECONCILE_TOLERANCE_USD = 0.005  # "to the cent"
USAGE_GROUPS = ("tenant", "model", "deployment", "accelerator", "market", "pool", "kind", "job", "day")

_LEDGER = cast(Table, LedgerEntryRow.__table__)
_PERIODS = cast(Table, BudgetPeriodRow.__table__)
_BUDGETS = cast(Table, BudgetRow.__table__)
_RESERVATIONS = cast(Table, BudgetReservationRow.__table__)
_EVENTS = cast(Table, GovernanceEventRow.__table__)

_TENANT_BUDGETS = select(_BUDGETS).where(_BUDGETS.c.tenant_id == bindparam("tenant_id"))
_RESERVE = (
    update(_PERIODS)
    .where(
        _PERIODS.c.budget_id == bindparam("b_id"),
        _PERIODS.c.period_key == bindparam("b_pk"),
        _PERIODS.c.spent_usd + _PERIODS.c.reserved_usd + bindparam("amount") <= bindparam("limit_usd"),
    )
    .values(reserved_usd=_PERIODS.c.reserved_usd + bindparam("amount"))
)

_INSERT_RESERVATION = insert(_RESERVATIONS)
# The admission fast path (:func:`reserve_one`): one conditional UPDATE that reads the limit and the
# tenant's number of hard budgets from the budgets table in the same statement, so a reservation made
# from cached budget definitions is exactly as strict as one made after reading them.
_HARD_LIMIT = (
    select(_BUDGETS.c.limit_usd)
    .where(_BUDGETS.c.id == bindparam("b_id"), _BUDGETS.c.hard.is_(True))
    .scalar_subquery()
)
_HARD_COUNT = (
    select(func.count())
    .select_from(_BUDGETS)
    .where(_BUDGETS.c.tenant_id == bindparam("tenant_id"), _BUDGETS.c.hard.is_(True))
    .scalar_subquery()
)
_RESERVE_ONE = (
    update(_PERIODS)
    .where(
        _PERIODS.c.budget_id == bindparam("b_id"),
        _PERIODS.c.period_key == bindparam("b_pk"),
        _PERIODS.c.spent_usd + _PERIODS.c.reserved_usd + bindparam("amount") <= _HARD_LIMIT + 1e-9,
        bindparam("n_hard") == _HARD_COUNT,
    )
    .values(reserved_usd=_PERIODS.c.reserved_usd + bindparam("amount"))
)


def _reserve_and_insert_job() -> Any:
    """PostgreSQL: :func:`reserve_one` and the job with its first event as one statement (data-modifying
    CTEs; atomic and one round trip, like the ungoverned submission)::

        WITH reserved AS (UPDATE budget_periods … WHERE <room left> RETURNING budget_id),
             reservation AS (INSERT INTO budget_reservations SELECT :id, budget_id, … FROM reserved),
             new_job AS (INSERT INTO jobs SELECT … WHERE EXISTS (SELECT FROM reserved) RETURNING seq, id)
        INSERT INTO job_events SELECT … FROM new_job RETURNING (SELECT seq FROM new_job)

    No row comes back (and nothing is written) when the reservation is refused."""
    jobs = cast(Table, JobRow.__table__)
    reserved = _RESERVE_ONE.returning(_PERIODS.c.budget_id).cte("reserved")
    reservation = (
        insert(_RESERVATIONS)
        .from_select(
            ["job_id", "budget_id", "period_key", "remaining_usd"],
            select(
                bindparam("id", type_=jobs.c.id.type),
                reserved.c.budget_id,
                bindparam("b_pk", type_=_RESERVATIONS.c.period_key.type),
                bindparam("amount", type_=_RESERVATIONS.c.remaining_usd.type),
            ),
        )
        .cte("reservation")
    )
    cols = [c for c in jobs.c if c.name != "seq"]
    new_job = (
        insert(jobs)
        .from_select(
            [c.name for c in cols],
            select(*[bindparam(c.name, type_=c.type) for c in cols]).where(
                exists(select(reserved.c.budget_id))
            ),
        )
        .returning(jobs.c.seq, jobs.c.id)
        .cte("new_job")
    )
    return _insert_first_event(new_job).add_cte(reservation)


def _insert_first_event(new_job: Any) -> Any:
    """The job's first event inserted from the ``new_job`` CTE (``seq``, ``id`` of the job row a
    data-modifying CTE inserted), returning the job's ``seq``: one statement for job and event."""
    events = cast(Table, JobEventRow.__table__)
    return (
        insert(events)
        .from_select(
            ["job_id", "kind", "data", "time_s"],
            select(
                new_job.c.id,
                bindparam("event_kind", type_=events.c.kind.type),
                bindparam("event_data", type_=events.c.data.type),
                bindparam("event_time_s", type_=events.c.time_s.type),
            ),
        )
        .returning(select(new_job.c.seq).scalar_subquery())
    )


# statements built on first use and kept (they are compiled once per process either way)
_BUILT: dict[str, Any] = {}


def _built(name: str, build: Any) -> Any:
    """The statement (or statements) ``build()`` returns, built once per process under ``name``."""
    stmt = _BUILT.get(name)
    if stmt is None:
        stmt = _BUILT[name] = build()
    return stmt


def _reserve_and_insert_jobs(n: int) -> Any:
    """PostgreSQL: a batch of ``n`` admissions of one budget period (:class:`BatchedAdmissions`) as one
    statement, the batch form of :func:`_reserve_and_insert_job`::

        WITH reserved AS (UPDATE budget_periods … + :amount WHERE <room for the total> RETURNING budget_id),
             reservation AS (INSERT INTO budget_reservations SELECT :id_0, budget_id, :b_pk, :amount_0
                             FROM reserved UNION ALL … :id_n-1 …),
             new_job AS (INSERT INTO jobs SELECT :…_0 WHERE EXISTS (SELECT FROM reserved) UNION ALL …
                         RETURNING seq, id)
             new_events AS (INSERT INTO job_events SELECT new_job.id, :event_kind_i, … FROM new_job
                            WHERE id = :id_i UNION ALL …)
        SELECT id, seq FROM new_job

    Parameters of admission ``i`` end in ``_i``; ``amount`` is the batch's total. No row comes back (and
    nothing is written) when the total does not fit."""
    jobs = cast(Table, JobRow.__table__)
    events = cast(Table, JobEventRow.__table__)
    # every parameter cast to its column's type: the branches of a UNION ALL are typed from their
    # parameters alone (a NULL or a string would be text, which a float or JSON column refuses)

    def _typed(name: str, type_: Any) -> Any:
        return sa_cast(bindparam(name, type_=type_), type_)

    reserved = _RESERVE_ONE.returning(_PERIODS.c.budget_id).cte("reserved")
    b_pk = _typed("b_pk", _RESERVATIONS.c.period_key.type)
    reservation = (
        insert(_RESERVATIONS)
        .from_select(
            ["job_id", "budget_id", "period_key", "remaining_usd"],
            union_all(
                *[
                    select(
                        _typed(f"id_{i}", jobs.c.id.type),
                        reserved.c.budget_id,
                        b_pk,
                        _typed(f"amount_{i}", _RESERVATIONS.c.remaining_usd.type),
                    )
                    for i in range(n)
                ]
            ),
        )
        .cte("reservation")
    )
    cols = [c for c in jobs.c if c.name != "seq"]
    room = exists(select(reserved.c.budget_id))
    new_job = (
        insert(jobs)
        .from_select(
            [c.name for c in cols],
            union_all(
                *[select(*[_typed(f"{c.name}_{i}", c.type) for c in cols]).where(room) for i in range(n)]
            ),
        )
        .returning(jobs.c.seq, jobs.c.id)
        .cte("new_job")
    )
    first_events = union_all(
        *[
            select(
                new_job.c.id,
                _typed(f"event_kind_{i}", events.c.kind.type),
                _typed(f"event_data_{i}", events.c.data.type),
                _typed(f"event_time_s_{i}", events.c.time_s.type),
            ).where(new_job.c.id == _typed(f"id_{i}", jobs.c.id.type))
            for i in range(n)
        ]
    )
    new_events = (
        insert(events).from_select(["job_id", "kind", "data", "time_s"], first_events).cte("new_events")
    )
    # PostgreSQL runs every data-modifying CTE whether or not the query reads it
    return select(new_job.c.id, new_job.c.seq).add_cte(reservation).add_cte(new_events)


_BATCH_STATEMENTS: dict[int, Any] = {}


def reserve_and_insert_jobs(
    conn: Connection,
    *,
    budget: Budget,
    n_hard: int,
    period: str,
    batch: Sequence[tuple[Any, tuple[str, dict[str, Any], float], float]],
) -> builtins.list[int] | None:
    """PostgreSQL, in autocommit: reserve the total of a batch of (job, first event, amount) against
    ``budget``'s period ``period`` and insert the jobs with their first events, in one statement; the
    jobs' sequences in the order given, or None (nothing written) when the total does not fit."""
    n = len(batch)
    stmt = _BATCH_STATEMENTS.get(n)
    if stmt is None:
        stmt = _BATCH_STATEMENTS[n] = _reserve_and_insert_jobs(n)
    params: dict[str, Any] = {
        "b_id": budget.id,
        "b_pk": period,
        "amount": sum(max(0.0, float(amount)) for _, _, amount in batch),
        "tenant_id": budget.tenant_id,
        "n_hard": n_hard,
    }
    for i, (job, (kind, data, time_s), amount) in enumerate(batch):
        params.update({f"{k}_{i}": v for k, v in job_insert_params(job).items()})
        params[f"amount_{i}"] = max(0.0, float(amount))
        params[f"event_kind_{i}"] = kind
        params[f"event_data_{i}"] = data
        params[f"event_time_s_{i}"] = time_s
    seqs = {str(job_id): int(seq) for job_id, seq in conn.execute(stmt, params)}
    if not seqs:
        return None
    return [seqs[job.id] for job, _, _ in batch]


def _insert_ungoverned_job() -> tuple[Any, Any]:
    """(SQLite, PostgreSQL) statements inserting a job only while its tenant has no budget::

        INSERT INTO jobs SELECT :… WHERE NOT EXISTS (SELECT FROM budgets WHERE tenant_id = :tenant_id)

    on PostgreSQL with its first event in the same statement (a data-modifying CTE, as for the plain
    submission). A server process may still hold a tenant's principal read before its first budget
    (created through another process, say): the statement itself sees the budget and inserts nothing,
    so that submission is admitted against the budget at once, with no cache lifetime and no extra
    round trip for tenants without budgets (budgets are never deleted, so "no budget" is the only
    state a cache can have wrong)."""
    jobs = cast(Table, JobRow.__table__)
    cols = [c for c in jobs.c if c.name != "seq"]
    no_budget = ~exists(select(_BUDGETS.c.id).where(_BUDGETS.c.tenant_id == bindparam("tenant_id")))
    job_insert = insert(jobs).from_select(
        [c.name for c in cols], select(*[bindparam(c.name, type_=c.type) for c in cols]).where(no_budget)
    )
    sqlite = job_insert.returning(jobs.c.seq)
    new_job = job_insert.returning(jobs.c.seq, jobs.c.id).cte("new_job")
    return sqlite, _insert_first_event(new_job)


_INSERT_EVENT = insert(cast(Table, JobEventRow.__table__))


def insert_job_unless_governed(
    conn: Connection, job: Any, first_event: tuple[str, dict[str, Any], float]
) -> int | None:
    """Insert a job of a tenant believed to have no budget, with its first event; its sequence, or None
    (nothing written) when the tenant has a budget by now (the caller then reserves against it)."""
    params = job_insert_params(job)
    kind, data, time_s = first_event
    if conn.dialect.name == "postgresql":
        params.update(event_kind=kind, event_data=data, event_time_s=time_s)
        with_event = _built("insert_ungoverned_job", _insert_ungoverned_job)[1]
        seq = conn.execute(with_event, params).scalar()
        return None if seq is None else int(seq)
    seq = conn.execute(_built("insert_ungoverned_job", _insert_ungoverned_job)[0], params).scalar()
    if seq is None:
        return None
    conn.execute(_INSERT_EVENT, {"job_id": job.id, "kind": kind, "data": data, "time_s": time_s})
    return int(seq)


@dataclass(frozen=True)
class Budget:
    id: str
    tenant_id: str
    tag_key: str
    tag_value: str
    period: str
    limit_usd: float
    hard: bool
    created_at_s: float
    updated_at_s: float

    @property
    def tag(self) -> str | None:
        return f"{self.tag_key}={self.tag_value}" if self.tag_key else None

    def applies_to(self, tags: dict[str, Any] | None) -> bool:
        if not self.tag_key:
            return True
        return str((tags or {}).get(self.tag_key, "")) == self.tag_value and self.tag_key in (tags or {})


@dataclass(frozen=True)
class Charge:
    """One billable fact, before it is written."""

    source_key: str
    tenant_id: str
    kind: str
    quantity: float
    unit: str
    unit_price_usd: float
    usd: float
    time_s: float
    job_id: str | None = None
    attempt: int | None = None
    accelerator: str | None = None
    market: str | None = None
    pool: str | None = None
    devices: int | None = None
    model: str | None = None
    deployment: str | None = None
    adapter: str | None = None
    tags: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Reservation:
    budget: Budget
    period_key: str
    amount_usd: float


def period_key(period: str, time_s: float) -> str:
    """The key of the ``period`` (``month`` or ``day``, UTC) holding ``time_s``: ``2026-12`` or
    ``2026-12-02``. Both are a function of the UTC day (Unix time has 86,400 s a day), so the formatted
    key is kept per day: every admission asks for one."""
    return _period_key_of_day(period, int(time_s // 86400.0))


@functools.lru_cache(maxsize=64)
def _period_key_of_day(period: str, day: int) -> str:
    t = datetime.fromtimestamp(day * 86400, tz=UTC)
    return t.strftime("%Y-%m") if period == "month" else t.strftime("%Y-%m-%d")


def period_bounds_s(period: str, key: str) -> tuple[float, float]:
    """[start, end) of a period key in unix seconds."""
    if period == "month":
        y, m = (int(x) for x in key.split("-"))
        start = datetime(y, m, 1, tzinfo=UTC)
        end = datetime(y + (m == 12), m % 12 + 1, 1, tzinfo=UTC)
        return start.timestamp(), end.timestamp()
    start = datetime.strptime(key, "%Y-%m-%d").replace(tzinfo=UTC)
    return start.timestamp(), start.timestamp() + 86400.0


def _budget(row: Any) -> Budget:
    return Budget(
        id=row.id,
        tenant_id=row.tenant_id,
        tag_key=row.tag_key or "",
        tag_value=row.tag_value or "",
        period=row.period,
        limit_usd=float(row.limit_usd),
        hard=bool(row.hard),
        created_at_s=float(row.created_at_s),
        updated_at_s=float(row.updated_at_s),
    )


def tenant_budgets(conn: Connection, tenant_id: str) -> list[Budget]:
    return [_budget(r) for r in conn.execute(_TENANT_BUDGETS, {"tenant_id": tenant_id})]


def _insert_ignore(conn: Connection, table: Table, values: dict[str, Any]) -> int:
    """INSERT … ON CONFLICT DO NOTHING (SQLite and PostgreSQL); returns the number of rows inserted.

    On PostgreSQL the rows inserted are counted from RETURNING: for a table with an autoincrement key
    (the ledger) the driver reports a rowcount of -1 for this statement, inserted or not."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        stmt = pg_insert(table).values(**values).on_conflict_do_nothing()
        return len(conn.execute(stmt.returning(*table.primary_key.columns)).all())
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return int(conn.execute(sqlite_insert(table).values(**values).on_conflict_do_nothing()).rowcount or 0)


def _ensure_period(conn: Connection, b: Budget, key: str, *, exclude_source_key: str | None = None) -> None:
    """Create a budget's period row when missing, its spent total taken from the ledger (charges written
    before the budget existed count against it), so that spent always equals the ledger's sum."""
    exists = conn.execute(
        select(_PERIODS.c.budget_id).where(_PERIODS.c.budget_id == b.id, _PERIODS.c.period_key == key)
    ).first()
    if exists is not None:
        return
    start, end = period_bounds_s(b.period, key)
    q = select(_LEDGER.c.usd, _LEDGER.c.tags).where(
        _LEDGER.c.tenant_id == b.tenant_id, _LEDGER.c.time_s >= start, _LEDGER.c.time_s < end
    )
    if exclude_source_key is not None:
        q = q.where(_LEDGER.c.source_key != exclude_source_key)
    spent = sum(float(u) for u, tags in conn.execute(q) if float(u) > 0 and b.applies_to(tags))
    _insert_ignore(
        conn,
        _PERIODS,
        {"budget_id": b.id, "period_key": key, "spent_usd": spent, "reserved_usd": 0.0, "alerted_pct": 0},
    )


def period_state(conn: Connection, budget_id: str, key: str) -> tuple[float, float, int]:
    """(spent_usd, reserved_usd, alerted_pct) of one budget period (zeros when nothing happened yet)."""
    row = conn.execute(
        select(_PERIODS.c.spent_usd, _PERIODS.c.reserved_usd, _PERIODS.c.alerted_pct).where(
            _PERIODS.c.budget_id == budget_id, _PERIODS.c.period_key == key
        )
    ).first()
    if row is None:
        return 0.0, 0.0, 0
    return float(row[0]), float(row[1]), int(row[2])


def append_event(conn: Connection, tenant_id: str, kind: str, data: dict[str, Any], time_s: float) -> None:
    conn.execute(insert(_EVENTS), {"tenant_id": tenant_id, "kind": kind, "data": data, "time_s": time_s})


# ---- reservation at admission ------------------------------------------------------------------------
def reserve(
    conn: Connection,
    *,
    tenant_id: str,
    tenant_name: str,
    job_id: str,
    tags: dict[str, Any],
    amount_usd: float,
    basis: str,
    now_s: float,
    budgets: Sequence[Budget] | None = None,
) -> list[Reservation]:
    """Reserve ``amount_usd`` against every hard budget that applies to the job, or raise
    :class:`BudgetExceededError` naming the first budget it would pass (the caller's transaction then
    rolls back, reservations included). Budgets are taken in id order, so two submissions never wait on
    each other's locks in opposite orders."""
    if budgets is None:
        budgets = tenant_budgets(conn, tenant_id)
    hard = sorted((b for b in budgets if b.hard and b.applies_to(tags)), key=lambda b: b.id)
    out: list[Reservation] = []
    amount = max(0.0, float(amount_usd))
    for b in hard:
        key = period_key(b.period, now_s)
        params = {"b_id": b.id, "b_pk": key, "amount": amount, "limit_usd": b.limit_usd + 1e-9}
        res = conn.execute(_RESERVE, params)  # the common case: one statement
        if not res.rowcount:
            _ensure_period(conn, b, key)  # the period's first reservation, or a refusal
            res = conn.execute(_RESERVE, params)
        if not res.rowcount:
            spent, reserved, _ = period_state(conn, b.id, key)
            raise BudgetExceededError(
                f"the job's quoted cost ${amount:.2f} ({basis}) would pass the {b.period} budget of "
                f"{_scope(tenant_name, b)}: ${spent:.2f} spent + ${reserved:.2f} reserved of "
                f"${b.limit_usd:.2f}",
                hint=(
                    f"Ask an admin to raise it (`trainyard budgets set {tenant_name} --usd N --hard"
                    + (f" --tag {b.tag}" if b.tag else "")
                    + "`), or wait for running work to finish."
                ),
                details={
                    "budget_id": b.id,
                    "tenant": tenant_name,
                    "tag": b.tag,
                    "period": b.period,
                    "period_key": key,
                    "limit_usd": round(b.limit_usd, 6),
                    "spent_usd": round(spent, 6),
                    "reserved_usd": round(reserved, 6),
                    "quoted_usd": round(amount, 6),
                    "quote_basis": basis,
                    "remaining_usd": round(max(0.0, b.limit_usd - spent - reserved), 6),
                },
            )
        out.append(Reservation(b, key, amount))
    if out:
        conn.execute(
            _INSERT_RESERVATION,
            [
                {
                    "job_id": job_id,
                    "budget_id": r.budget.id,
                    "period_key": r.period_key,
                    "remaining_usd": amount,
                }
                for r in out
            ],
        )
    return out


class BudgetCache:
    """Each tenant's budget definitions, kept in process so that an admission needs no read of them.

    A cached definition is only ever used to choose which budget period to reserve against; the
    reservation itself (:func:`reserve_one`) re-reads the limit, the ``hard`` flag and the tenant's
    number of hard budgets inside its one conditional UPDATE. A budget raised, lowered, made soft or
    hard, or a new hard budget (in this process or any other on the database) therefore makes the
    statement change nothing, and the caller falls back to :func:`reserve`, which reads the budgets
    afresh (and refreshes this cache). A stale cache costs a slower admission, never a looser one."""

    def __init__(self, max_tenants: int = 10_000) -> None:
        self._by_tenant: dict[str, tuple[Budget, ...]] = {}
        self._max = max_tenants

    def get(self, tenant_id: str) -> tuple[Budget, ...] | None:
        return self._by_tenant.get(tenant_id)

    def put(self, tenant_id: str, budgets: Sequence[Budget]) -> None:
        if len(self._by_tenant) >= self._max:
            self._by_tenant.clear()
        self._by_tenant[tenant_id] = tuple(budgets)

    def invalidate(self, tenant_id: str) -> None:
        self._by_tenant.pop(tenant_id, None)

    def clear(self) -> None:
        self._by_tenant.clear()


def single_hard_budget(budgets: Sequence[Budget], tags: dict[str, Any]) -> tuple[Budget, int] | None:
    """(the one hard budget that applies to a job with ``tags``, the tenant's number of hard budgets),
    or None when none or several apply (those admissions take :func:`reserve`)."""
    hard = [b for b in budgets if b.hard]
    applying = [b for b in hard if b.applies_to(tags)]
    if len(applying) != 1:
        return None
    return applying[0], len(hard)


def reserve_one(
    conn: Connection,
    *,
    budget: Budget,
    n_hard: int,
    job_id: str,
    amount_usd: float,
    now_s: float,
) -> bool:
    """Reserve ``amount_usd`` against ``budget`` (the tenant's only hard budget that applies to the
    job, as last read) in two statements: the conditional UPDATE of its period row and the job's
    reservation row. False, with nothing written, when the statement finds the period full, the period
    row missing (a new period), the budget's limit or hardness changed to one that refuses, or the
    tenant's hard budgets changed in number: the caller then runs :func:`reserve`, which decides with
    fresh definitions and explains a refusal. Like :func:`reserve`, it runs inside the caller's
    transaction, so concurrent admissions serialise on the period row (PostgreSQL) or the writer lock
    (SQLite) and cannot overshoot."""
    key = period_key(budget.period, now_s)
    amount = max(0.0, float(amount_usd))
    params = {
        "b_id": budget.id,
        "b_pk": key,
        "amount": amount,
        "tenant_id": budget.tenant_id,
        "n_hard": n_hard,
    }
    if not conn.execute(_RESERVE_ONE, params).rowcount:
        return False
    conn.execute(
        _INSERT_RESERVATION,
        {"job_id": job_id, "budget_id": budget.id, "period_key": key, "remaining_usd": amount},
    )
    return True


def reserve_one_and_insert_job(
    conn: Connection,
    *,
    budget: Budget,
    n_hard: int,
    job: Any,
    first_event: tuple[str, dict[str, Any], float],
    amount_usd: float,
    now_s: float,
) -> int | None:
    """PostgreSQL, in autocommit: :func:`reserve_one` plus the job and its first event in one statement;
    the new job's sequence, or None (nothing written) when the caller has to take :func:`reserve`."""
    kind, data, time_s = first_event
    params = job_insert_params(job)
    params.update(
        b_id=budget.id,
        b_pk=period_key(budget.period, now_s),
        amount=max(0.0, float(amount_usd)),
        tenant_id=budget.tenant_id,
        n_hard=n_hard,
        event_kind=kind,
        event_data=data,
        event_time_s=time_s,
    )
    seq = conn.execute(_built("reserve_and_insert_job", _reserve_and_insert_job), params).scalar()
    return None if seq is None else int(seq)


def _scope(tenant_name: str, b: Budget) -> str:
    return f"tenant {tenant_name!r}" + (f" tag {b.tag}" if b.tag else "")


def release(conn: Connection, job_ids: Iterable[str]) -> None:
    """Give back what finished jobs still hold reserved (no-op for jobs without reservations)."""
    ids = list(job_ids)
    if not ids:
        return
    rows = conn.execute(
        select(_RESERVATIONS.c.budget_id, _RESERVATIONS.c.period_key, _RESERVATIONS.c.remaining_usd).where(
            _RESERVATIONS.c.job_id.in_(ids)
        )
    ).all()
    if not rows:
        return
    for budget_id, key, remaining in sorted(rows, key=lambda r: (r[0], r[1])):
        conn.execute(
            update(_PERIODS)
            .where(_PERIODS.c.budget_id == budget_id, _PERIODS.c.period_key == key)
            .values(reserved_usd=func.max(_PERIODS.c.reserved_usd - float(remaining), 0.0))
            if conn.dialect.name == "sqlite"
            else update(_PERIODS)
            .where(_PERIODS.c.budget_id == budget_id, _PERIODS.c.period_key == key)
            .values(reserved_usd=func.greatest(_PERIODS.c.reserved_usd - float(remaining), 0.0))
        )
    conn.execute(delete(_RESERVATIONS).where(_RESERVATIONS.c.job_id.in_(ids)))


# ---- charges -------------------------------------------------------------------------------------------
def _ledger_row(c: Charge) -> dict[str, Any]:
    """The ledger row of one fact."""
    return {
        "source_key": c.source_key,
        "tenant_id": c.tenant_id,
        "kind": c.kind,
        "quantity": c.quantity,
        "unit": c.unit,
        "unit_price_usd": c.unit_price_usd,
        "usd": c.usd,
        "time_s": c.time_s,
        "job_id": c.job_id,
        "attempt": c.attempt,
        "accelerator": c.accelerator,
        "market": c.market,
        "pool": c.pool,
        "devices": c.devices,
        "model": c.model,
        "deployment": c.deployment,
        "adapter": c.adapter,
        "tags": dict(c.tags),
    }


def charge(conn: Connection, c: Charge, *, tenant_name: str | None = None) -> bool:
    """Append one fact to the ledger and settle it against the budgets it falls under; False (and no
    change anywhere) when this fact is already in the ledger."""
    inserted = _insert_ignore(conn, _LEDGER, _ledger_row(c))
    if not inserted:
        return False
    if c.usd > 0:
        _settle(conn, c, tenant_name or c.tenant_id)
    return True


def charge_batch(conn: Connection, charges: Sequence[tuple[Charge, str]]) -> int:
    """:func:`charge` for many facts at once (``(charge, tenant name)`` pairs): one multi-row INSERT …
    ON CONFLICT DO NOTHING … RETURNING for the entries and one query for the tenants' budgets; only
    the new entries of tenants with a budget that applies are then settled one by one. Returns the
    number of entries written."""
    if not charges:
        return 0
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        stmt: Any = pg_insert(_LEDGER).on_conflict_do_nothing()
    else:
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        stmt = sqlite_insert(_LEDGER).on_conflict_do_nothing()
    rows = [_ledger_row(c) for c, _ in charges]
    written = {str(k) for k in conn.execute(stmt.returning(_LEDGER.c.source_key), rows).scalars()}
    tenants = {c.tenant_id for c, _ in charges if c.usd > 0 and c.source_key in written}
    if tenants:
        budgeted: dict[str, list[Budget]] = {}
        for r in conn.execute(select(_BUDGETS).where(_BUDGETS.c.tenant_id.in_(tenants))):
            budgeted.setdefault(r.tenant_id, []).append(_budget(r))
        for c, name in charges:
            budgets = budgeted.get(c.tenant_id, ())
            if c.source_key in written and c.usd > 0 and any(b.applies_to(c.tags) for b in budgets):
                _settle(conn, c, name)
    return len(written)


def _settle(conn: Connection, c: Charge, tenant_name: str) -> None:
    budgets = [b for b in tenant_budgets(conn, c.tenant_id) if b.applies_to(c.tags)]
    if not budgets:
        return
    held: dict[str, tuple[str, float]] = {}
    if c.job_id is not None:
        for budget_id, key, remaining in conn.execute(
            select(
                _RESERVATIONS.c.budget_id, _RESERVATIONS.c.period_key, _RESERVATIONS.c.remaining_usd
            ).where(_RESERVATIONS.c.job_id == c.job_id)
        ):
            held[str(budget_id)] = (str(key), float(remaining))
    for b in sorted(budgets, key=lambda x: x.id):
        key = period_key(b.period, c.time_s)
        _ensure_period(conn, b, key, exclude_source_key=c.source_key)
        take = 0.0
        if b.id in held:
            res_key, remaining = held[b.id]
            take = min(remaining, c.usd)
            if take > 0:
                conn.execute(
                    update(_RESERVATIONS)
                    .where(_RESERVATIONS.c.job_id == c.job_id, _RESERVATIONS.c.budget_id == b.id)
                    .values(remaining_usd=remaining - take)
                )
                conn.execute(
                    update(_PERIODS)
                    .where(_PERIODS.c.budget_id == b.id, _PERIODS.c.period_key == res_key)
                    .values(reserved_usd=_PERIODS.c.reserved_usd - take)
                )
        conn.execute(
            update(_PERIODS)
            .where(_PERIODS.c.budget_id == b.id, _PERIODS.c.period_key == key)
            .values(spent_usd=_PERIODS.c.spent_usd + c.usd)
        )
        spent, _, alerted = period_state(conn, b.id, key)
        alert_crossings(conn, b, key, spent, alerted, c.time_s, tenant_name)


def alert_crossings(
    conn: Connection, b: Budget, key: str, spent: float, alerted: int, now_s: float, tenant_name: str
) -> None:
    """Record a ``budget_alert`` event for every threshold (50/80/100 %) newly crossed."""
    pct = (100.0 if spent > 0 else 0.0) if b.limit_usd <= 0 else 100.0 * spent / b.limit_usd
    crossed = [t for t in ALERT_THRESHOLDS_PCT if pct >= t and t > alerted]
    if not crossed:
        return
    for t in crossed:
        append_event(
            conn,
            b.tenant_id,
            "budget_alert",
            {
                "budget_id": b.id,
                "tenant": tenant_name,
                "tag": b.tag,
                "period": b.period,
                "period_key": key,
                "threshold_pct": t,
                "spent_usd": round(spent, 6),
                "limit_usd": b.limit_usd,
                "hard": b.hard,
            },
            now_s,
        )
    conn.execute(
        update(_PERIODS)
        .where(_PERIODS.c.budget_id == b.id, _PERIODS.c.period_key == key)
        .values(alerted_pct=max(crossed))
    )


def device_charge(
    *,
    tenant_id: str,
    job_id: str,
    attempt: int,
    placement: Any,
    device_s: float,
    usd: float,
    time_s: float,
    spec: dict[str, Any],
) -> Charge:
    """The ledger entry of one attempt's device-seconds (the same dollars that go into ``cost_usd``)."""
    model = ((spec.get("model") or {}).get("base")) if isinstance(spec.get("model"), dict) else None
    return Charge(
        source_key=f"job:{job_id}:attempt:{attempt}:{KIND_DEVICE}",
        tenant_id=tenant_id,
        kind=KIND_DEVICE,
        quantity=device_s,
        unit="device_s",
        unit_price_usd=float(placement.price_usd_per_device_hour) / 3600.0,
        usd=usd,
        time_s=time_s,
        job_id=job_id,
        attempt=attempt,
        accelerator=placement.accelerator or None,
        market=placement.market,
        pool=placement.pool,
        devices=placement.devices,
        model=str(model) if model else None,
        tags={str(k): str(v) for k, v in (spec.get("tags") or {}).items()},
    )


# ---- reports ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class UsageQuery:
    by: str
    tenant_ids: Sequence[str] | None  # None: every tenant (admin)
    from_s: float | None = None
    to_s: float | None = None

    @property
    def tag_key(self) -> str | None:
        return self.by[4:] if self.by.startswith("tag:") else None


def parse_group(by: str) -> str:
    if by in USAGE_GROUPS or (by.startswith("tag:") and len(by) > 4):
        return by
    raise InvalidInputError(
        f"cannot group usage by {by!r}",
        hint="Use --by tenant, tag:KEY, model, deployment, accelerator, market, pool, kind, job or day.",
        details={"errors": [{"field": "by", "message": "unknown grouping"}]},
    )


def entries(conn: Connection, q: UsageQuery) -> list[dict[str, Any]]:
    stmt = select(_LEDGER).order_by(_LEDGER.c.id)
    conds: list[ColumnElement[bool]] = []
    if q.tenant_ids is not None:
        conds.append(_LEDGER.c.tenant_id.in_(list(q.tenant_ids)))
    if q.from_s is not None:
        conds.append(_LEDGER.c.time_s >= q.from_s)
    if q.to_s is not None:
        conds.append(_LEDGER.c.time_s < q.to_s)
    if conds:
        stmt = stmt.where(and_(*conds))
    return [dict(r._mapping) for r in conn.execute(stmt)]


def group_usage(
    rows: Iterable[dict[str, Any]], by: str, tenant_names: dict[str, str]
) -> builtins.list[dict[str, Any]]:
    """Sum ledger entries into ``{group, usd, device_hours, tokens, requests, storage_gb_hours,
    entries}`` rows; entries without the grouping attribute fall in group ``(none)``."""
    groups: dict[str, dict[str, Any]] = {}
    tag_key = by[4:] if by.startswith("tag:") else None
    for r in rows:
        if tag_key is not None:
            g = (r.get("tags") or {}).get(tag_key)
        elif by == "tenant":
            g = tenant_names.get(r["tenant_id"], r["tenant_id"])
        elif by == "day":
            g = datetime.fromtimestamp(r["time_s"], tz=UTC).strftime("%Y-%m-%d")
        elif by == "job":
            g = r.get("job_id")
        else:
            g = r.get(by)
        name = str(g) if g not in (None, "") else "(none)"
        acc = groups.setdefault(
            name,
            {
                "group": name,
                "usd": 0.0,
                "device_hours": 0.0,
                "tokens": 0,
                "requests": 0,
                "storage_gb_hours": 0.0,
                "entries": 0,
            },
        )
        acc["usd"] += float(r["usd"])
        acc["entries"] += 1
        if r["kind"] == KIND_DEVICE:
            acc["device_hours"] += float(r["quantity"]) / 3600.0
        elif r["kind"] == KIND_TOKENS:
            acc["tokens"] += int(r["quantity"])
        elif r["kind"] == KIND_REQUESTS:
            acc["requests"] += int(r["quantity"])
        elif r["kind"] == KIND_STORAGE:
            acc["storage_gb_hours"] += float(r["quantity"])
    out = list(groups.values())
    for acc in out:
        acc["usd"] = round(acc["usd"], 6)
        acc["device_hours"] = round(acc["device_hours"], 6)
        acc["storage_gb_hours"] = round(acc["storage_gb_hours"], 6)
    if by == "day":
        out.sort(key=lambda a: a["group"])
    else:
        out.sort(key=lambda a: (-a["usd"], a["group"]))
    return out


def invoice_lines(rows: Iterable[dict[str, Any]]) -> builtins.list[dict[str, Any]]:
    """One line per (kind, accelerator, market, unit, unit price): quantity and dollars."""
    lines: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        k = (
            r["kind"],
            r.get("accelerator"),
            r.get("market"),
            r["unit"],
            round(float(r["unit_price_usd"]), 12),
        )
        line = lines.setdefault(
            k,
            {
                "kind": r["kind"],
                "accelerator": r.get("accelerator"),
                "market": r.get("market"),
                "unit": r["unit"],
                "unit_price_usd": float(r["unit_price_usd"]),
                "quantity": 0.0,
                "usd": 0.0,
                "entries": 0,
            },
        )
        line["quantity"] += float(r["quantity"])
        line["usd"] += float(r["usd"])
        line["entries"] += 1
    out = sorted(lines.values(), key=lambda x: (x["kind"], str(x["accelerator"]), str(x["market"])))
    for line in out:
        line["quantity"] = round(line["quantity"], 6)
        line["usd"] = round(line["usd"], 6)
    return out


# ---- reconciliation ---------------------------------------------------------------------------------------
def reconcile(conn: Connection) -> dict[str, Any]:
    """Compare every job's ``cost_usd`` with its device-seconds ledger entries, and every budget period's
    ``spent_usd`` with the ledger charges it covers. Returns ``{jobs_checked, budgets_checked,
    mismatches}``; :func:`check_reconciled` raises when there is any mismatch."""
    jobs = cast(Table, JobRow.__table__)
    ledger_by_job = dict(
        conn.execute(
            select(_LEDGER.c.job_id, func.sum(_LEDGER.c.usd))
            .where(_LEDGER.c.kind == KIND_DEVICE, _LEDGER.c.job_id.is_not(None))
            .group_by(_LEDGER.c.job_id)
        ).all()
    )
    mismatches: list[dict[str, Any]] = []
    checked = 0
    for job_id, cost in conn.execute(select(jobs.c.id, jobs.c.cost_usd)):
        checked += 1
        led = float(ledger_by_job.pop(job_id, 0.0) or 0.0)
        if not math.isclose(led, float(cost or 0.0), abs_tol=RECONCILE_TOLERANCE_USD):
            mismatches.append(
                {"job_id": job_id, "cost_usd": round(float(cost or 0.0), 6), "ledger_usd": round(led, 6)}
            )
    for job_id, led in ledger_by_job.items():  # ledger entries of jobs that no longer exist
        if abs(float(led or 0.0)) > RECONCILE_TOLERANCE_USD:
            mismatches.append({"job_id": job_id, "cost_usd": None, "ledger_usd": round(float(led), 6)})
    budgets_checked = 0
    budgets = [_budget(r) for r in conn.execute(select(_BUDGETS))]
    for b in budgets:
        for key, spent in conn.execute(
            select(_PERIODS.c.period_key, _PERIODS.c.spent_usd).where(_PERIODS.c.budget_id == b.id)
        ):
            budgets_checked += 1
            start, end = period_bounds_s(b.period, str(key))
            rows = conn.execute(
                select(_LEDGER.c.usd, _LEDGER.c.tags).where(
                    _LEDGER.c.tenant_id == b.tenant_id, _LEDGER.c.time_s >= start, _LEDGER.c.time_s < end
                )
            ).all()
            total = sum(float(u) for u, tags in rows if b.applies_to(tags) and float(u) > 0)
            if not math.isclose(total, float(spent), abs_tol=RECONCILE_TOLERANCE_USD):
                mismatches.append(
                    {
                        "budget_id": b.id,
                        "period_key": key,
                        "spent_usd": round(float(spent), 6),
                        "ledger_usd": round(total, 6),
                    }
                )
    return {"jobs_checked": checked, "budgets_checked": budgets_checked, "mismatches": mismatches}


def check_reconciled(conn: Connection) -> dict[str, Any]:
    report = reconcile(conn)
    if report["mismatches"]:
        n = len(report["mismatches"])
        raise LedgerMismatchError(f"the usage ledger disagrees with {n} recorded cost(s)", details=report)
    return report
