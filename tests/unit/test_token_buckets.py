"""Tokens-per-minute buckets: reserve at admission, settle with the tokens really used."""

from __future__ import annotations

from trainyard.tenancy.ratelimit import TokenBuckets


def test_reserve_refuse_with_retry_after_and_settle_returns_unused_tokens() -> None:
    b = TokenBuckets()
    d, got = b.reserve("t", tokens_per_minute=600, n=500, now=0.0)  # 10 tokens/s, 600 held
    assert d.allowed and got == 500 and d.remaining == 100
    d, got = b.reserve("t", tokens_per_minute=600, n=200, now=0.0)
    assert not d.allowed and got == 0
    assert abs(d.retry_after_s - 10.0) < 1e-6 and d.headers()["Retry-After"] == "10"
    b.settle("t", tokens_per_minute=600, reserved=500, used=120)  # 380 given back
    d, got = b.reserve("t", tokens_per_minute=600, n=200, now=0.0)
    assert d.allowed and d.remaining == 280


def test_settle_takes_more_when_the_answer_used_more_than_reserved() -> None:
    b = TokenBuckets()
    b.reserve("t", tokens_per_minute=60, n=10, now=0.0)
    b.settle("t", tokens_per_minute=60, reserved=10, used=60)  # the bucket is now empty
    d, _ = b.reserve("t", tokens_per_minute=60, n=5, now=0.0)
    assert not d.allowed and abs(d.retry_after_s - 5.0) < 1e-6
    d, _ = b.reserve("t", tokens_per_minute=60, n=5, now=5.0)
    assert d.allowed


def test_refunds_never_lift_the_bucket_above_full_and_big_requests_wait_for_a_full_bucket() -> None:
    b = TokenBuckets()
    b.reserve("t", tokens_per_minute=60, n=30, now=0.0)
    b.settle("t", tokens_per_minute=60, reserved=30, used=0)
    b.settle("t", tokens_per_minute=60, reserved=30, used=0)  # a second refund: still one bucket
    d, got = b.reserve("t", tokens_per_minute=60, n=1000, now=0.0)  # more than a minute's worth
    assert d.allowed and got == 60
    d, _ = b.reserve("t", tokens_per_minute=60, n=1, now=0.0)
    assert not d.allowed
    d, _ = b.reserve("other", tokens_per_minute=60, n=1, now=0.0)  # per tenant
    assert d.allowed
