"""Repositories: the only code that touches ORM rows. Every method takes the caller's Session (one
transaction per use case) and returns domain objects from :mod:`trainyard.services.domain`."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal, cast

from sqlalchemy import Connection, Table, bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from trainyard.services.domain import ApiKeyRecord, Job, JobEvent, Placement, PoolRecord, Tenant
from trainyard.services.lifecycle import ACTIVE_STATES, JobState
from trainyard.store.models import (
    ApiKeyRow,
    JobEventRow,
    JobRow,
    PoolRow,
    StepTimeMeasurementRow,
    TenantRow,
)

# Statements built once: constructing a Core statement per call costs more than executing it.
_INSERT_JOB = insert(JobRow).returning(JobRow.seq)
_INSERT_EVENT = insert(JobEventRow)
_JOBS = cast(Table, JobRow.__table__)
# the multi-row form of _INSERT_JOB (one INSERT … VALUES …, … RETURNING, sequences in parameter order)
_INSERT_JOBS = insert(_JOBS).returning(_JOBS.c.seq, sort_by_parameter_order=True)
_PENDING_DIGESTS = (
    select(_JOBS.c.id, _JOBS.c.spec_sha256)
    .where(_JOBS.c.state == bindparam("state"))
    .order_by(_JOBS.c.seq)
    .limit(bindparam("limit"))
)
_SPEC_OF = select(_JOBS.c.spec).where(_JOBS.c.id == bindparam("id"))
_EVENTS = cast(Table, JobEventRow.__table__)
_INSERT_SAME_EVENT = insert(_EVENTS).from_select(
    ["job_id", "kind", "data", "time_s"],
    select(
        _JOBS.c.id,
        bindparam("kind", type_=_EVENTS.c.kind.type),
        bindparam("data", type_=_EVENTS.c.data.type),
        bindparam("time_s", type_=_EVENTS.c.time_s.type),
    )
    .where(_JOBS.c.id.in_(bindparam("ids", expanding=True)))
    .order_by(_JOBS.c.seq),
)
_NEW_JOB = (
    insert(_JOBS)
    .values({c.name: bindparam(c.name, type_=c.type) for c in _JOBS.c if c.name != "seq"})
    .returning(_JOBS.c.seq, _JOBS.c.id)
    .cte("new_job")
)
# PostgreSQL: WITH new_job AS (INSERT INTO jobs … RETURNING seq, id) INSERT INTO job_events … SELECT … FROM
# new_job RETURNING (SELECT seq FROM new_job) — the job and its first event, atomically, in one statement.
_INSERT_JOB_WITH_EVENT = (
    insert(_EVENTS)
    .from_select(
        ["job_id", "kind", "data", "time_s"],
        select(
            _NEW_JOB.c.id,
            bindparam("event_kind", type_=_EVENTS.c.kind.type),
            bindparam("event_data", type_=_EVENTS.c.data.type),
            bindparam("event_time_s", type_=_EVENTS.c.time_s.type),
        ),
    )
    .returning(select(_NEW_JOB.c.seq).scalar_subquery())
)


def _tenant(row: TenantRow) -> Tenant:
    return Tenant(
        id=row.id,
        name=row.name,
        created_at_s=row.created_at_s,
        max_queued_jobs=row.max_queued_jobs,
        max_active_devices=row.max_active_devices,
        storage_roots=tuple(row.storage_roots or ()),
        allow_user_code=bool(row.allow_user_code),
    )


def _job(row: JobRow) -> Job:
    return Job(
        id=row.id,
        seq=row.seq,
        tenant_id=row.tenant_id,
        name=row.name,
        state=JobState(row.state),
        spec=row.spec,
        created_at_s=row.created_at_s,
        updated_at_s=row.updated_at_s,
        attempt=row.attempt,
        placement=Placement.from_dict(row.placement) if row.placement else None,
        quote=row.quote,
        cost_usd=row.cost_usd,
        checkpoints=list(row.checkpoints or []),
        workers=list(row.workers or []),
        result=row.result,
        reason=row.reason or "",
        progress=dict(row.progress or {}),
        attempt_started_at_s=row.attempt_started_at_s,
        run_dir=row.run_dir,
        idempotency_key=row.idempotency_key,
        spec_sha256=row.spec_sha256,
    )


class TenantRepo:
    def __init__(self, s: Session) -> None:
        self.s = s

    def add(self, tenant: Tenant) -> Tenant:
        self.s.add(
            TenantRow(
                id=tenant.id,
                name=tenant.name,
                created_at_s=tenant.created_at_s,
                max_queued_jobs=tenant.max_queued_jobs,
                max_active_devices=tenant.max_active_devices,
                storage_roots=list(tenant.storage_roots),
                allow_user_code=tenant.allow_user_code,
            )
        )
        self.s.flush()
        return tenant

    def update(self, name: str, **fields: object) -> Tenant | None:
        """Set the given columns of tenant ``name`` (only the keys passed); the updated tenant."""
        row = self.s.scalars(
            select(TenantRow).where(TenantRow.name == name).with_for_update(key_share=True)
        ).first()
        if row is None:
            return None
        for key, value in fields.items():
            if not hasattr(TenantRow, key):
                raise ValueError(f"tenants has no column {key!r}")
            setattr(row, key, list(value) if key == "storage_roots" else value)  # type: ignore[call-overload]
        self.s.flush()
        return _tenant(row)

    def by_name(self, name: str) -> Tenant | None:
        row = self.s.scalars(select(TenantRow).where(TenantRow.name == name)).first()
        return _tenant(row) if row else None

    def by_id(self, tenant_id: str) -> Tenant | None:
        row = self.s.get(TenantRow, tenant_id)
        return _tenant(row) if row else None

    def list(self) -> builtins.list[Tenant]:
        return [_tenant(r) for r in self.s.scalars(select(TenantRow).order_by(TenantRow.name))]

    def lock(self, tenant_id: str) -> None:
        """Lock the tenant's row until the transaction ends (``SELECT … FOR UPDATE``): the one point that
        serialises a tenant's quota-checked submissions. SQLite has no row locks (the statement runs
        without ``FOR UPDATE``); there ``BEGIN IMMEDIATE`` already makes every write transaction exclusive.
        The lock is ``FOR NO KEY UPDATE``: it serialises lockers, but not the foreign-key checks of rows
        that name the tenant (a job inserted by a transaction that already holds a budget period's row
        lock), which would otherwise deadlock against a locker waiting for that period row."""
        self.s.execute(select(TenantRow.id).where(TenantRow.id == tenant_id).with_for_update(key_share=True))


class ApiKeyRepo:
    def __init__(self, s: Session) -> None:
        self.s = s

    def add(self, key: ApiKeyRecord) -> None:
        self.s.add(
            ApiKeyRow(
                id=key.id,
                tenant_id=key.tenant_id,
                prefix=key.prefix,
                key_sha256=key.key_sha256,
                admin=key.admin,
                revoked=key.revoked,
                created_at_s=key.created_at_s,
            )
        )
        self.s.flush()

    def by_prefix(self, prefix: str) -> list[ApiKeyRecord]:
        rows = self.s.scalars(
            select(ApiKeyRow).where(ApiKeyRow.prefix == prefix, ApiKeyRow.revoked.is_(False))
        )
        return [_api_key(r) for r in rows]

    def is_active(self, key_id: str) -> bool:
        row = self.s.get(ApiKeyRow, key_id)
        return row is not None and not row.revoked

    def for_tenant(self, tenant_id: str) -> builtins.list[ApiKeyRecord]:
        """The tenant's keys, oldest first, revoked ones included."""
        rows = self.s.scalars(
            select(ApiKeyRow)
            .where(ApiKeyRow.tenant_id == tenant_id)
            .order_by(ApiKeyRow.created_at_s, ApiKeyRow.id)
        )
        return [_api_key(r) for r in rows]

    def get(self, key_id: str, *, tenant_id: str) -> ApiKeyRecord | None:
        row = self.s.scalars(
            select(ApiKeyRow).where(ApiKeyRow.id == key_id, ApiKeyRow.tenant_id == tenant_id)
        ).first()
        return _api_key(row) if row else None

    def revoke(self, key_id: str) -> None:
        self.s.execute(update(ApiKeyRow).where(ApiKeyRow.id == key_id).values(revoked=True))


def _api_key(r: ApiKeyRow) -> ApiKeyRecord:
    return ApiKeyRecord(
        id=r.id,
        tenant_id=r.tenant_id,
        prefix=r.prefix,
        key_sha256=r.key_sha256,
        admin=r.admin,
        created_at_s=r.created_at_s,
        revoked=r.revoked,
    )


def insert_job(
    conn: Connection, job: Job, first_event: tuple[str, dict[str, Any], float] | None = None
) -> Job:
    """Insert a new job and, when given, its first (kind, data, time_s) event on ``conn`` (Core path, no
    ORM bookkeeping; statements compiled once); return the job with its sequence. On PostgreSQL the job
    and its event are one statement (a data-modifying CTE: atomic, one round trip)."""
    params = job_insert_params(job)
    if first_event is not None and conn.dialect.name == "postgresql":
        kind, data, time_s = first_event
        params.update(event_kind=kind, event_data=data, event_time_s=time_s)
        seq = conn.execute(_INSERT_JOB_WITH_EVENT, params).scalar_one()
    else:
        seq = conn.execute(_INSERT_JOB, params).scalar_one()
        if first_event is not None:
            kind, data, time_s = first_event
            conn.execute(_INSERT_EVENT, {"job_id": job.id, "kind": kind, "data": data, "time_s": time_s})
    return replace(job, seq=int(seq))


def insert_jobs(conn: Connection, jobs: Sequence[tuple[Job, tuple[str, dict[str, Any], float]]]) -> list[int]:
    """Insert new jobs, each with its first (kind, data, time_s) event, as two multi-row statements;
    the jobs' sequences in the order given."""
    rows = conn.execute(_INSERT_JOBS, [job_insert_params(job) for job, _ in jobs]).all()
    conn.execute(
        _INSERT_EVENT,
        [{"job_id": job.id, "kind": k, "data": d, "time_s": t} for job, (k, d, t) in jobs],
    )
    return [int(r[0]) for r in rows]


def job_insert_params(job: Job) -> dict[str, Any]:
    """The bound parameters of a new job's row (one per column of ``jobs`` but ``seq``)."""
    return {
        "id": job.id,
        "tenant_id": job.tenant_id,
        "name": job.name,
        "state": job.state.value,
        "spec": job.spec,
        "spec_sha256": job.spec_sha256,
        "idempotency_key": job.idempotency_key,
        "created_at_s": job.created_at_s,
        "updated_at_s": job.updated_at_s,
        "attempt": job.attempt,
        "placement": None,
        "quote": job.quote,
        "cost_usd": 0.0,
        "checkpoints": [],
        "workers": [],
        "result": None,
        "reason": job.reason,
        "progress": {},
        "attempt_started_at_s": None,
        "run_dir": None,
    }


class JobRepo:
    def __init__(self, s: Session) -> None:
        self.s = s

    def add(self, job: Job, first_event: tuple[str, dict[str, Any], float] | None = None) -> Job:
        """Insert a new job and, when given, its first (kind, data, time_s) event (see :func:`insert_job`)."""
        return insert_job(self.s.connection(), job, first_event)

    def get(self, job_id: str, *, tenant_id: str | None = None, for_update: bool = False) -> Job | None:
        q = select(JobRow).where(JobRow.id == job_id)
        if tenant_id is not None:
            q = q.where(JobRow.tenant_id == tenant_id)
        if for_update:
            q = q.with_for_update()
        row = self.s.scalars(q).first()
        return _job(row) if row else None

    def by_idempotency_key(self, tenant_id: str, key: str) -> Job | None:
        row = self.s.scalars(
            select(JobRow).where(JobRow.tenant_id == tenant_id, JobRow.idempotency_key == key)
        ).first()
        return _job(row) if row else None

    def list(
        self,
        *,
        tenant_id: str | None = None,
        states: Sequence[str] | None = None,
        name: str | None = None,
        before_seq: int | None = None,
        after_seq: int | None = None,
        limit: int | None = 50,
        newest_first: bool = True,
        attempt_open: bool = False,
    ) -> builtins.list[Job]:
        """Jobs matching every filter given, by sequence, at most ``limit`` (None: all). ``attempt_open``
        keeps only jobs whose current attempt is not closed (``attempt_started_at_s`` set: started, not yet
        charged)."""
        q = select(JobRow)
        if attempt_open:
            q = q.where(JobRow.attempt_started_at_s.is_not(None))
        if tenant_id is not None:
            q = q.where(JobRow.tenant_id == tenant_id)
        if states:
            q = q.where(JobRow.state.in_(list(states)))
        if name is not None:
            q = q.where(JobRow.name == name)
        if before_seq is not None:
            q = q.where(JobRow.seq < before_seq)
        if after_seq is not None:
            q = q.where(JobRow.seq > after_seq)
        q = q.order_by(JobRow.seq.desc() if newest_first else JobRow.seq.asc()).limit(limit)
        return [_job(r) for r in self.s.scalars(q)]

    def counts_by_tenant(self, states: Sequence[str]) -> dict[str, int]:
        """How many jobs each tenant has in ``states`` (one GROUP BY; tenants with none are left out)."""
        rows = self.s.execute(
            select(JobRow.tenant_id, func.count())
            .where(JobRow.state.in_(list(states)))
            .group_by(JobRow.tenant_id)
        )
        return {str(t): int(n) for t, n in rows}

    def count(self, *, tenant_id: str | None = None, states: Sequence[str] | None = None) -> int:
        q = select(func.count()).select_from(JobRow)
        if tenant_id is not None:
            q = q.where(JobRow.tenant_id == tenant_id)
        if states:
            q = q.where(JobRow.state.in_(list(states)))
        return int(self.s.scalar(q) or 0)

    def devices_in_use(self, *, by: Literal["pool", "tenant"]) -> dict[str, int]:
        """Devices held by placed active jobs (starting, running), summed per pool name or tenant id."""
        states = [st.value for st in ACTIVE_STATES]
        used: dict[str, int] = {}
        for j in self.list(states=states, limit=100_000):
            if j.placement is not None:
                k = j.placement.pool if by == "pool" else j.tenant_id
                used[k] = used.get(k, 0) + j.placement.devices
        return used

    def counts_by_state(self) -> dict[str, int]:
        rows = self.s.execute(select(JobRow.state, func.count()).group_by(JobRow.state))
        return {state: int(n) for state, n in rows}

    def update(self, job_id: str, **fields: Any) -> None:
        if "state" in fields and isinstance(fields["state"], JobState):
            fields["state"] = fields["state"].value
        if "placement" in fields and isinstance(fields["placement"], Placement):
            fields["placement"] = fields["placement"].to_dict()
        self.s.execute(update(JobRow).where(JobRow.id == job_id).values(**fields))

    def ids_in_state(self, state: JobState, limit: int) -> builtins.list[tuple[str, str]]:
        """(id, spec_sha256) of up to ``limit`` jobs in ``state``, oldest first (no documents loaded)."""
        rows = self.s.connection().execute(_PENDING_DIGESTS, {"state": state.value, "limit": limit})
        return [(str(i), str(d)) for i, d in rows]

    def spec_of(self, job_id: str) -> dict[str, Any] | None:
        spec = self.s.connection().execute(_SPEC_OF, {"id": job_id}).scalar_one_or_none()
        return dict(spec) if spec is not None else None

    def update_many_if_state(
        self, job_ids: Sequence[str], current: JobState, **fields: Any
    ) -> builtins.list[str]:
        """Set ``fields`` on those of ``job_ids`` still in state ``current`` (one UPDATE … RETURNING, the same
        values for all; on PostgreSQL it waits for and re-checks rows locked by a concurrent change).
        Returns the ids that were updated, in the order given."""
        if not job_ids:
            return []
        if "state" in fields and isinstance(fields["state"], JobState):
            fields["state"] = fields["state"].value
        stmt = (
            update(_JOBS)
            .where(_JOBS.c.id.in_(list(job_ids)), _JOBS.c.state == current.value)
            .values(**fields)
            .returning(_JOBS.c.id)
        )
        done = {str(i) for i in self.s.connection().execute(stmt).scalars()}
        return [i for i in job_ids if i in done]

    def update_if_state(self, job_id: str, state: JobState, **fields: Any) -> bool:
        """Change fields only while the job is still in ``state`` (no state change, no event)."""
        res = self.s.execute(
            update(JobRow).where(JobRow.id == job_id, JobRow.state == state.value).values(**fields)
        )
        return bool(getattr(res, "rowcount", 0))


class EventRepo:
    def __init__(self, s: Session) -> None:
        self.s = s

    def append(self, job_id: str, kind: str, data: dict[str, Any], time_s: float) -> None:
        self.s.connection().execute(
            _INSERT_EVENT, {"job_id": job_id, "kind": kind, "data": data, "time_s": time_s}
        )

    def append_to_each(self, job_ids: Sequence[str], kind: str, data: dict[str, Any], time_s: float) -> None:
        """Append the same event to every job of ``job_ids`` (one INSERT … SELECT, the data encoded once)."""
        if job_ids:
            self.s.connection().execute(
                _INSERT_SAME_EVENT, {"ids": list(job_ids), "kind": kind, "data": data, "time_s": time_s}
            )

    def count(self, job_id: str, kind: str) -> int:
        """How many events of ``kind`` the job has (one COUNT, no event loaded)."""
        q = (
            select(func.count())
            .select_from(JobEventRow)
            .where(JobEventRow.job_id == job_id, JobEventRow.kind == kind)
        )
        return int(self.s.scalar(q) or 0)

    def list(self, job_id: str, *, after_id: int = 0, limit: int = 1000) -> builtins.list[JobEvent]:
        q = (
            select(JobEventRow)
            .where(JobEventRow.job_id == job_id, JobEventRow.id > after_id)
            .order_by(JobEventRow.id)
            .limit(limit)
        )
        return [
            JobEvent(id=r.id, job_id=r.job_id, kind=r.kind, data=r.data, time_s=r.time_s)
            for r in self.s.scalars(q)
        ]


class PoolRepo:
    def __init__(self, s: Session) -> None:
        self.s = s

    def upsert(self, name: str, doc: dict[str, Any], source: str, now_s: float) -> PoolRecord:
        row = self.s.get(PoolRow, name, with_for_update=True)
        if row is None:
            row = PoolRow(name=name, doc=doc, source=source, updated_at_s=now_s)
            self.s.add(row)
        else:
            row.doc = doc
            row.source = source
            row.updated_at_s = now_s
        self.s.flush()
        return PoolRecord(name=row.name, doc=row.doc, source=row.source, updated_at_s=row.updated_at_s)

    def get(self, name: str) -> PoolRecord | None:
        row = self.s.get(PoolRow, name)
        return (
            PoolRecord(name=row.name, doc=row.doc, source=row.source, updated_at_s=row.updated_at_s)
            if row
            else None
        )

    def list(self) -> builtins.list[PoolRecord]:
        return [
            PoolRecord(name=r.name, doc=r.doc, source=r.source, updated_at_s=r.updated_at_s)
            for r in self.s.scalars(select(PoolRow).order_by(PoolRow.name))
        ]

    def delete(self, name: str) -> bool:
        row = self.s.get(PoolRow, name)
        if row is None:
            return False
        self.s.delete(row)
        return True


class StepTimeRepo:
    """Measured step times per job attempt (one row per attempt; a repeated attempt is ignored)."""

    def __init__(self, s: Session) -> None:
        self.s = s

    def add(self, doc: dict[str, Any]) -> bool:
        """Store one attempt's measurement; False when that (job, attempt) is already stored."""
        exists = self.s.scalar(
            select(StepTimeMeasurementRow.id).where(
                StepTimeMeasurementRow.job_id == doc["job_id"],
                StepTimeMeasurementRow.attempt == doc["attempt"],
            )
        )
        if exists is not None:
            return False
        self.s.connection().execute(insert(StepTimeMeasurementRow), doc)
        return True

    def list(self, *, after_id: int = 0, limit: int = 10_000) -> builtins.list[dict[str, Any]]:
        """Rows with an id above ``after_id``, oldest first, as plain documents (with their ``id``)."""
        q = (
            select(StepTimeMeasurementRow)
            .where(StepTimeMeasurementRow.id > after_id)
            .order_by(StepTimeMeasurementRow.id)
            .limit(limit)
        )
        return [_measurement(r) for r in self.s.scalars(q)]

    def recent(self, limit: int) -> builtins.list[dict[str, Any]]:
        """The newest ``limit`` rows, oldest first."""
        q = select(StepTimeMeasurementRow).order_by(StepTimeMeasurementRow.id.desc()).limit(limit)
        return [_measurement(r) for r in reversed(list(self.s.scalars(q)))]


def _measurement(r: StepTimeMeasurementRow) -> dict[str, Any]:
    return {
        "id": r.id,
        "job_id": r.job_id,
        "attempt": r.attempt,
        "pool": r.pool,
        "accelerator": r.accelerator,
        "devices": r.devices,
        "spec": r.spec,
        "median_step_time_s": r.median_step_time_s,
        "samples": r.samples,
        "step_times_s": list(r.step_times_s),
        "measured_at_s": r.measured_at_s,
    }
