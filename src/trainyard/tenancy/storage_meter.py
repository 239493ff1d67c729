"""Storage metering: the bytes that datasets, checkpoints and models occupy, billed as GB-hours.

Time is cut into fixed intervals ``[k·I, (k+1)·I)`` (``I`` = ``storage_accrual_interval_s``). Once an
interval is over, every resource that existed during it is charged ``bytes / 1e9 × overlap_s / 3600``
GB-hours, where the overlap is the part of the interval between the resource's creation and its removal.
Each charge is one ledger entry whose ``source_key`` is ``storage:<kind>:<resource>:<interval start>``,
so a tick that is repeated (a restart, a second server process, a clock that went back) writes nothing
twice: the database refuses the duplicate. After ``storage_accrual_interval_s`` changes, the first new
interval can begin before the end of the last one billed; it is charged from that end on, and keyed by
it, so neither that part is billed twice nor does its key meet an old interval's.

Sizes come from what the store already records, never from walking the storage: a dataset version's
``bytes``, a model version's ``doc.bytes`` (measured at registration) and each checkpoint's ``bytes``
(from the runtime's checkpoint event, which also names the steps retention deleted). A resource that is
gone from the store, or a checkpoint marked removed, stops accruing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Connection, Table, func, select

from trainyard.store.datasets_models import DatasetVersionRow
from trainyard.store.governance_models import LedgerEntryRow
from trainyard.store.models import JobRow, TenantRow
from trainyard.store.registry_models import ModelVersionRow
from trainyard.tenancy import ledger

BYTES_PER_GB = 1e9
HOURS_PER_MONTH = 730.0
# the first tick on a database with no storage entries bills at most this many intervals back
MAX_BACKFILL_INTERVALS = 24 * 31

_LEDGER = cast(Table, LedgerEntryRow.__table__)


@dataclass(frozen=True)
class StoredResource:
    """One thing occupying storage: ``kind`` is dataset | checkpoint | model."""

    kind: str
    key: str  # unique within its kind, stable over time (part of the ledger's source key)
    tenant_id: str
    bytes: int
    created_s: float
    removed_s: float | None = None
    job_id: str | None = None
    model: str | None = None
    tags: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Accrual:
    resource: StoredResource
    interval_start_s: float
    interval_end_s: float
    gb_hours: float

    @property
    def source_key(self) -> str:
        r = self.resource
        return f"storage:{r.kind}:{r.key}:{round(self.interval_start_s)}"


def last_boundary_s(now_s: float, interval_s: float) -> float:
    """End of the last interval that is complete at ``now_s``."""
    return math.floor(now_s / interval_s) * interval_s


def accruals(
    resources: Iterable[StoredResource], *, after_s: float | None, now_s: float, interval_s: float
) -> Iterator[Accrual]:
    """The charges of every complete interval that ends after ``after_s`` (the end of the last interval
    already billed; None: nothing was) and by ``now_s``, for each resource that existed during it."""
    end = last_boundary_s(now_s, interval_s)
    floor_s = end - MAX_BACKFILL_INTERVALS * interval_s if after_s is None else after_s
    for r in resources:
        if r.bytes <= 0:
            continue
        lo = max(floor_s, r.created_s)
        hi = end if r.removed_s is None else min(end, r.removed_s)
        if hi <= lo:
            continue
        k = math.floor(lo / interval_s)
        while k * interval_s < hi:
            a, b = k * interval_s, (k + 1) * interval_s
            k += 1
            if b > end or (after_s is not None and b <= after_s):
                continue
            # an interval that began before the last billed end (only when the interval length changed
            # since) is charged from that end on, under that end's key: its earlier part is billed already
            start = a if after_s is None else max(a, after_s)
            overlap = min(b, hi) - max(start, r.created_s)
            if overlap <= 0:
                continue
            yield Accrual(r, start, b, r.bytes / BYTES_PER_GB * overlap / 3600.0)


def usd_per_gb_hour(price_usd_per_gb_month: float) -> float:
    return price_usd_per_gb_month / HOURS_PER_MONTH


def stored_resources(conn: Connection) -> list[StoredResource]:
    """Every dataset version, retained checkpoint and model version with a recorded size."""
    out: list[StoredResource] = []
    ds = cast(Table, DatasetVersionRow.__table__)
    for seq, tenant_id, size, created in conn.execute(
        select(ds.c.seq, ds.c.tenant_id, ds.c.bytes, ds.c.created_at_s)
    ):
        out.append(StoredResource("dataset", str(seq), str(tenant_id), int(size or 0), float(created)))
    jobs = cast(Table, JobRow.__table__)
    job_tags: dict[str, dict[str, Any]] = {}
    for job_id, tenant_id, spec, checkpoints in conn.execute(
        select(jobs.c.id, jobs.c.tenant_id, jobs.c.spec, jobs.c.checkpoints)
    ):
        tags = {str(k): str(v) for k, v in ((spec or {}).get("tags") or {}).items()}
        job_tags[str(job_id)] = tags
        for c in checkpoints or ():
            if not isinstance(c.get("bytes"), int) or c.get("time_s") is None:
                continue
            out.append(
                StoredResource(
                    "checkpoint",
                    f"{job_id}:{c.get('attempt')}:{c.get('step')}",
                    str(tenant_id),
                    int(c["bytes"]),
                    float(c["time_s"]),
                    removed_s=float(c["removed_at_s"]) if c.get("removed_at_s") is not None else None,
                    job_id=str(job_id),
                    tags=tags,
                )
            )
    mv = cast(Table, ModelVersionRow.__table__)
    for seq, tenant_id, name, version, doc, source_job, created in conn.execute(
        select(
            mv.c.seq, mv.c.tenant_id, mv.c.name, mv.c.version, mv.c.doc, mv.c.source_job, mv.c.created_at_s
        )
    ):
        size = (doc or {}).get("bytes")
        if not isinstance(size, int):
            continue
        out.append(
            StoredResource(
                "model",
                str(seq),
                str(tenant_id),
                size,
                float(created),
                job_id=str(source_job) if source_job else None,
                model=f"{name}@{version}",
                tags=job_tags.get(str(source_job), {}) if source_job else {},
            )
        )
    return out


def billed_until_s(conn: Connection) -> float | None:
    """End of the last interval billed (the latest storage entry's time), or None."""
    v = conn.execute(select(func.max(_LEDGER.c.time_s)).where(_LEDGER.c.kind == ledger.KIND_STORAGE)).scalar()
    return None if v is None else float(v)


def accrue(conn: Connection, *, now_s: float, interval_s: float, price_usd_per_gb_month: float) -> int:
    """Bill every complete interval not yet billed, in the caller's transaction; the number of entries
    written (a repeated call writes none)."""
    end = last_boundary_s(now_s, interval_s)
    after = billed_until_s(conn)
    if after is not None and end <= after:
        return 0
    tenants = cast(Table, TenantRow.__table__)
    names = {str(i): str(n) for i, n in conn.execute(select(tenants.c.id, tenants.c.name))}
    unit_price = usd_per_gb_hour(price_usd_per_gb_month)
    written = 0
    for a in accruals(stored_resources(conn), after_s=after, now_s=now_s, interval_s=interval_s):
        r = a.resource
        if r.tenant_id not in names:
            continue
        written += ledger.charge(
            conn,
            ledger.Charge(
                source_key=a.source_key,
                tenant_id=r.tenant_id,
                kind=ledger.KIND_STORAGE,
                quantity=a.gb_hours,
                unit="gb_hours",
                unit_price_usd=unit_price,
                usd=a.gb_hours * unit_price,
                time_s=a.interval_end_s,
                job_id=r.job_id,
                model=r.model,
                tags=dict(r.tags),
            ),
            tenant_name=names[r.tenant_id],
        )
    return written


class StorageMeter:
    """Runs :func:`accrue` from the control loop, at most once per completed interval per process."""

    def __init__(
        self, db: Any, *, clock: Callable[[], float], interval_s: float, price_usd_per_gb_month: float
    ):
        self.db = db
        self.clock = clock
        self.interval_s = interval_s
        self.price = price_usd_per_gb_month
        self._done_until_s: float | None = None

    def tick(self) -> int:
        now = self.clock()
        end = last_boundary_s(now, self.interval_s)
        if self._done_until_s is not None and end <= self._done_until_s:
            return 0
        with self.db.session() as s:
            n = accrue(
                s.connection(), now_s=now, interval_s=self.interval_s, price_usd_per_gb_month=self.price
            )
        self._done_until_s = end
        return n
