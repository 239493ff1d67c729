"""Pure serving logic: route choice, stickiness, canary judgement, autoscaling policy, request validation,
serving quotes."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from pydantic import ValidationError

from trainyard.catalog.accelerators import get_accelerator
from trainyard.serving.autoscale import AutoscalingPolicy, ScaleState, desired_replicas, merge
from trainyard.serving.openai_schemas import ChatCompletionRequest, CompletionRequest
from trainyard.serving.quote import serving_quote
from trainyard.serving.traffic import CanaryPolicy, Route, canary_breach, choose_route, compare_answers


def test_weighted_choice_follows_the_weights() -> None:
    routes = [Route("a@1", 80), Route("b@1", 20), Route("c@1", 50, shadow=True), Route("d@1", 0)]
    rng = random.Random(0)
    counts = Counter(choose_route(routes, None, rng).model for _ in range(10_000))
    assert set(counts) == {"a@1", "b@1"}  # shadows and zero weights never serve
    assert abs(counts["a@1"] / 10_000 - 0.8) < 0.02


def test_sticky_key_always_lands_on_the_same_route_and_keys_spread() -> None:
    routes = [Route("a@1", 50), Route("b@1", 50)]
    assert len({choose_route(routes, "alice").model for _ in range(50)}) == 1
    spread = Counter(choose_route(routes, f"user-{i}").model for i in range(2000))
    assert abs(spread["a@1"] / 2000 - 0.5) < 0.05


def test_no_servable_route_is_an_error() -> None:
    with pytest.raises(ValueError):
        choose_route([Route("a@1", 0), Route("b@1", 10, shadow=True)], None)


def test_canary_breach_on_error_rate_and_on_p95_within_the_window() -> None:
    policy = CanaryPolicy(max_error_rate=0.1, max_p95_latency_s=1.0, window_s=60, min_requests=5)
    ok = [(100.0 + i, True, 0.1) for i in range(20)]
    assert canary_breach(ok, policy, now_s=130) is None
    errors = ok + [(125.0, False, 0.0)] * 5
    why = canary_breach(errors, policy, now_s=130)
    assert why is not None and "error rate" in why["reason"] and why["errors"] == 5
    slow = [(100.0 + i, True, 2.0) for i in range(20)]
    why = canary_breach(slow, policy, now_s=130)
    assert why is not None and "p95 latency" in why["reason"]
    assert canary_breach(slow, policy, now_s=500) is None  # outside the window
    assert canary_breach(errors[:3], policy, now_s=130) is None  # too few requests to judge


def test_autoscaling_up_after_delay_down_one_at_a_time_and_to_zero() -> None:
    p = AutoscalingPolicy(
        min_replicas=0, max_replicas=3, target_in_flight=2, scale_up_delay_s=1, scale_down_delay_s=5
    )
    st = ScaleState()
    assert desired_replicas(p, st, current=0, in_flight=0, waiting=False, now_s=0) == 0
    assert desired_replicas(p, st, current=0, in_flight=0, waiting=True, now_s=0) == 1  # wake at once
    assert desired_replicas(p, st, current=1, in_flight=5, waiting=False, now_s=10) == 1  # delay starts
    assert desired_replicas(p, st, current=1, in_flight=5, waiting=False, now_s=11) == 3
    assert desired_replicas(p, st, current=3, in_flight=9, waiting=False, now_s=12) == 3  # capped at max
    assert desired_replicas(p, st, current=3, in_flight=0, waiting=False, now_s=20) == 3
    assert desired_replicas(p, st, current=3, in_flight=0, waiting=False, now_s=25) == 2
    assert desired_replicas(p, st, current=2, in_flight=0, waiting=False, now_s=26) == 2
    assert desired_replicas(p, st, current=2, in_flight=0, waiting=False, now_s=31) == 1
    assert desired_replicas(p, st, current=1, in_flight=0, waiting=False, now_s=32) == 1
    assert desired_replicas(p, st, current=1, in_flight=0, waiting=False, now_s=37) == 0
    merged = merge([p, AutoscalingPolicy(min_replicas=1, max_replicas=1)])
    assert (merged.min_replicas, merged.max_replicas) == (1, 3)


def test_chat_request_validation_lists_every_bad_field() -> None:
    with pytest.raises(ValidationError) as exc:
        ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [], "temperature": 3, "n": 2, "unknown": 1}
        )
    fields = {e["loc"][0] for e in exc.value.errors()}
    assert fields == {"messages", "temperature", "n", "unknown"}
    ok = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_completion_tokens": 3,
        }
    )
    assert ok.forward()["messages"] == [{"role": "user", "content": "hi"}] and ok.forward()["max_tokens"] == 3


def test_completion_request_validation() -> None:
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"model": "m", "prompt": ""})
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"model": "m", "prompt": "x", "echo": True})
    assert CompletionRequest.model_validate({"model": "m", "prompt": ["x"]}).forward()["prompt"] == "x"


def test_compare_answers() -> None:
    assert compare_answers("a b  c", "a b c") == (True, 1.0)
    exact, sim = compare_answers("a b c d", "a b x d")
    assert not exact and sim == pytest.approx(0.75)


def test_serving_quote_is_memory_bound_and_priced_from_the_pool() -> None:
    h100 = get_accelerator("h100")
    q = serving_quote("p", h100, 14 * 10**9, price_usd_per_hour=4.0)  # a 7B model in bf16
    assert 50 < q.predicted_tokens_per_s < h100.mem_bw_gbs  # a few hundred tokens/s per stream
    assert q.usd_per_1k_tokens == pytest.approx(4.0 / (q.predicted_tokens_per_s * 3.6))
    assert serving_quote("p", h100, 14 * 10**9, 4.0, batch=8).usd_per_1k_tokens < q.usd_per_1k_tokens
