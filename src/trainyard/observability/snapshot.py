"""Read-only aggregate queries for metrics and alerts, over the store's tables.

One scrape or one dashboard load costs a handful of grouped queries, independent of the number of jobs
except for the open ones (which the alert rules look at one by one).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from sqlalchemy import exists, func, or_, select

from trainyard.observability.alerts import JobHealth
from trainyard.services.domain import Placement
from trainyard.services.execution import attempt_cost_usd
from trainyard.services.lifecycle import ACTIVE_STATES, TERMINAL_STATES, JobState
from trainyard.store.models import JobEventRow, JobRow
from trainyard.store.repositories import TenantRepo

OPEN_STATES = [s.value for s in JobState if s not in TERMINAL_STATES]
ACTIVE_VALUES = sorted(s.value for s in ACTIVE_STATES)
WAITING_VALUES = [v for v in OPEN_STATES if v not in ACTIVE_VALUES]
COUNTED_EVENTS = ["failed", "lost", "preempted", "restart"]
MAX_OPEN_JOBS = 10_000


@dataclass(frozen=True)
class PlatformSnapshot:
    now_s: float
    tenants: dict[str, str]  # id -> name
    jobs_by_tenant_state: dict[tuple[str, str], int]
    cost_usd_by_tenant: dict[str, float]  # closed attempts
    open_jobs: list[JobHealth]  # those a rule or a series can be about (see _open_jobs)
    pool_devices: list[dict[str, Any]]  # {pool, accelerator, market, total, available, in_use, price}


@dataclass(frozen=True)
class _OpenJob:
    id: str
    tenant_id: str
    name: str
    state: JobState
    attempt: int
    placement: Placement | None
    progress: dict[str, Any]
    attempt_started_at_s: float | None
    cost_usd: float
    budget_usd: float | None


def _open_jobs(s: Any, tenant_id: str | None) -> list[_OpenJob]:
    """The open jobs a rule or a series can be about, newest first, reading only the columns the rules
    need (not the stored quotes): every job holding devices (starting, running), with its placement and
    last heartbeat; of the waiting ones (pending, queued, preempted) only those with a budget or a
    failure, loss, preemption or restart behind them, since no rule fires on the rest. A long queue of
    fresh submissions costs the database a filtered indexed read and Python nothing."""
    base = (
        JobRow.seq,
        JobRow.id,
        JobRow.tenant_id,
        JobRow.name,
        JobRow.state,
        JobRow.attempt,
        JobRow.attempt_started_at_s,
        JobRow.cost_usd,
        # only the budget, extracted in the database: open jobs' specs are not loaded on every scrape
        JobRow.spec[("objective", "budget_usd")].as_float().label("budget_usd"),
    )
    active_q = select(*base, JobRow.placement, JobRow.progress).where(JobRow.state.in_(ACTIVE_VALUES))
    budget = JobRow.spec[("objective", "budget_usd")].as_float()
    eventful = exists().where(JobEventRow.job_id == JobRow.id, JobEventRow.kind.in_(COUNTED_EVENTS))
    waiting_q = select(*base).where(JobRow.state.in_(WAITING_VALUES), or_(budget.is_not(None), eventful))
    if tenant_id is not None:
        active_q = active_q.where(JobRow.tenant_id == tenant_id)
        waiting_q = waiting_q.where(JobRow.tenant_id == tenant_id)
    # (seq, id, tenant, name, state, attempt, started, cost, budget, placement, progress)
    conn = s.connection()  # Core rows: no ORM loading for columns
    rows = [tuple(r) for r in conn.execute(active_q.order_by(JobRow.seq.desc()).limit(MAX_OPEN_JOBS))]
    rows.extend(
        (*r, None, None) for r in conn.execute(waiting_q.order_by(JobRow.seq.desc()).limit(MAX_OPEN_JOBS))
    )
    rows.sort(key=itemgetter(0), reverse=True)
    out = []
    for _, jid, tid, name, state, attempt, started, cost, budget, placement, progress in rows[:MAX_OPEN_JOBS]:
        out.append(
            _OpenJob(
                id=jid,
                tenant_id=tid,
                name=name,
                state=JobState(state),
                attempt=attempt,
                placement=Placement.from_dict(placement) if placement else None,
                progress=dict(progress or {}),
                attempt_started_at_s=started,
                cost_usd=float(cost or 0.0),
                budget_usd=float(budget) if budget is not None else None,
            )
        )
    return out


def _failure_counts(s: Any, tenant_id: str | None) -> dict[tuple[str, str], int]:
    """Failure, loss, preemption and restart events per open job, joined in the database (not an
    ``IN`` list of every open job's id)."""
    q = (
        select(JobEventRow.job_id, JobEventRow.kind, func.count())
        .join(JobRow, JobRow.id == JobEventRow.job_id)
        .where(JobRow.state.in_(OPEN_STATES), JobEventRow.kind.in_(COUNTED_EVENTS))
    )
    if tenant_id is not None:
        q = q.where(JobRow.tenant_id == tenant_id)
    return {
        (jid, kind): int(n)
        for jid, kind, n in s.connection().execute(q.group_by(JobEventRow.job_id, JobEventRow.kind))
    }


def take(
    platform: Any, now_s: float, tenant_id: str | None = None, *, open_jobs_only: bool = False
) -> PlatformSnapshot:
    """Everything metrics and alerts need; ``tenant_id`` limits the open jobs to one tenant.
    ``open_jobs_only`` (what the alert rules read) skips the store-wide job counts, costs and pools."""
    with platform.db.session() as s:
        tenants = {t.id: t.name for t in TenantRepo(s).list()}
        by_state: dict[tuple[str, str], int] = {}
        costs: dict[str, float] = {}
        if not open_jobs_only:
            by_state = {
                (tid, st): int(n)
                for tid, st, n in s.execute(
                    select(JobRow.tenant_id, JobRow.state, func.count()).group_by(
                        JobRow.tenant_id, JobRow.state
                    )
                )
            }
            costs = {
                tid: float(c or 0.0)
                for tid, c in s.execute(
                    select(JobRow.tenant_id, func.sum(JobRow.cost_usd)).group_by(JobRow.tenant_id)
                )
            }
        open_jobs = _open_jobs(s, tenant_id)
        counts = _failure_counts(s, tenant_id) if open_jobs else {}
    health = []
    used: dict[str, int] = {}
    for j in open_jobs:
        running_usd = 0.0
        age = None
        if j.state in ACTIVE_STATES:
            if j.placement is not None:
                used[j.placement.pool] = used.get(j.placement.pool, 0) + j.placement.devices
            _, running_usd = attempt_cost_usd(j.placement, j.attempt_started_at_s, now_s)
            last = j.progress.get("time_s")
            ref = float(last) if isinstance(last, int | float) else j.attempt_started_at_s
            if j.attempt_started_at_s is not None and ref is not None:
                ref = max(ref, j.attempt_started_at_s)  # a previous attempt's heartbeat does not count
            age = max(0.0, now_s - ref) if ref is not None else None
        health.append(
            JobHealth(
                job_id=j.id,
                tenant_id=j.tenant_id,
                tenant_name=tenants.get(j.tenant_id, j.tenant_id),
                name=j.name,
                state=j.state.value,
                attempt=j.attempt,
                failures=counts.get((j.id, "failed"), 0) + counts.get((j.id, "lost"), 0),
                preemptions=counts.get((j.id, "preempted"), 0),
                restarts=counts.get((j.id, "restart"), 0),
                progress=j.progress if j.state in ACTIVE_STATES else {},
                last_report_age_s=age,
                cost_usd=j.cost_usd + running_usd,
                budget_usd=j.budget_usd,
            )
        )
    pools = []
    for p in [] if open_jobs_only else platform.pools.pools():
        pools.append(
            {
                "pool": p.name,
                "accelerator": p.accelerator,
                "market": str(getattr(p.market, "value", p.market)),
                "total": p.total_devices,
                "available": p.free_devices,
                "in_use": used.get(p.name, 0),
                "price": p.price_usd_per_device_hour,
            }
        )
    return PlatformSnapshot(now_s, tenants, by_state, costs, health, pools)
