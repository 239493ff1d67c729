"""Rate limits as worked examples: the GCRA bucket (admit, refuse, retry-after, remaining, reset) in
memory and in the database, leases served from memory between statements (sizes, debts, give-backs,
refusals), the request limiter's buckets per key and tenant, and the response headers. Each number is
computed by hand in the comments."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import false, select

from trainyard.errors import InvalidInputError
from trainyard.store.db import Database
from trainyard.tenancy.ratelimit import (
    LEASE_HOLD_S,
    TPM_LEASE_S,
    BucketStore,
    DatabaseBuckets,
    Decision,
    LeasedBuckets,
    MemoryBuckets,
    RateLimiter,
    TokenBuckets,
    make_store,
    token_store,
)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    d = Database(f"sqlite:///{tmp_path_factory.mktemp('rate') / 'db.sqlite'}")
    d.upgrade()
    yield d
    d.dispose()


# rate 2/s, burst 4 (tau = 2 s): the bucket's answers at each step, worked out by hand
#   t=0   n=1: tat 0.5, 0.5 <= 2 admitted, remaining floor((2 - 0.5) * 2) = 3, full again in 0.5 s
#   t=0   n=3: tat 2.0, remaining 0, reset 2.0
#   t=0   n=1: 2.5 - 0 > 2 refused, retry 0.5, remaining 0, reset 2.0
#   t=0.5 n=1: 2.5 - 0.5 = 2 <= 2 admitted (exactly full), remaining 0, reset 2.0
#   t=1   n=3: 4.0 - 1 = 3 > 2 refused, retry 1.0, remaining floor((2 - 1.5) * 2) = 1, reset 1.5
#   t=10  n=1: the bucket is full again: as at t=0
WORKED = [
    (0.0, 1.0, Decision(True, 2.0, 4.0, 3, 0.5, 0.0)),
    (0.0, 3.0, Decision(True, 2.0, 4.0, 0, 2.0, 0.0)),
    (0.0, 1.0, Decision(False, 2.0, 4.0, 0, 2.0, 0.5)),
    (0.5, 1.0, Decision(True, 2.0, 4.0, 0, 2.0, 0.0)),
    (1.0, 3.0, Decision(False, 2.0, 4.0, 1, 1.5, 1.0)),
    (10.0, 1.0, Decision(True, 2.0, 4.0, 3, 0.5, 0.0)),
]


def _run(store: BucketStore, key: str) -> list[Decision]:
    return [store.take(key, rate=2.0, burst=4.0, now=now, n=n) for now, n, _ in WORKED]


def test_memory_bucket_admits_refuses_and_refills_as_worked_out() -> None:
    assert _run(MemoryBuckets(), "k") == [d for _, _, d in WORKED]


def test_database_bucket_answers_exactly_as_the_memory_bucket(db: Database) -> None:
    assert _run(DatabaseBuckets(db), "worked") == [d for _, _, d in WORKED]


def test_a_bucket_of_ten_a_second_admits_its_three_tokens_despite_rounding() -> None:
    # 0.1 + 0.1 + 0.1 = 0.30000000000000004 > 0.3 = 3 / 10 in floating point: still exactly the burst
    m = MemoryBuckets()
    got = [m.take("k", rate=10.0, burst=3.0, now=0.0) for _ in range(4)]
    assert [(d.allowed, d.remaining) for d in got] == [(True, 2), (True, 1), (True, 0), (False, 0)]
    assert got[3].retry_after_s == pytest.approx(0.1)


def test_buckets_are_per_key_and_a_refusal_takes_nothing() -> None:
    m = MemoryBuckets()
    assert m.take("a", rate=1.0, burst=1.0, now=0.0).allowed
    assert not m.take("a", rate=1.0, burst=1.0, now=0.5).allowed
    assert m.take("b", rate=1.0, burst=1.0, now=0.5).allowed
    assert m.take("a", rate=1.0, burst=1.0, now=1.0).allowed  # the refusal at 0.5 did not push it back


def test_memory_adjust_moves_the_arrival_time_by_tokens_over_rate() -> None:
    m = MemoryBuckets()
    m.take("k", rate=2.0, burst=4.0, now=0.0, n=4.0)  # tat 2.0: empty
    m.adjust("k", rate=2.0, burst=4.0, now=0.0, n=-2.0)  # two back: tat 1.0
    d = m.take("k", rate=2.0, burst=4.0, now=0.0, n=2.0)  # tat 2.0 again
    assert d == Decision(True, 2.0, 4.0, 0, 2.0, 0.0)
    m.adjust("k", rate=2.0, burst=4.0, now=0.0, n=1.0)  # one more taken: tat 2.5
    assert m.take("k", rate=2.0, burst=4.0, now=0.5, n=1.0) == Decision(False, 2.0, 4.0, 0, 2.0, 0.5)
    m.adjust("k", rate=2.0, burst=4.0, now=0.0, n=0.0)
    m.adjust("new", rate=2.0, burst=4.0, now=0.0, n=3.0)  # no bucket yet: nothing to move
    assert m.take("new", rate=2.0, burst=4.0, now=0.0) == Decision(True, 2.0, 4.0, 3, 0.5, 0.0)


def test_database_adjust_moves_the_shared_arrival_time(db: Database) -> None:
    b = DatabaseBuckets(db)
    b.take("adj", rate=2.0, burst=4.0, now=0.0, n=4.0)
    b.adjust("adj", rate=2.0, burst=4.0, now=0.0, n=-2.0)
    assert b.take("adj", rate=2.0, burst=4.0, now=0.0, n=2.0) == Decision(True, 2.0, 4.0, 0, 2.0, 0.0)
    b.adjust("adj", rate=2.0, burst=4.0, now=0.0, n=1.0)
    b.adjust("adj", rate=2.0, burst=4.0, now=0.0, n=0.0)
    with db.engine.connect() as c:
        assert (
            c.execute(select(b._read.selected_columns[0]).where(b._read.whereclause), {"key": "adj"}).scalar()
            == 2.5
        )


def test_a_shared_bucket_refilled_between_its_two_statements_refuses_and_asks_for_a_retry_at_once(
    db: Database,
) -> None:
    b = DatabaseBuckets(db)
    b._take = select(b._read.selected_columns[0]).where(false())  # the conditional write finds no room
    assert b.take("race", rate=1.0, burst=1.0, now=0.0) == Decision(False, 1.0, 1.0, 0, 0.0, 0.01)


def test_headers_round_up_and_never_go_below_zero() -> None:
    assert Decision(True, 2.0, 4.0, 3, 0.5, 0.0).headers() == {
        "X-RateLimit-Limit": "2",
        "X-RateLimit-Burst": "4",
        "X-RateLimit-Remaining": "3",
        "X-RateLimit-Reset": "1",
    }
    assert Decision(False, 2.5, 0.5, -1, -0.2, 2.2).headers() == {
        "X-RateLimit-Limit": "2.5",
        "X-RateLimit-Burst": "0.5",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": "0",
        "Retry-After": "3",
    }
    assert Decision(False, 1e-5, 1.0, 0, 3.0, 0.0).headers()["Retry-After"] == "1"  # at least a second
    assert Decision(False, 1e-5, 1.0, 0, 3.0, 0.0).headers()["X-RateLimit-Limit"] == "1e-05"
    assert Decision(False, 1.0, 1.0, 0, 2.0, 1.0).headers()["Retry-After"] == "1"


# ---- leases -------------------------------------------------------------------------------------------
def test_lease_size_is_the_rate_over_the_lease_capped_by_the_burst_and_at_least_one() -> None:
    leased = LeasedBuckets(MemoryBuckets())  # type: ignore[arg-type]
    assert leased.lease_size(1000.0, 2000.0) == 50  # 1000/s x 0.05 s
    assert leased.lease_size(1000.0, 20.0) == 20
    assert leased.lease_size(10.0, 10.0) == 1  # 0.5 of a token: one
    assert leased.lease_size(60.0, 100.0) == 3
    assert leased.lease_size(1000.0, 0.3 / 0.1) == 3  # 2.9999999999999996: a rounding error below 3 is 3
    assert LeasedBuckets(MemoryBuckets(), lease_s=1.0).lease_size(100.0, 6000.0) == 100  # type: ignore[arg-type]
    assert leased.hold_s == 0.05 and LeasedBuckets(MemoryBuckets(), hold_s=2.0).hold_s == 2.0  # type: ignore[arg-type]


def test_a_lease_serves_requests_from_memory_until_it_runs_out_or_ends() -> None:
    inner = MemoryBuckets()
    leased = LeasedBuckets(inner)  # type: ignore[arg-type]
    kw = {"rate": 1000.0, "burst": 2000.0}
    # a lease of 50: the shared bucket keeps floor((2 - 0.05) x 1000) = 1950, this process 49 more
    assert leased.take("k", now=0.0, **kw) == Decision(True, 1000.0, 2000.0, 1999, 0.05, 0.0)
    assert leased.take("k", now=0.01, **kw) == Decision(True, 1000.0, 2000.0, 1998, 2.0, 0.0)
    assert leased.take_local("k", now=0.01, n=48.0, **kw) == Decision(True, 1000.0, 2000.0, 1950, 2.0, 0.0)
    assert leased.take_local("k", now=0.01, **kw) is None  # empty
    assert leased.take_local("k", now=0.05, rate=1000.0, burst=2000.0, n=0.0) is None  # ended at 0.05
    assert leased.take_local("k", now=0.01, rate=999.0, burst=2000.0, n=0.0) is None  # another limit
    assert leased.take_local("k", now=0.01, rate=1000.0, burst=1999.0, n=0.0) is None
    assert leased.take_local("k", now=0.0499, rate=1000.0, burst=2000.0, n=0.0) is not None
    # the next lease: the shared bucket at 0.05 + 0.05 = 0.1, keeps floor((2 - 0.09) x 1000) = 1910
    d = leased.take("k", now=0.01, **kw)
    assert (d.allowed, d.remaining) == (True, 1959) and d.reset_s == pytest.approx(0.09)
    assert inner._tat["k"] == pytest.approx(0.1)


def test_a_request_as_big_as_a_lease_goes_to_the_shared_bucket_directly() -> None:
    inner = MemoryBuckets()
    leased = LeasedBuckets(inner)  # type: ignore[arg-type]
    # 10/s: a lease would be one token, so each request is taken on its own, exactly the bucket
    got = [leased.take("k", rate=10.0, burst=2.0, now=0.0) for _ in range(3)]
    assert [(d.allowed, d.remaining) for d in got] == [(True, 1), (True, 0), (False, 0)]
    assert leased._leases == {} and inner._tat["k"] == pytest.approx(0.2)
    # a request of several tokens, more than the lease of 50, takes exactly what it needs
    d = leased.take("big", rate=1000.0, burst=2000.0, now=0.0, n=60.0)
    assert d == Decision(True, 1000.0, 2000.0, 1940, 0.06, 0.0) and leased._leases == {}


def test_what_the_lease_still_holds_goes_towards_a_bigger_request() -> None:
    inner = MemoryBuckets()
    leased = LeasedBuckets(inner)  # type: ignore[arg-type]
    kw = {"rate": 1000.0, "burst": 2000.0}
    leased.take("k", now=0.0, **kw)  # lease of 49 left; shared tat 0.05
    # 60 wanted: 49 from the lease, 11 needed, a new lease of 50 taken (39 of it kept)
    d = leased.take("k", now=0.0, n=60.0, **kw)
    assert (d.allowed, d.remaining) == (True, 1900 + 39)  # shared: floor((2 - 0.1) x 1000) = 1900
    assert leased._leases["k"].tokens == 39.0 and inner._tat["k"] == pytest.approx(0.1)


def test_a_refused_lease_leaves_the_lease_its_tokens() -> None:
    inner = MemoryBuckets()
    leased = LeasedBuckets(inner)  # type: ignore[arg-type]
    kw = {"rate": 1000.0, "burst": 100.0}  # tau 0.1 s
    leased.take("k", now=0.0, **kw)  # a lease of 50: 49 kept, shared tat 0.05
    inner.take("k", now=0.0, n=50.0, **kw)  # another process empties the shared bucket: tat 0.1
    d = leased.take("k", now=0.0, n=60.0, **kw)  # 49 + 11: the 11 are not there
    assert not d.allowed and d.retry_after_s == pytest.approx(0.011)
    assert leased._leases["k"].tokens == 49.0
    assert leased.take_local("k", now=0.0, n=49.0, **kw) is not None


def test_tokens_used_beyond_a_reservation_are_a_debt_paid_with_the_next_lease() -> None:
    inner = MemoryBuckets()
    leased = LeasedBuckets(inner)  # type: ignore[arg-type]
    kw = {"rate": 1000.0, "burst": 2000.0}
    leased.take("k", now=0.0, **kw)  # 49 in the lease, shared tat 0.05
    leased.adjust("k", now=0.0, n=100.0, **kw)  # 49 from the lease, 51 owed
    assert leased._leases["k"].tokens == 0.0 and leased._debt == {"k": 51.0}
    d = leased.take("k", now=0.01, **kw)  # lease of 50 plus the 51 owed: the shared tat 0.05 + 0.101
    assert inner._tat["k"] == pytest.approx(0.151)
    assert d.allowed and d.remaining == 1859 + 49  # floor((2 - 0.141) x 1000) + 49
    assert leased._debt == {}
    leased.adjust("k", now=0.02, n=5000.0, **kw)  # more than a bucket: at most a bucket is owed
    assert leased._debt == {"k": 2000.0}


def test_a_debt_is_taken_even_with_a_request_that_needs_no_lease() -> None:
    inner = MemoryBuckets()
    leased = LeasedBuckets(inner)  # type: ignore[arg-type]
    kw = {"rate": 10.0, "burst": 20.0}  # leases of one token
    leased.adjust("k", now=0.0, n=3.0, **kw)  # no lease: 3 owed
    assert leased._debt == {"k": 3.0}
    d = leased.take("k", now=0.0, **kw)  # 1 + 3 taken together: remaining floor((2 - 0.4) x 10) = 16
    assert d == Decision(True, 10.0, 20.0, 16, 0.4, 0.0)
    assert leased._debt == {} and leased._leases == {}


def test_tokens_given_back_go_into_the_lease_or_one_of_their_own() -> None:
    leased = LeasedBuckets(MemoryBuckets(), hold_s=1.0)  # type: ignore[arg-type]
    kw = {"rate": 1000.0, "burst": 2000.0}
    leased.adjust("k", now=0.0, n=-10.0, **kw)  # no lease: 10 tokens held until 1.0
    assert leased.take_local("k", now=0.5, **kw) == Decision(True, 1000.0, 2000.0, 9, 2.0, 0.0)
    leased.adjust("k", now=0.5, n=-5.0, **kw)  # into the live lease: 14
    assert leased._leases["k"].tokens == 14.0 and leased._leases["k"].granted == 15.0
    assert leased.take_local("k", now=1.0, **kw) is None  # it ended
    leased.adjust("k", now=0.5, n=0.0, **kw)
    assert leased._leases["k"].tokens == 14.0


def test_an_adaptive_lease_is_twice_what_was_used_of_the_last_one() -> None:
    inner = MemoryBuckets()
    leased = LeasedBuckets(inner, lease_s=1.0, adaptive=True)  # type: ignore[arg-type]
    kw = {"rate": 100.0, "burst": 6000.0}  # a lease of 100
    leased.take("k", now=0.0, **kw)  # 99 kept
    for _ in range(9):
        leased.take_local("k", now=0.0, **kw)  # 10 used in all, 90 left
    # 95 wanted: 90 from the lease; the next lease is 2 x 9 used of the 99 granted = 18 (> 100/16)
    d = leased.take("k", now=0.0, n=95.0, **kw)
    assert d.allowed and leased._leases["k"].tokens == 13.0  # 18 taken, 5 of them used
    assert inner._tat["k"] == pytest.approx(1.18)
    # an idle process: at least a sixteenth, floor(100 / 16) = 6
    idle = LeasedBuckets(MemoryBuckets(), lease_s=1.0, adaptive=True)  # type: ignore[arg-type]
    idle.take("k", now=0.0, **kw)
    idle.take_local("k", now=0.0, n=98.0, **kw)  # 1 left, 99 used
    idle._leases["k"].granted = 1.0  # as if it had been granted one and used none
    idle.take("k", now=0.0, n=2.0, **kw)
    assert idle._leases["k"].tokens == 5.0  # a lease of 6, of which 1 used


def test_a_lease_taken_while_one_is_live_adds_to_it() -> None:
    leased = LeasedBuckets(MemoryBuckets(), hold_s=1.0)  # type: ignore[arg-type]
    kw = {"rate": 1000.0, "burst": 2000.0}
    leased.adjust("k", now=0.0, n=-10.0, **kw)  # a lease of 10 given back, live until 1.0
    leased._install("k", 1000.0, 2000.0, 0.5, 30.0, 1500, 0.0)
    lease = leased._leases["k"]
    assert (lease.tokens, lease.granted, lease.shared_remaining, lease.expires_s) == (40.0, 40.0, 1500, 1.0)
    leased._install("k", 1000.0, 2000.0, 1.0, 30.0, 1400, 0.0)  # the old one ended: a new one
    lease = leased._leases["k"]
    assert (lease.tokens, lease.granted, lease.shared_remaining, lease.expires_s) == (30.0, 30.0, 1400, 2.0)
    leased._install("j", 1000.0, 2000.0, 1.0, 0.0, 1400, 0.0)  # nothing to keep: no lease
    assert "j" not in leased._leases
    leased._debt["k"] = 5.0
    leased._install("k", 1000.0, 2000.0, 1.0, 0.0, 1400, 3.0)
    assert leased._debt == {"k": 2.0}


# ---- tokens per minute ----------------------------------------------------------------------------------
def test_token_buckets_shape_and_clamp_a_request_to_one_bucket() -> None:
    assert TokenBuckets.shape(600.0) == (10.0, 600.0)
    b = TokenBuckets(clock=lambda: 100.0)
    d, got = b.reserve("t", tokens_per_minute=600, n=0.2)  # at least one token
    assert got == 1.0 and d.remaining == 599
    d, got = b.reserve("t", tokens_per_minute=600, n=10_000)  # a full bucket at most: refused now
    assert got == 0.0 and not d.allowed
    assert d.retry_after_s == pytest.approx(0.1)  # one token's worth at 10/s
    d, got = b.reserve("u", tokens_per_minute=600, n=10_000, now=5.0)  # another tenant, a full bucket
    assert got == 600.0 and d.remaining == 0


def test_settle_uses_the_clock_and_does_nothing_when_the_reservation_was_exact() -> None:
    now = [0.0]
    b = TokenBuckets(clock=lambda: now[0])
    b.reserve("t", tokens_per_minute=60, n=60)  # empty until t=60
    b.settle("t", tokens_per_minute=60, reserved=60, used=60)
    assert not b.reserve("t", tokens_per_minute=60, n=1)[0].allowed
    b.settle("t", tokens_per_minute=60, reserved=60, used=30)  # 30 back
    d, got = b.reserve("t", tokens_per_minute=60, n=30)
    assert d.allowed and got == 30.0 and d.remaining == 0


def test_reserve_local_answers_from_memory_or_says_a_statement_is_needed(db: Database) -> None:
    mem = TokenBuckets(clock=lambda: 0.0)
    local = mem.reserve_local("t", tokens_per_minute=600, n=5)
    assert local is not None and local[1] == 5.0 and local[0].remaining == 595
    shared = TokenBuckets(DatabaseBuckets(db), clock=lambda: 0.0)
    assert shared.reserve_local("t", tokens_per_minute=600, n=5) is None
    leased = TokenBuckets(LeasedBuckets(MemoryBuckets(), lease_s=1.0), clock=lambda: 0.0)  # type: ignore[arg-type]
    assert leased.reserve_local("t", tokens_per_minute=600, n=5) is None  # no lease yet
    d, got = leased.reserve("t", tokens_per_minute=600, n=5)  # a lease of 10 (1 s at 10/s)
    assert d.allowed and got == 5.0
    local = leased.reserve_local("t", tokens_per_minute=600, n=0.5)  # clamped to 1, from the lease
    assert local is not None and local[1] == 1.0 and local[0].remaining == 590 + 4
    assert leased.reserve_local("t", tokens_per_minute=600, n=5) is None  # 4 left
    assert asyncio.run(leased.areserve("t", tokens_per_minute=600, n=4))[1] == 4.0  # from memory
    d, got = asyncio.run(leased.areserve("t", tokens_per_minute=600, n=5))  # a statement, off the loop
    assert d.allowed and got == 5.0


def test_token_store_leases_a_second_of_tokens_from_the_same_shared_buckets(db: Database) -> None:
    inner = DatabaseBuckets(db)
    requests = LeasedBuckets(inner, hold_s=LEASE_HOLD_S)
    tokens = token_store(requests)
    assert isinstance(tokens, LeasedBuckets) and tokens is not requests
    assert tokens.inner is inner and tokens.lease_s == TPM_LEASE_S == 1.0 and tokens.adaptive
    assert tokens.hold_s == 1.0 and not requests.adaptive
    mem = MemoryBuckets()
    assert token_store(mem) is mem


# ---- the request limiter --------------------------------------------------------------------------------
def _check(limiter: RateLimiter, now: float, **kw: float | None) -> Decision | None:
    args = {"tenant_id": "t", "key_id": "k", "tenant_rps": None, "tenant_burst": None, "key_rps": None, **kw}
    return limiter.check(now=now, **args)  # type: ignore[arg-type]


def test_no_limit_is_no_decision_and_a_zero_rate_is_no_limit() -> None:
    limiter = RateLimiter(MemoryBuckets())
    assert _check(limiter, 0.0) is None
    assert _check(limiter, 0.0, tenant_rps=0.0, key_rps=0.0) is None


def test_the_key_bucket_bursts_its_rate_and_a_refusal_spares_the_tenant_bucket() -> None:
    store = MemoryBuckets()
    limiter = RateLimiter(store)
    # key 2/s (burst 2), tenant 10/s with a burst of 3
    got = [_check(limiter, 0.0, key_rps=2.0, tenant_rps=10.0, tenant_burst=3.0) for _ in range(3)]
    assert [(d.allowed, d.limit, d.remaining) for d in got if d] == [
        (True, 2.0, 1),
        (True, 2.0, 0),
        (False, 2.0, 0),
    ]
    assert store._tat["t:t"] == pytest.approx(0.2)  # two taken, not three
    assert store._tat["k:k"] == pytest.approx(1.0)
    # a slow key: a burst of one
    d = _check(limiter, 0.0, key_id="slow", key_rps=0.5)
    assert d is not None and d.burst == 1.0 and d.remaining == 0


def test_the_tenant_bucket_answers_when_it_is_tighter_or_refuses() -> None:
    limiter = RateLimiter(MemoryBuckets())
    d = _check(limiter, 0.0, key_rps=100.0, tenant_rps=1.0)  # tenant burst max(1, 1) = 1: remaining 0
    assert d is not None and d.limit == 1.0 and d.burst == 1.0 and d.remaining == 0
    d = _check(limiter, 0.0, key_rps=100.0, tenant_rps=1.0)
    assert d is not None and not d.allowed and d.limit == 1.0
    d = _check(limiter, 0.0, tenant_id="u", key_id="k2", key_rps=2.0, tenant_rps=50.0)  # the key is tighter
    assert d is not None and d.limit == 2.0 and d.remaining == 1
    d = _check(limiter, 0.0, tenant_id="v", tenant_rps=4.0, tenant_burst=0.5)  # a burst under 1: the rate
    assert d is not None and d.burst == 4.0 and d.remaining == 3
    d = _check(limiter, 0.0, tenant_id="w", tenant_rps=4.0, tenant_burst=1.0)
    assert d is not None and d.burst == 1.0 and d.remaining == 0
    d = _check(limiter, 0.0, tenant_id="x", tenant_rps=0.5)
    assert d is not None and d.burst == 1.0


def test_check_local_decides_without_a_statement_only_when_it_can() -> None:
    args = {"tenant_id": "t", "key_id": "k", "tenant_rps": 1000.0, "tenant_burst": 2000.0, "key_rps": None}
    mem = RateLimiter(MemoryBuckets())
    decided, d = mem.check_local(now=0.0, **args)
    assert decided and d is not None and d.remaining == 1999

    class Shared(MemoryBuckets):
        shared = True

    shared = RateLimiter(Shared())
    assert shared.check_local(now=0.0, **args) == (False, None)
    assert shared.check_local(now=0.0, **{**args, "tenant_rps": None}) == (True, None)

    inner = MemoryBuckets()
    leased = RateLimiter(LeasedBuckets(inner))  # type: ignore[arg-type]
    assert leased.check_local(now=0.0, **{**args, "tenant_rps": 0.0}) == (True, None)
    assert leased.check_local(now=0.0, **args) == (False, None)  # no lease yet
    leased.check(now=0.0, **args)  # takes a lease of 50: 49 left
    decided, d = leased.check_local(now=0.01, **args)
    assert decided and d == Decision(True, 1000.0, 2000.0, 1950 + 48, 2.0, 0.0)
    assert leased.check_local(now=0.05, **args) == (False, None)  # the lease ended
    assert leased.check_local(now=0.01, **{**args, "tenant_burst": 1000.0}) == (False, None)
    assert leased.check_local(now=0.01, **{**args, "tenant_rps": 500.0}) == (False, None)
    # two buckets: both need a live lease; the answer is the one with fewer left
    both = {**args, "key_rps": 1000.0}
    assert leased.check_local(now=0.01, **both) == (False, None)
    leased.check(now=0.01, **both)
    decided, d = leased.check_local(now=0.02, **both)
    assert decided and d is not None and d.limit == 1000.0 and d.burst == 1000.0
    store = leased.store
    assert isinstance(store, LeasedBuckets)
    store._leases["k:k"].tokens = 0.5
    assert leased.check_local(now=0.02, **both) == (False, None)  # under one token


def test_make_store_by_backend_and_dialect(db: Database) -> None:
    assert isinstance(make_store(db, "memory"), MemoryBuckets)
    assert isinstance(make_store(db, "auto"), MemoryBuckets)  # SQLite: in process
    s = make_store(db, "database")
    assert isinstance(s, LeasedBuckets) and isinstance(s.inner, DatabaseBuckets) and s.hold_s == LEASE_HOLD_S
    assert s.inner.db is db and s.shared and not s.adaptive
    with pytest.raises(InvalidInputError) as e:
        make_store(db, "redis")
    assert e.value.message == "TRAINYARD_RATE_LIMIT_BACKEND 'redis' is not supported"
    assert e.value.hint == "Use auto, memory or database."


def test_a_database_bucket_is_shared_by_two_stores_on_one_database(tmp_path: Path) -> None:
    d = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    d.upgrade()
    a, b = DatabaseBuckets(d), DatabaseBuckets(d)
    assert a.shared and not MemoryBuckets.shared
    assert a.take("s", rate=1.0, burst=2.0, now=0.0) == Decision(True, 1.0, 2.0, 1, 1.0, 0.0)
    assert b.take("s", rate=1.0, burst=2.0, now=0.0) == Decision(True, 1.0, 2.0, 0, 2.0, 0.0)
    assert a.take("s", rate=1.0, burst=2.0, now=0.0) == Decision(False, 1.0, 2.0, 0, 2.0, 1.0)
    d.dispose()


class _Recorder(MemoryBuckets):
    """A memory bucket store that records which buckets are taken, with their rate and burst."""

    def __init__(self) -> None:
        super().__init__()
        self.taken: list[tuple[str, float, float]] = []

    def take(self, key: str, *, rate: float, burst: float, now: float, n: float = 1.0) -> Decision:
        self.taken.append((key, rate, burst))
        return super().take(key, rate=rate, burst=burst, now=now, n=n)


@pytest.mark.parametrize("key_rps", [None, 0.0, 0.5, 1.0, 3.0])
@pytest.mark.parametrize(
    ("tenant_rps", "tenant_burst"),
    [(None, None), (0.0, 5.0), (0.5, None), (1.5, None), (1.5, 0.5), (1.5, 1.0), (2.0, 1.5), (3.0, 8.0)],
)
def test_the_buckets_check_local_looks_at_are_the_ones_check_takes(
    key_rps: float | None, tenant_rps: float | None, tenant_burst: float | None
) -> None:
    from trainyard.tenancy.ratelimit import _limits

    args = {
        "tenant_id": "t",
        "key_id": "k",
        "tenant_rps": tenant_rps,
        "tenant_burst": tenant_burst,
        "key_rps": key_rps,
    }
    rec = _Recorder()
    RateLimiter(rec).check(now=0.0, **args)  # type: ignore[arg-type]
    assert _limits(args) == rec.taken
    expected = []
    if key_rps:
        expected.append(("k:k", key_rps, max(1.0, key_rps)))
    if tenant_rps:
        expected.append(
            ("t:t", tenant_rps, tenant_burst if tenant_burst and tenant_burst >= 1 else max(1.0, tenant_rps))
        )
    assert rec.taken == expected


def test_a_tie_between_the_key_and_the_tenant_bucket_answers_with_the_key_bucket() -> None:
    limiter = RateLimiter(MemoryBuckets())
    # key 3/s (burst 3) and tenant 1/s with a burst of 3: both keep 2 tokens
    d = _check(limiter, 0.0, key_rps=3.0, tenant_rps=1.0, tenant_burst=3.0)
    assert d is not None and (d.limit, d.remaining) == (3.0, 2)
    leased = RateLimiter(LeasedBuckets(MemoryBuckets()))  # type: ignore[arg-type]
    store = leased.store
    assert isinstance(store, LeasedBuckets)
    from trainyard.tenancy.ratelimit import _Lease

    store._leases["k:k"] = _Lease(1000.0, 1000.0, 10.0, 1.0, 5)
    store._leases["t:t"] = _Lease(1000.0, 2000.0, 10.0, 1.0, 5)
    args = {"tenant_id": "t", "key_id": "k", "tenant_rps": 1000.0, "tenant_burst": 2000.0, "key_rps": 1000.0}
    decided, d = leased.check_local(now=0.0, **args)
    assert decided and d == Decision(True, 1000.0, 1000.0, 14, 1.0, 0.0)  # 5 + 9 left in each: the key's
    store._leases["k:k"].tokens = 1.0  # exactly one token is enough
    decided, d = leased.check_local(now=0.0, **args)
    assert decided and d is not None and d.remaining == 5


def test_headers_write_large_whole_numbers_in_full() -> None:
    h = Decision(True, 1e6, 2e6, 5, 1.0, 0.0).headers()
    assert (h["X-RateLimit-Limit"], h["X-RateLimit-Burst"]) == ("1000000", "2000000")


def test_auto_is_the_shared_database_bucket_on_postgresql() -> None:
    from types import SimpleNamespace

    pg = SimpleNamespace(dialect="postgresql")  # make_store and DatabaseBuckets only read the dialect
    s = make_store(pg, "auto")  # type: ignore[arg-type]
    assert isinstance(s, LeasedBuckets) and isinstance(s.inner, DatabaseBuckets) and s.hold_s == LEASE_HOLD_S
    assert isinstance(make_store(pg, "memory"), MemoryBuckets)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        make_store(pg, "Auto")  # type: ignore[arg-type]


def test_a_full_lease_table_keeps_only_the_live_leases() -> None:
    from trainyard.tenancy.ratelimit import _Lease

    leased = LeasedBuckets(MemoryBuckets())  # type: ignore[arg-type]
    for i in range(100_000):
        leased._leases[f"old{i}"] = _Lease(1.0, 1.0, 1.0, 5.0, 0)  # ended at 5.0
        leased._fetching[f"old{i}"] = threading.Lock()
    leased._leases["live"] = _Lease(1.0, 1.0, 1.0, 9.0, 0)
    leased._fetching["live"] = threading.Lock()
    leased._install("new", 1.0, 1.0, 5.0, 1.0, 0, 0.0)  # 100,001 leases: the ones ended by 5.0 go
    assert set(leased._leases) == {"live", "new"} and set(leased._fetching) == {"live"}
    leased._install("new2", 1.0, 1.0, 5.0, 1.0, 0, 0.0)  # 3 leases: nothing to drop
    assert set(leased._leases) == {"live", "new", "new2"}
    few = LeasedBuckets(MemoryBuckets())  # type: ignore[arg-type]
    for i in range(100_000):
        few._leases[f"old{i}"] = _Lease(1.0, 1.0, 1.0, 5.0, 0)
    few._install("new", 1.0, 1.0, 5.0, 1.0, 0, 0.0)  # exactly 100,000 before: kept
    assert len(few._leases) == 100_001


def test_a_lease_of_one_token_is_kept_and_a_debt_under_a_token_is_paid() -> None:
    leased = LeasedBuckets(MemoryBuckets())  # type: ignore[arg-type]
    leased._debt["k"] = 2.0
    leased._install("k", 1000.0, 2000.0, 0.0, 1.0, 100, 0.5)
    assert leased._leases["k"].tokens == 1.0 and leased._debt == {"k": 1.5}


def test_settling_in_a_lease_that_ended_or_holds_nothing() -> None:
    leased = LeasedBuckets(MemoryBuckets(), hold_s=1.0)  # type: ignore[arg-type]
    kw = {"rate": 1000.0, "burst": 2000.0}
    leased.adjust("k", now=0.0, n=-10.0, **kw)  # 10 held until 1.0
    leased.adjust("k", now=0.0, n=1.0, **kw)  # one more used: from the lease
    assert leased._leases["k"].tokens == 9.0 and leased._debt == {}
    leased.adjust("k", now=0.0, n=9.0, **kw)  # exactly what is left: no debt
    assert leased._leases["k"].tokens == 0.0 and leased._debt == {}
    leased.adjust("k", now=0.0, n=3.0, **kw)  # an empty lease: all owed
    assert leased._debt == {"k": 3.0}
    leased.adjust("k", now=0.0, n=4.0, **kw)
    assert leased._debt == {"k": 7.0}
    leased.adjust("j", now=0.0, n=-5.0, **kw)  # held until 1.0
    leased.adjust("j", now=1.0, n=-2.0, **kw)  # at 1.0 it has ended: a lease of its own
    lease = leased._leases["j"]
    assert (lease.tokens, lease.expires_s) == (2.0, 2.0)
    leased.adjust("i", now=0.0, n=-5.0, **kw)
    leased.adjust("i", now=1.0, n=2.0, **kw)  # the ended lease does not pay for it
    assert leased._leases["i"].tokens == 5.0 and leased._debt["i"] == 2.0
    leased.adjust("h", now=0.0, n=-0.5, **kw)  # half a token back
    leased.adjust("h", now=0.0, n=-0.25, **kw)
    assert leased._leases["h"].tokens == 0.75


def test_token_buckets_use_the_time_given_and_the_clock_otherwise() -> None:
    b = TokenBuckets(clock=lambda: 1000.0)
    b.reserve("t", tokens_per_minute=60, n=60, now=0.0)  # empty at 0, full again at 60
    local = b.reserve_local("t", tokens_per_minute=60, n=1, now=0.0)
    assert local is not None and not local[0].allowed
    local = b.reserve_local("t", tokens_per_minute=60, n=1)  # the clock: 1000, full
    assert local is not None and local[0].allowed
    assert b.reserve_local("u", tokens_per_minute=60, n=60, now=0.0) is not None  # its own bucket
    assert not b.reserve_local("t", tokens_per_minute=60, n=60, now=1000.0)[0].allowed  # type: ignore[index]
    b.settle("t", tokens_per_minute=60, reserved=10, used=11)  # one more taken
    d, _ = b.reserve("t", tokens_per_minute=60, n=1, now=1000.0)  # tat 1001 + 1 taken + 1: 1003
    assert (d.allowed, d.remaining) == (True, 57)
    leased = TokenBuckets(LeasedBuckets(MemoryBuckets(), hold_s=1.0), clock=lambda: 1000.0)  # type: ignore[arg-type]
    leased.settle("t", tokens_per_minute=60, reserved=5, used=0, now=0.0)  # 5 back, held until 1.0
    local = leased.reserve_local("t", tokens_per_minute=60, n=5, now=0.5)
    assert local is not None and local[1] == 5.0
    leased.settle("t", tokens_per_minute=60, reserved=5, used=0, now=0.0)
    assert leased.reserve_local("t", tokens_per_minute=60, n=5) is None  # at the clock's 1000 it ended


def test_areserve_answers_from_the_tenants_own_bucket() -> None:
    b = TokenBuckets(LeasedBuckets(MemoryBuckets(), lease_s=1.0), clock=lambda: 0.0)  # type: ignore[arg-type]
    d, got = asyncio.run(b.areserve("t", tokens_per_minute=60, n=60))  # a statement: the whole bucket
    assert d.allowed and got == 60.0
    d, got = asyncio.run(b.areserve("t", tokens_per_minute=60, n=1))
    assert not d.allowed and got == 0.0
    d, got = asyncio.run(b.areserve("u", tokens_per_minute=60, n=1))
    assert d.allowed


def test_when_a_whole_lease_does_not_fit_the_request_takes_only_what_it_needs() -> None:
    inner = MemoryBuckets()
    leased = LeasedBuckets(inner)  # type: ignore[arg-type]
    kw = {"rate": 1000.0, "burst": 100.0}  # tau 0.1 s, leases of 50
    leased.take("k", now=0.0, **kw)  # a lease of 50 (49 kept) until 0.05; shared tat 0.05
    inner.take("k", now=0.06, n=80.0, **kw)  # another process: shared tat 0.14
    # at 0.06 the lease has ended; 50 more would end at 0.19 (> 0.06 + 0.1): refused; 1 ends at 0.141
    d = leased.take("k", now=0.06, **kw)
    assert (d.allowed, d.remaining) == (True, 19) and d.reset_s == pytest.approx(0.081)
    assert inner._tat["k"] == pytest.approx(0.141)
    # with 5 tokens owed: the lease and the debt do not fit, the request and the debt do
    leased._debt["k"] = 5.0
    d = leased.take("k", now=0.06, **kw)
    assert (d.allowed, d.remaining) == (True, 13)  # shared tat 0.141 + 0.006: floor((0.1 - 0.087) x 1000)
    assert leased._debt == {}


def test_a_request_for_the_whole_bucket_is_admitted_and_a_debt_waits_for_the_next_lease() -> None:
    inner = MemoryBuckets()
    leased = LeasedBuckets(inner)  # type: ignore[arg-type]
    leased._debt["k"] = 5.0
    d = leased.take("k", rate=1000.0, burst=100.0, now=0.0, n=100.0)
    assert (d.allowed, d.remaining) == (True, 0)
    assert leased._debt == {"k": 5.0} and leased._leases == {}


@pytest.mark.postgres
def test_the_database_bucket_answers_the_same_on_postgresql() -> None:
    from controlplane_support import postgres_database

    with postgres_database() as url:
        pg = Database(url)
        pg.upgrade()
        b = DatabaseBuckets(pg)
        assert _run(b, "worked") == [d for _, _, d in WORKED]
        b.adjust("worked", rate=2.0, burst=4.0, now=10.0, n=-1.0)  # tat 10.5 - 0.5 = 10.0: full
        assert b.take("worked", rate=2.0, burst=4.0, now=10.0, n=4.0) == Decision(True, 2.0, 4.0, 0, 2.0, 0.0)
        pg.dispose()


def test_part_of_a_token_used_beyond_a_reservation_is_owed_too() -> None:
    from trainyard.tenancy.ratelimit import _Lease

    leased = LeasedBuckets(MemoryBuckets())  # type: ignore[arg-type]
    kw = {"rate": 1000.0, "burst": 2000.0}
    leased.adjust("k", now=0.0, n=0.5, **kw)  # no lease: half a token owed
    assert leased._debt == {"k": 0.5} and "k" not in leased._leases
    leased._leases["j"] = _Lease(1000.0, 2000.0, 2.0, 1.0, 0, 2.0)
    leased.adjust("j", now=0.0, n=2.5, **kw)  # 2 from the lease, half a token owed
    assert leased._leases["j"].tokens == 0.0 and leased._debt["j"] == 0.5


def test_an_adaptive_lease_after_one_that_was_used_up() -> None:
    from trainyard.tenancy.ratelimit import _Lease

    leased = LeasedBuckets(MemoryBuckets(), lease_s=1.0, adaptive=True)  # type: ignore[arg-type]
    leased._leases["k"] = _Lease(100.0, 6000.0, 0.0, 10.0, 0, 10.0)  # 10 granted, all used
    leased.take("k", rate=100.0, burst=6000.0, now=0.0)
    assert leased._leases["k"].tokens == 19.0  # a lease of 2 x 10 = 20, one of them used
    small = LeasedBuckets(MemoryBuckets(), lease_s=1.0, adaptive=True)  # type: ignore[arg-type]
    small._leases["k"] = _Lease(16.0, 16.0, 0.0, 10.0, 0, 0.0)  # nothing used: 16 / 16 = 1 token
    small.take("k", rate=16.0, burst=16.0, now=0.0)
    assert small._leases["k"].tokens == 0.0  # the one token went to the request


def test_settle_without_a_time_uses_the_clock_in_a_leased_store() -> None:
    leased = TokenBuckets(LeasedBuckets(MemoryBuckets(), hold_s=1.0), clock=lambda: 0.0)  # type: ignore[arg-type]
    leased.settle("t", tokens_per_minute=60, reserved=5, used=0)  # 5 back, held until 1.0
    leased.settle("t", tokens_per_minute=60, reserved=5, used=0)  # into that lease: 10
    local = leased.reserve_local("t", tokens_per_minute=60, n=10)
    assert local is not None and local[1] == 10.0


def test_a_full_memory_store_forgets_only_buckets_that_are_full_again() -> None:
    m = MemoryBuckets()
    m._tat = {f"old{i}": 1.0 for i in range(100_000)}
    m._tat["live"] = 100.0
    assert m.take("new", rate=1.0, burst=1.0, now=5.0).allowed
    assert set(m._tat) == {"live", "new"}
    assert not m.take("live", rate=1.0, burst=1.0, now=5.0).allowed  # still empty until 100


def test_what_is_left_of_a_debt_or_a_lease_under_one_token_is_kept() -> None:
    from trainyard.tenancy.ratelimit import _Lease

    leased = LeasedBuckets(MemoryBuckets(), hold_s=1.0)  # type: ignore[arg-type]
    leased._debt["k"] = 2.0
    leased._install("k", 1000.0, 2000.0, 0.0, 10.0, 100, 1.5)
    assert leased._debt == {"k": 0.5}
    leased._leases["j"] = _Lease(1000.0, 2000.0, 0.5, 0.8, 7, 0.5)  # half a token, live until 0.8
    leased._install("j", 1000.0, 2000.0, 0.5, 30.0, 100, 0.0)
    lease = leased._leases["j"]
    assert (lease.tokens, lease.expires_s, lease.shared_remaining) == (30.5, 0.8, 100)


def test_a_refusal_gives_a_lease_back_its_last_token() -> None:
    from trainyard.tenancy.ratelimit import _Lease

    inner = MemoryBuckets()
    leased = LeasedBuckets(inner)  # type: ignore[arg-type]
    kw = {"rate": 1000.0, "burst": 100.0}
    inner.take("k", now=0.0, n=100.0, **kw)  # the shared bucket is empty
    leased._leases["k"] = _Lease(1000.0, 100.0, 1.0, 0.05, 0, 1.0)
    assert not leased.take("k", now=0.0, n=60.0, **kw).allowed
    assert leased._leases["k"].tokens == 1.0


def test_the_debt_table_starts_over_past_100_000_buckets() -> None:
    kw = {"rate": 1000.0, "burst": 2000.0}
    at = LeasedBuckets(MemoryBuckets())  # type: ignore[arg-type]
    at._debt = {f"d{i}": 1.0 for i in range(100_000)}
    at.adjust("new", now=0.0, n=2.0, **kw)  # 100,000 owed: kept
    assert len(at._debt) == 100_001
    past = LeasedBuckets(MemoryBuckets())  # type: ignore[arg-type]
    past._debt = {f"d{i}": 1.0 for i in range(100_001)}
    past.adjust("new", now=0.0, n=2.0, **kw)  # more than 100,000: forgotten
    assert past._debt == {"new": 2.0}


def test_a_lease_that_ends_exactly_now_gives_nothing_to_the_next_request() -> None:
    from trainyard.tenancy.ratelimit import _Lease

    leased = LeasedBuckets(MemoryBuckets())  # type: ignore[arg-type]
    leased._leases["k"] = _Lease(1000.0, 2000.0, 10.0, 0.05, 0, 10.0)
    assert leased.take("k", rate=1000.0, burst=2000.0, now=0.05, n=20.0).allowed
    assert (
        leased._leases["k"].tokens == 30.0
    )  # a new lease of 50, 20 of it used; the 10 ended with the old one


def test_a_memory_store_of_exactly_100_000_buckets_keeps_them_all() -> None:
    m = MemoryBuckets()
    m._tat = {f"old{i}": 1.0 for i in range(99_999)}
    m._tat["live"] = 100.0
    m.take("new", rate=1.0, burst=1.0, now=5.0)
    assert len(m._tat) == 100_001
