"""Token-bucket rate limits (GCRA: one number per bucket, its theoretical arrival time).

A bucket of ``rate`` tokens per second holding at most ``burst`` tokens admits a request of ``n``
tokens when ``max(tat, now) + n / rate - now <= burst / rate``, and then moves ``tat`` to that value.
This is exactly a token bucket, with one stored number and one conditional write per request.

Two stores: in process (the embedded default: a dict under a lock) and the database (one
``INSERT … ON CONFLICT DO UPDATE … WHERE … RETURNING`` statement on SQLite or PostgreSQL), which every
server process on that database shares.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, Protocol, cast

from sqlalchemy import Table, bindparam, func, select

from trainyard.store.db import Database
from trainyard.store.governance_models import RateBucketRow

_BUCKETS = cast(Table, RateBucketRow.__table__)


@dataclass(frozen=True)
class Decision:
    allowed: bool
    limit: float  # tokens per second
    burst: float
    remaining: int  # whole tokens left after this request
    reset_s: float  # seconds until the bucket is full again
    retry_after_s: float  # seconds until this request would be admitted (0 when allowed)

    def headers(self) -> dict[str, str]:
        h = {
            "X-RateLimit-Limit": _num(self.limit),
            "X-RateLimit-Burst": _num(self.burst),
            "X-RateLimit-Remaining": str(max(0, self.remaining)),
            "X-RateLimit-Reset": str(max(0, math.ceil(self.reset_s))),
        }
        if not self.allowed:
            h["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
        return h


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _decide(
    tat: float | None, now: float, rate: float, burst: float, n: float
) -> tuple[bool, float, Decision]:
    """(allowed, new tat, decision) for a bucket whose arrival time is ``tat`` (None: never used)."""
    interval = n / rate
    tau = burst / rate
    base = now if tat is None else max(tat, now)
    new_tat = base + interval
    if new_tat - now <= tau + 1e-9:
        remaining = math.floor((tau - (new_tat - now)) * rate + 1e-9)
        return True, new_tat, Decision(True, rate, burst, remaining, new_tat - now, 0.0)
    retry = new_tat - now - tau
    remaining = math.floor(max(0.0, tau - (base - now)) * rate + 1e-9)
    return False, base, Decision(False, rate, burst, remaining, base - now, retry)


class BucketStore(Protocol):
    shared: bool

    def take(self, key: str, *, rate: float, burst: float, now: float, n: float = 1.0) -> Decision: ...


class MemoryBuckets:
    """Buckets of this process only."""

    shared = False

    def __init__(self) -> None:
        self._tat: dict[str, float] = {}
        self._lock = threading.Lock()

    def take(self, key: str, *, rate: float, burst: float, now: float, n: float = 1.0) -> Decision:
        with self._lock:
            allowed, new_tat, d = _decide(self._tat.get(key), now, rate, burst, n)
            if allowed:
                if len(self._tat) > 100_000:
                    self._tat = {k: t for k, t in self._tat.items() if t > now}
                self._tat[key] = new_tat
        return d


class DatabaseBuckets:
    """Buckets in the ``rate_buckets`` table: every server process on the database shares them."""

    shared = True

    def __init__(self, db: Database) -> None:
        self.db = db
        dialect = db.dialect
        dialect_insert: Any
        greatest: Any
        if dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            dialect_insert, greatest = pg_insert, func.greatest
        else:
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert

            dialect_insert, greatest = sqlite_insert, func.max
        ins = dialect_insert(_BUCKETS).values(key=bindparam("key"), tat_s=bindparam("first_tat"))
        new_tat = greatest(_BUCKETS.c.tat_s, bindparam("now")) + bindparam("interval")
        self._take = ins.on_conflict_do_update(
            index_elements=[_BUCKETS.c.key],
            set_={"tat_s": new_tat},
            where=new_tat - bindparam("now") <= bindparam("tau"),
        ).returning(_BUCKETS.c.tat_s)
        self._read = select(_BUCKETS.c.tat_s).where(_BUCKETS.c.key == bindparam("key"))

    def take(self, key: str, *, rate: float, burst: float, now: float, n: float = 1.0) -> Decision:
        interval = n / rate
        tau = burst / rate + 1e-9
        params = {"key": key, "first_tat": now + interval, "now": now, "interval": interval, "tau": tau}
        with self.db.write_connection(single_statement=True) as conn:
            row = conn.execute(self._take, params).first()
            if row is not None:
                tat = float(row[0])
                remaining = math.floor((burst / rate - (tat - now)) * rate + 1e-9)
                return Decision(True, rate, burst, remaining, tat - now, 0.0)
            cur = conn.execute(self._read, {"key": key}).scalar()
        _, _, d = _decide(float(cur) if cur is not None else None, now, rate, burst, n)
        if d.allowed:  # refilled between the two statements: refuse this one anyway, retry at once
            return Decision(False, rate, burst, 0, 0.0, 0.01)
        return d


class RateLimiter:
    """Per-tenant and per-key request buckets over one store."""

    def __init__(self, store: BucketStore) -> None:
        self.store = store

    def check(
        self,
        *,
        tenant_id: str,
        key_id: str,
        tenant_rps: float | None,
        tenant_burst: float | None,
        key_rps: float | None,
        now: float,
    ) -> Decision | None:
        """The tightest decision over the buckets that apply (None when no limit applies). A request
        refused by one bucket does not consume the others' tokens beyond the first one checked."""
        decision: Decision | None = None
        if key_rps is not None and key_rps > 0:
            decision = self.store.take(f"k:{key_id}", rate=key_rps, burst=max(1.0, key_rps), now=now)
            if not decision.allowed:
                return decision
        if tenant_rps is not None and tenant_rps > 0:
            burst = tenant_burst if tenant_burst is not None and tenant_burst >= 1 else max(1.0, tenant_rps)
            d = self.store.take(f"t:{tenant_id}", rate=tenant_rps, burst=burst, now=now)
            if decision is None or not d.allowed or d.remaining < decision.remaining:
                decision = d
        return decision


def make_store(db: Database, backend: str) -> BucketStore:
    """``memory``, ``database`` or ``auto`` (the database on PostgreSQL, where several server processes
    may share it; in process on the embedded SQLite default)."""
    if backend == "memory":
        return MemoryBuckets()
    if backend == "database" or (backend == "auto" and db.dialect == "postgresql"):
        return DatabaseBuckets(db)
    if backend == "auto":
        return MemoryBuckets()
    from trainyard.errors import InvalidInputError

    raise InvalidInputError(
        f"TRAINYARD_RATE_LIMIT_BACKEND {backend!r} is not supported",
        hint="Use auto, memory or database.",
    )
