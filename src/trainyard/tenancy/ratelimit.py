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
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from sqlalchemy import Table, bindparam, func, select, update

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

    def adjust(self, key: str, *, rate: float, burst: float, now: float, n: float) -> None:
        """Take ``n`` more tokens (``n`` < 0: give them back) unconditionally: a reservation settled
        with what it really used."""
        ...


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

    def adjust(self, key: str, *, rate: float, burst: float, now: float, n: float) -> None:
        if n == 0:
            return
        with self._lock:
            tat = self._tat.get(key)
            if tat is not None:
                self._tat[key] = tat + n / rate


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
        self._adjust = (
            update(_BUCKETS)
            .where(_BUCKETS.c.key == bindparam("b_key"))
            .values(tat_s=_BUCKETS.c.tat_s + bindparam("delta"))
        )

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

    def adjust(self, key: str, *, rate: float, burst: float, now: float, n: float) -> None:
        if n == 0:
            return
        with self.db.write_connection(single_statement=True) as conn:
            conn.execute(self._adjust, {"b_key": key, "delta": n / rate})


LEASE_S = 0.05  # a request lease holds at most this many seconds' worth of the rate
LEASE_HOLD_S = 1.0  # and is served from for at most this long


@dataclass
class _Lease:
    rate: float
    burst: float
    tokens: float  # taken from the shared bucket, not yet used
    expires_s: float
    shared_remaining: int  # the shared bucket's whole tokens left when the lease was taken
    granted: float = 0.0  # tokens put into it (taken or given back); granted - tokens were used


class LeasedBuckets:
    """Shared buckets (:class:`DatabaseBuckets`) served from this process between statements.

    A bucket of ``rate`` tokens/s hands a process ``floor(min(burst, rate x lease_s))`` tokens (or what
    the request needs, when that is more) in one statement when it has them; the process then admits
    from that lease, in memory, for at most ``hold_s`` (by default ``lease_s``: TPM_LEASE_S for
    inference tokens; LEASE_HOLD_S for requests, whose leases hold LEASE_S worth of the rate), and
    forgets what is left after that (other processes are refused a little early, never admitted
    more). Settling a reservation (:meth:`adjust`) is in memory too: tokens
    given back go into the lease, or into one of their own that lasts ``hold_s``; tokens used beyond
    a reservation come out of the lease, or are a debt taken with the next lease.

    Every token admitted anywhere was taken from the one shared bucket, or given back, within
    ``hold_s`` before, and nothing is ever returned to the shared bucket; so whatever the number of
    server processes, the tokens admitted in any window of T seconds, less those given back from
    ``hold_s`` before it to its end, are at most ``burst + rate x (T + hold_s)``. Tokens taken before
    the window and admitted in it are also at most what the processes' live leases held when it
    began, one lease (``rate x lease_s``) per process and bucket; for requests (no give-backs) that
    is ``burst + rate x T + P x rate x LEASE_S`` with P server processes, over a minute 0.08 % of the
    bucket more per process (and never more than 1.7 %), and exactly the bucket where a lease would
    be one token (slow rates, as in the admin-set limits of most tenants), which is taken
    directly."""

    shared = True

    def __init__(
        self,
        inner: DatabaseBuckets,
        lease_s: float = LEASE_S,
        adaptive: bool = False,
        hold_s: float | None = None,
    ) -> None:
        self.inner = inner
        self.lease_s = lease_s
        self.hold_s = lease_s if hold_s is None else hold_s
        # adaptive: a lease is at most twice what this process used of its previous one (and at least
        # a sixteenth of the full lease), so that processes using a little of the rate each do not
        # lease (and let lapse) a full share each
        self.adaptive = adaptive
        self._leases: dict[str, _Lease] = {}
        self._fetching: dict[str, threading.Lock] = {}
        # tokens used beyond reservations, owed to the shared bucket: taken with the next lease
        self._debt: dict[str, float] = {}
        self._lock = threading.Lock()

    def lease_size(self, rate: float, burst: float) -> int:
        return max(1, math.floor(min(burst, rate * self.lease_s) + 1e-9))

    def take_local(
        self, key: str, *, rate: float, burst: float, now: float, n: float = 1.0
    ) -> Decision | None:
        """The decision from this process's lease, or None when the shared bucket has to be asked."""
        with self._lock:
            lease = self._leases.get(key)
            if (
                lease is None
                or lease.expires_s <= now
                or lease.rate != rate
                or lease.burst != burst
                or lease.tokens < n
            ):
                return None
            lease.tokens -= n
            remaining = lease.shared_remaining + math.floor(lease.tokens)
        return Decision(True, rate, burst, remaining, burst / rate, 0.0)

    def take(self, key: str, *, rate: float, burst: float, now: float, n: float = 1.0) -> Decision:
        local = self.take_local(key, rate=rate, burst=burst, now=now, n=n)
        if local is not None:
            return local
        size = self.lease_size(rate, burst)
        with self._lock:
            held = key in self._debt or key in self._leases
        if size <= n and not held:
            return self.inner.take(key, rate=rate, burst=burst, now=now, n=n)
        with self._lock:
            fetching = self._fetching.setdefault(key, threading.Lock())
        with fetching:  # one lease request per bucket at a time; the others then use its tokens
            local = self.take_local(key, rate=rate, burst=burst, now=now, n=n)
            if local is not None:
                return local
            with self._lock:  # what the live lease still has goes towards this request
                debt = self._debt.get(key, 0.0)
                lease = self._leases.get(key)
                have = 0.0
                if self.adaptive and lease is not None and (lease.rate, lease.burst) == (rate, burst):
                    used = lease.granted - max(0.0, lease.tokens)
                    size = max(1, math.floor(min(size, max(size / 16.0, 2.0 * used)) + 1e-9))
                if lease is not None and lease.expires_s > now and (lease.rate, lease.burst) == (rate, burst):
                    have = max(0.0, min(lease.tokens, n))
                    lease.tokens -= have
            need = n - have
            got = max(float(size), need)
            # what answers used beyond their reservations is taken with the next lease (up to a full
            # bucket; more than that is forgiven, as a full bucket forgets it too)
            pay = min(debt, max(0.0, burst - got))
            d: Decision | None = None
            if got > need or pay > 0:
                d = self.inner.take(key, rate=rate, burst=burst, now=now, n=got + pay)
                if d.allowed:
                    self._install(key, rate, burst, now, got - need, d.remaining, pay)
                    return Decision(True, rate, burst, d.remaining + math.floor(got - need), d.reset_s, 0.0)
            if d is None or got > need:
                pay = min(debt, max(0.0, burst - need))
                d = self.inner.take(key, rate=rate, burst=burst, now=now, n=need + pay)
                if d.allowed:
                    self._install(key, rate, burst, now, 0.0, d.remaining, pay)
                    return d
            if have > 0:  # refused: the lease keeps its tokens
                with self._lock:
                    if self._leases.get(key) is lease and lease is not None:
                        lease.tokens += have
            return d

    def _install(
        self, key: str, rate: float, burst: float, now: float, tokens: float, remaining: int, paid: float
    ) -> None:
        """Keep ``tokens`` just taken from the shared bucket as this process's lease; ``paid`` of the
        debt was taken with them."""
        with self._lock:
            if paid > 0:
                left = self._debt.get(key, 0.0) - paid
                if left > 1e-9:
                    self._debt[key] = left
                else:
                    self._debt.pop(key, None)
            if len(self._leases) > 100_000:
                self._leases = {k: v for k, v in self._leases.items() if v.expires_s > now}
                self._fetching = {k: v for k, v in self._fetching.items() if k in self._leases}
            old = self._leases.get(key)
            if (
                old is not None
                and old.tokens > 1e-9
                and old.expires_s > now
                and (old.rate, old.burst) == (rate, burst)
            ):
                # tokens still held are kept, all ending when the older ones do
                old.tokens += tokens
                old.granted += tokens
                old.shared_remaining = remaining
            elif tokens > 0:
                self._leases[key] = _Lease(rate, burst, tokens, now + self.hold_s, remaining, tokens)

    def adjust(self, key: str, *, rate: float, burst: float, now: float, n: float) -> None:
        """Settle a reservation in memory, with no statement (see the class notes)."""
        if n == 0:
            return
        with self._lock:
            lease = self._leases.get(key)
            live = lease is not None and lease.expires_s > now and (lease.rate, lease.burst) == (rate, burst)
            if n < 0:
                if live and lease is not None and lease.tokens > 1e-9:
                    lease.tokens -= n
                    lease.granted -= n
                else:  # held for hold_s from now, like a lease
                    self._leases[key] = _Lease(rate, burst, -n, now + self.hold_s, 0, -n)
                return
            if live and lease is not None:
                used = min(n, max(0.0, lease.tokens))
                lease.tokens -= used
                n -= used
                if n <= 0:
                    return
            if len(self._debt) > 100_000:
                self._debt.clear()
            self._debt[key] = min(burst, self._debt.get(key, 0.0) + n)


TPM_LEASE_S = 1.0  # a process serves inference tokens taken ahead from the shared bucket for this long


class TokenBuckets:
    """Inference tokens per minute per tenant (DESIGN §3.10): a request reserves its estimated prompt
    tokens plus ``max_tokens`` at admission and settles with the tokens it really used after the
    response (the difference moves the bucket). A bucket of ``tokens_per_minute`` holds one minute of
    tokens; a request larger than that reserves the whole bucket (it waits for a full bucket instead
    of never being admitted).

    The store is the request-rate limiter's (:func:`make_store`; :func:`token_store`): in process
    (the embedded default), or the shared database bucket leased in batches (:class:`LeasedBuckets`
    with a lease of TPM_LEASE_S, ``tokens_per_minute / 60`` tokens), which every server process on the
    database draws from. Admission is then served from this process's lease in memory, on the event
    loop; only a request the lease cannot cover takes one statement (off the loop: :meth:`areserve`),
    and each statement that admits takes at least a lease, so one tenant costs the database about one
    admitting statement per TPM_LEASE_S in all, whatever the number of processes and requests.
    Settling is in memory (:meth:`LeasedBuckets.adjust`). Bound: over any window of T seconds, the
    tokens reserved by all processes together, less those given back from TPM_LEASE_S before it to
    its end, are at most ``burst + rate x (T + TPM_LEASE_S)`` — over a minute at most 1/60 (1.7 %) of
    the limit more than one bucket alone — plus, as with one bucket, what answers used beyond their
    reservations."""

    def __init__(self, store: BucketStore | None = None, clock: Callable[[], float] = time.time) -> None:
        self.store: BucketStore = store if store is not None else MemoryBuckets()
        self.clock = clock  # wall time: shared buckets compare it across processes

    @staticmethod
    def shape(tokens_per_minute: float) -> tuple[float, float]:
        """(rate in tokens/s, burst in tokens)."""
        return tokens_per_minute / 60.0, float(tokens_per_minute)

    def reserve(
        self, key: str, *, tokens_per_minute: float, n: float, now: float | None = None
    ) -> tuple[Decision, float]:
        """(decision, tokens reserved) for a request that may use ``n`` tokens (may run a statement)."""
        rate, burst = self.shape(tokens_per_minute)
        n = max(1.0, min(float(n), burst))
        d = self.store.take(key, rate=rate, burst=burst, now=self.clock() if now is None else now, n=n)
        return d, (n if d.allowed else 0.0)

    def reserve_local(
        self, key: str, *, tokens_per_minute: float, n: float, now: float | None = None
    ) -> tuple[Decision, float] | None:
        """:meth:`reserve` when it needs no database statement (an in-process store, or a lease that
        covers the request); None when :meth:`reserve` has to ask the shared bucket."""
        store = self.store
        if isinstance(store, LeasedBuckets):
            rate, burst = self.shape(tokens_per_minute)
            n = max(1.0, min(float(n), burst))
            d = store.take_local(key, rate=rate, burst=burst, now=self.clock() if now is None else now, n=n)
            return None if d is None else (d, n)
        if store.shared:
            return None
        return self.reserve(key, tokens_per_minute=tokens_per_minute, n=n, now=now)

    async def areserve(self, key: str, *, tokens_per_minute: float, n: float) -> tuple[Decision, float]:
        """:meth:`reserve` for the event loop: from memory when it can, else in the thread pool."""
        local = self.reserve_local(key, tokens_per_minute=tokens_per_minute, n=n)
        if local is not None:
            return local
        from starlette.concurrency import run_in_threadpool

        return await run_in_threadpool(lambda: self.reserve(key, tokens_per_minute=tokens_per_minute, n=n))

    def settle(
        self,
        key: str,
        *,
        tokens_per_minute: float,
        reserved: float,
        used: float,
        now: float | None = None,
    ) -> None:
        """Replace a reservation by the tokens used (fewer give tokens back; more take them)."""
        rate, burst = self.shape(tokens_per_minute)
        delta = float(used) - float(reserved)
        if delta == 0:
            return
        self.store.adjust(key, rate=rate, burst=burst, now=self.clock() if now is None else now, n=delta)


def token_store(requests: BucketStore) -> BucketStore:
    """The store of the tokens-per-minute buckets beside the request-rate limiter's ``requests``: the
    same in-process buckets, or the same shared database buckets leased for TPM_LEASE_S."""
    if isinstance(requests, LeasedBuckets):
        return LeasedBuckets(requests.inner, lease_s=TPM_LEASE_S, adaptive=True)
    return requests


class RateLimiter:
    """Per-tenant and per-key request buckets over one store."""

    def __init__(self, store: BucketStore) -> None:
        self.store = store

    def check_local(self, **args: Any) -> tuple[bool, Decision | None]:
        """(decided, decision) without a database statement: decided when no limit applies, the store
        is in process, or every bucket that applies can be served from this process's leases (then
        they are taken). Not decided: call :meth:`check` (off the event loop)."""
        store = self.store
        if not isinstance(store, LeasedBuckets):
            if store.shared:
                if not _limits(args):
                    return True, None
                return False, None
            return True, self.check(**args)
        buckets = _limits(args)
        if not buckets:
            return True, None
        now = args["now"]
        with store._lock:
            for key, rate, burst in buckets:
                lease = store._leases.get(key)
                if lease is None or lease.expires_s <= now or lease.rate != rate or lease.burst != burst:
                    return False, None
                if lease.tokens < 1:
                    return False, None
        # every bucket has a live lease with a token: take them (a concurrent taker may have emptied
        # one in between, in which case this falls back to the full check)
        decision: Decision | None = None
        for key, rate, burst in buckets:
            d = store.take_local(key, rate=rate, burst=burst, now=now)
            if d is None:
                return False, None
            if decision is None or d.remaining < decision.remaining:
                decision = d
        return True, decision

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


def _limits(args: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(bucket key, rate, burst) of the buckets :meth:`RateLimiter.check` takes, in its order."""
    out: list[tuple[str, float, float]] = []
    key_rps = args.get("key_rps")
    if key_rps is not None and key_rps > 0:
        out.append((f"k:{args['key_id']}", key_rps, max(1.0, key_rps)))
    tenant_rps = args.get("tenant_rps")
    if tenant_rps is not None and tenant_rps > 0:
        tb = args.get("tenant_burst")
        out.append(
            (f"t:{args['tenant_id']}", tenant_rps, tb if tb is not None and tb >= 1 else max(1.0, tenant_rps))
        )
    return out


def make_store(db: Database, backend: str) -> BucketStore:
    """``memory``, ``database`` or ``auto`` (the database on PostgreSQL, where several server processes
    may share it; in process on the embedded SQLite default)."""
    if backend == "memory":
        return MemoryBuckets()
    if backend == "database" or (backend == "auto" and db.dialect == "postgresql"):
        return LeasedBuckets(DatabaseBuckets(db), hold_s=LEASE_HOLD_S)
    if backend == "auto":
        return MemoryBuckets()
    from trainyard.errors import InvalidInputError

    raise InvalidInputError(
        f"TRAINYARD_RATE_LIMIT_BACKEND {backend!r} is not supported",
        hint="Use auto, memory or database.",
    )
