"""Read-only aggregate queries for metrics and alerts, over the store's tables.

One scrape or one dashboard load costs a handful of grouped queries, independent of the number of jobs
except for the open ones (which the alert rules look at one by one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select

from trainyard.observability.alerts import JobHealth
from trainyard.services.domain import Placement
from trainyard.services.execution import attempt_cost_usd
from trainyard.services.lifecycle import ACTIVE_STATES, TERMINAL_STATES, JobState
from trainyard.store.models import JobEventRow, JobRow
from trainyard.store.repositories import TenantRepo

OPEN_STATES = [s.value for s in JobState if s not in TERMINAL_STATES]
MAX_OPEN_JOBS = 10_000


@dataclass(frozen=True)
class PlatformSnapshot:
    now_s: float
    tenants: dict[str, str]  # id -> name
    jobs_by_tenant_state: dict[tuple[str, str], int]
    cost_usd_by_tenant: dict[str, float]  # closed attempts
    open_jobs: list[JobHealth]
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
    """Open jobs, reading only the columns the rules need (not the stored quotes)."""
    q = select(
        JobRow.id,
        JobRow.tenant_id,
        JobRow.name,
        JobRow.state,
        JobRow.attempt,
        JobRow.placement,
        JobRow.progress,
        JobRow.attempt_started_at_s,
        JobRow.cost_usd,
        # only the budget, extracted in the database: open jobs' specs are not loaded on every scrape
        JobRow.spec[("objective", "budget_usd")].as_float().label("budget_usd"),
    ).where(JobRow.state.in_(OPEN_STATES))
    if tenant_id is not None:
        q = q.where(JobRow.tenant_id == tenant_id)
    q = q.order_by(JobRow.seq.desc()).limit(MAX_OPEN_JOBS)
    return [
        _OpenJob(
            id=r.id,
            tenant_id=r.tenant_id,
            name=r.name,
            state=JobState(r.state),
            attempt=r.attempt,
            placement=Placement.from_dict(r.placement) if r.placement else None,
            progress=dict(r.progress or {}),
            attempt_started_at_s=r.attempt_started_at_s,
            cost_usd=float(r.cost_usd or 0.0),
            budget_usd=float(r.budget_usd) if r.budget_usd is not None else None,
        )
        for r in s.execute(q)
    ]


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
        ids = [j.id for j in open_jobs]
        counts: dict[tuple[str, str], int] = {}
        if ids:
            rows = s.execute(
                select(JobEventRow.job_id, JobEventRow.kind, func.count())
                .where(
                    JobEventRow.job_id.in_(ids),
                    JobEventRow.kind.in_(["failed", "lost", "preempted", "restart"]),
                )
                .group_by(JobEventRow.job_id, JobEventRow.kind)
            )
            counts = {(jid, kind): int(n) for jid, kind, n in rows}
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
