"""Cost model invariants (hypothesis) and the checkpoint/preemption arithmetic."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.catalog.pools import Pool
from trainyard.cost import model as cm
from trainyard.cost.quote import option_for
from trainyard.spec import spec_from_dict

FAST = settings(max_examples=60, deadline=None)  # per test: never change the global hypothesis profile

rates = st.floats(min_value=1e-7, max_value=1e-3)  # per second: 0.00036/h .. 3.6/h
stalls = st.floats(min_value=0.01, max_value=600.0)
restarts = st.floats(min_value=0.0, max_value=3600.0)


def _spec(steps: int = 1000, **over: Any):
    doc: dict[str, Any] = {
        "name": "t",
        "model": {"architecture": "custom", "params_b": 1.0},
        "workload": {"seq_len": 1024, "global_batch": 8, "steps": steps},
        "measured": {"step_time_s": {"a100-80gb": 0.5}},
    }
    doc.update(over)
    return spec_from_dict(doc)


def _pool(price: float = 2.0, rate: float | None = None, market: str = "on_demand") -> Pool:
    return Pool(
        name="p",
        accelerator="a100-80gb",
        devices_per_node=1,
        nodes=1,
        market=market,
        price_usd_per_device_hour=price,
        region="r",
        cloud="aws",
        interruption_rate_per_hour=rate,
    )


@FAST
@given(c=stalls, lam=rates, r=restarts, x=st.floats(min_value=0.05, max_value=20.0))
def test_young_daly_minimises_expected_overhead(c: float, lam: float, r: float, x: float) -> None:
    tau = cm.young_daly_interval_s(c, lam)
    best = cm.overhead_fraction(tau, c, lam, r)
    assert best <= cm.overhead_fraction(tau * x, c, lam, r) * (1 + 1e-12)


@FAST
@given(c=stalls, lam=st.floats(min_value=1e-6, max_value=1e-4), r=restarts)
def test_rounded_interval_costs_little(c: float, lam: float, r: float) -> None:
    tau = cm.choose_interval_s(None, c, lam)
    opt = cm.young_daly_interval_s(c, lam)
    # below 5 min one 60 s grid step is a large share of τ*, so the bound holds from there
    if 300.0 <= opt < cm.DEFAULT_PARAMS.max_interval_s:
        # the interval-dependent part of the overhead grows by at most a few percent
        part = lambda t: c / t + lam * t / 2  # noqa: E731
        assert part(tau) <= part(opt) * 1.03


@FAST
@given(
    steps=st.integers(min_value=1, max_value=10**6),
    extra=st.integers(min_value=1, max_value=10**6),
    price=st.floats(min_value=0.01, max_value=100.0),
    bump=st.floats(min_value=1.001, max_value=10.0),
)
def test_cost_grows_with_steps_and_price(steps: int, extra: int, price: float, bump: float) -> None:
    base = option_for(_spec(steps), _pool(price), 1)
    longer = option_for(_spec(steps + extra), _pool(price), 1)
    pricier = option_for(_spec(steps), _pool(price * bump), 1)
    assert longer.expected_cost_usd > base.expected_cost_usd
    assert longer.expected_hours > base.expected_hours
    assert pricier.expected_cost_usd > base.expected_cost_usd
    assert pricier.usd_per_step > base.usd_per_step


@FAST
@given(
    r1=st.floats(min_value=0.0, max_value=2.0),
    dr=st.floats(min_value=1e-3, max_value=2.0),
    steps=st.integers(min_value=100, max_value=10**6),
)
def test_more_preemption_never_makes_spot_cheaper(r1: float, dr: float, steps: int) -> None:
    spec = _spec(steps)
    a = option_for(spec, _pool(0.7, r1, "spot"), 1)
    b = option_for(spec, _pool(0.7, r1 + dr, "spot"), 1)
    if b.feasible:
        assert b.expected_cost_usd >= a.expected_cost_usd
        assert b.usd_per_step >= a.usd_per_step
        assert b.expected_hours >= a.expected_hours


@FAST
@given(steps=st.integers(min_value=1, max_value=10**7), r=st.floats(min_value=0.0, max_value=1.0))
def test_money_and_time_are_finite_and_consistent(steps: int, r: float) -> None:
    o = option_for(_spec(steps), _pool(0.7, r, "spot"), 1)
    for v in (o.expected_cost_usd, o.expected_hours, o.usd_per_step, o.expected_hours_p90):
        assert math.isfinite(v) and v >= 0
    assert o.expected_cost_usd == pytest.approx(o.price_usd_per_hour * o.expected_hours)
    assert o.preemption_overhead_usd + o.checkpoint_overhead_usd <= o.expected_cost_usd


def _poisson_ppf(mean: float, q: float) -> int:
    """Reference quantile from the log-pmf (independent of the product recursion under test)."""
    if mean == 0:
        return 0
    cdf, k = 0.0, 0
    while True:
        cdf += math.exp(-mean + k * math.log(mean) - math.lgamma(k + 1))
        if cdf >= q - 1e-12:
            return k
        k += 1


@FAST
@given(mean=st.floats(min_value=0.0, max_value=2000.0), q=st.sampled_from([0.5, 0.9, 0.99]))
def test_poisson_quantile_matches_reference(mean: float, q: float) -> None:
    expected = _poisson_ppf(mean, q)
    assert abs(cm.poisson_quantile(mean, q) - expected) <= (1 if mean > 500 else 0)


def test_checkpoint_bytes_full_and_lora() -> None:
    full = _spec()
    assert cm.checkpoint_bytes(full) == pytest.approx(1e9 * (2 + 4 + 8))
    lora = _spec(workload={"seq_len": 1024, "global_batch": 8, "steps": 10, "method": "lora"})
    assert cm.checkpoint_bytes(lora) == pytest.approx(lora.trainable_params * 14)
    fp32_sgd = _spec(
        workload={"seq_len": 1024, "global_batch": 8, "steps": 10, "precision": "fp32", "optimizer": "sgd"}
    )
    assert cm.checkpoint_bytes(fp32_sgd) == pytest.approx(1e9 * 8)


def test_async_checkpoint_costs_only_its_stall() -> None:
    b = 14e9
    sync = cm.checkpoint_stall_s(b, devices=8, nodes=1, write_gb_per_s=2.0)
    asyn = cm.checkpoint_stall_s(
        b, devices=8, nodes=1, write_gb_per_s=2.0, params=cm.CostParams(async_checkpoint=True)
    )
    assert sync == pytest.approx(7.0) and asyn == pytest.approx(14e9 / (8 * 10e9))
    assert cm.storage_write_gb_per_s("s3://b/p") == 1.0 and cm.storage_write_gb_per_s(None) == 2.0
    assert cm.storage_write_gb_per_s("s3://b", cm.CostParams(storage_write_gb_per_s=5.0)) == 5.0


def test_interval_choice() -> None:
    assert cm.choose_interval_s(600.0, 10.0, 1e-4) == 600.0  # pinned by the spec
    assert cm.choose_interval_s(None, 10.0, 0.0) == 1800.0  # no preemption: the 30-minute cap
    assert cm.choose_interval_s(None, 10.0, 1e-9) == 1800.0  # continuous as λ -> 0
    assert cm.choose_interval_s(None, 6.2028, 0.05 / 3600) == 900.0  # worked example
    assert cm.choose_interval_s(None, 0.001, 1e-3) == 60.0  # clamped to the minimum
    assert cm.young_daly_interval_s(10.0, 0.0) == math.inf


def test_restart_includes_recompile_where_the_stack_needs_it() -> None:
    spec = _spec(measured={"step_time_s": {"trn1": 1.0, "a100-80gb": 1.0}})
    trn = Pool(
        name="t",
        accelerator="trn1",
        devices_per_node=1,
        nodes=1,
        market="spot",
        price_usd_per_device_hour=1.0,
        region="r",
        interruption_rate_per_hour=0.1,
    )
    gpu = trn.model_copy(update={"accelerator": "a100-80gb"})
    ot, og = option_for(spec, trn, 1), option_for(spec, gpu, 1)
    assert ot.compile_s == 1200.0 and og.compile_s == 0.0
    assert ot.restart_s - og.restart_s == pytest.approx(1200.0 + 60.0)  # recompile + slower provisioning


def test_pinned_interval_from_spec() -> None:
    spec = _spec(checkpoint={"interval": "15m"})
    o = option_for(spec, _pool(0.7, 0.3, "spot"), 1)
    assert o.checkpoint_interval_s == 900.0


@FAST
@given(c=stalls, lam=rates)
def test_chosen_interval_is_the_best_grid_point(c: float, lam: float) -> None:
    grid = [60.0 * k for k in range(1, 10)] + [300.0 * k for k in range(2, 7)]
    part = lambda t: c / t + lam * t / 2  # noqa: E731
    chosen = cm.choose_interval_s(None, c, lam)
    assert chosen in grid
    assert part(chosen) <= min(part(t) for t in grid) * (1 + 1e-12)


@FAST
@given(wait=st.floats(min_value=1.0, max_value=4 * 3600.0), r=st.floats(min_value=0.01, max_value=1.0))
def test_waiting_for_spot_capacity_takes_time_not_money(wait: float, r: float) -> None:
    spec = _spec(20000)
    base = option_for(spec, _pool(0.7, r, "spot"), 1)
    waiting = option_for(spec, _pool(0.7, r, "spot"), 1, params=cm.CostParams(spot_capacity_wait_s=wait))
    assert waiting.expected_cost_usd == base.expected_cost_usd
    assert waiting.expected_hours > base.expected_hours
    assert waiting.expected_hours_p90 >= base.expected_hours_p90
    assert waiting.capacity_wait_hours == pytest.approx(waiting.expected_hours - base.expected_hours)


@pytest.mark.parametrize(
    ("checkpoint_s", "rate_per_s", "interval_s"),
    [
        (50.0, 1e-4, 1000.0),  # √(2·50/1e-4) = √1e6
        (18.0, 1.0 / 3600.0, 360.0),  # √(2·18·3600) = √129600
        (2.0, 0.02, 14.142135623730951),  # √200
    ],
)
def test_young_daly_is_root_of_two_c_over_lambda_worked_examples(
    checkpoint_s: float, rate_per_s: float, interval_s: float
) -> None:
    from trainyard.cost.model import young_daly_interval_s

    assert young_daly_interval_s(checkpoint_s, rate_per_s) == pytest.approx(interval_s, rel=1e-12)
