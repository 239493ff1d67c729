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


# ---- worked examples: each number below is computed by hand from the documented formula ----------------
def test_checkpoint_bytes_adafactor_and_lora_counts_only_trainable_parameters() -> None:
    ada = _spec(workload={"seq_len": 1024, "global_batch": 8, "steps": 10, "optimizer": "adafactor"})
    assert cm.checkpoint_bytes(ada) == pytest.approx(1e9 * (2 + 4 + 0.1))  # bf16 + fp32 master + factored
    lora = _spec(workload={"seq_len": 1024, "global_batch": 8, "steps": 10, "method": "lora"})
    assert lora.trainable_params < lora.params
    assert cm.checkpoint_bytes(lora) == pytest.approx(lora.trainable_params * 14)
    assert cm.checkpoint_bytes(lora) < 0.5 * cm.checkpoint_bytes(_spec())


@pytest.mark.parametrize(
    ("url", "write", "read"),
    [
        ("S3://bucket/ckpt", 1.0, 1.5),  # the scheme is case-insensitive
        ("memory://x", 10.0, 10.0),
        ("memory://a://b", 10.0, 10.0),  # only the first :// ends the scheme
        ("gs://b/p", 1.0, 1.5),
        ("/local/dir", 2.0, 3.0),  # no scheme: a local path
        (None, 2.0, 3.0),
        ("webdav://host/x", 1.0, 1.0),  # unknown scheme: the default
    ],
)
def test_storage_bandwidth_by_url_scheme(url: str | None, write: float, read: float) -> None:
    assert cm.storage_write_gb_per_s(url) == write
    assert cm.storage_read_gb_per_s(url) == read
    pinned = cm.CostParams(storage_write_gb_per_s=0.25, storage_read_gb_per_s=0.5)
    assert cm.storage_write_gb_per_s(url, pinned) == 0.25
    assert cm.storage_read_gb_per_s(url, pinned) == 0.5


def test_checkpoint_times_worked_examples() -> None:
    b = 12e9
    assert cm.checkpoint_write_s(b, 1, 2.0) == pytest.approx(6.0)
    assert cm.checkpoint_write_s(b, 3, 2.0) == pytest.approx(2.0)
    assert cm.checkpoint_write_s(b, 0, 2.0) == pytest.approx(6.0)  # at least one node writes
    assert cm.checkpoint_load_s(b, 1, 3.0) == pytest.approx(4.0)
    assert cm.checkpoint_load_s(b, 2, 3.0) == pytest.approx(2.0)
    asyn = cm.CostParams(async_checkpoint=True, host_copy_gb_per_s=4.0)
    assert cm.checkpoint_stall_s(b, devices=1, nodes=1, write_gb_per_s=2.0, params=asyn) == pytest.approx(3.0)
    assert cm.checkpoint_stall_s(b, devices=3, nodes=1, write_gb_per_s=2.0, params=asyn) == pytest.approx(1.0)
    assert cm.checkpoint_stall_s(b, devices=1, nodes=1, write_gb_per_s=2.0) == pytest.approx(6.0)
    assert cm.restart_s(provisioning_s=180.0, load_s=40.0, recompile_s=5.0) == 225.0


def test_overhead_fractions_worked_example() -> None:
    # C = 60 s, τ = 1200 s, λ = 1/h, R = 300 s: C/τ = 0.05, λ(τ/2 + R) = 900/3600 = 0.25
    lam = 1 / 3600
    assert cm.checkpoint_fraction(1200.0, 60.0) == pytest.approx(0.05)
    assert cm.preemption_fraction(1200.0, lam, 300.0) == pytest.approx(0.25)
    assert cm.overhead_fraction(1200.0, 60.0, lam, 300.0) == pytest.approx(0.30)
    for bad in (0.0, -5.0):
        with pytest.raises(ValueError, match=r"^interval_s must be positive$"):
            cm.overhead_fraction(bad, 60.0, lam, 300.0)
    assert cm.expected_wall_s(1000.0, 0.3) == pytest.approx(1300.0)
    assert cm.expected_wall_s(1000.0, 0.3, startup_s=50.0) == pytest.approx(1350.0)
    assert cm.usd_per_effective_step(3.6, 2.0, 0.5) == pytest.approx(0.003)  # 3 s at $3.6/h


@pytest.mark.parametrize(
    ("tau", "expected"),
    [
        (1800.0, [1800.0]),  # at the cap
        (5000.0, [1800.0]),
        (60.0, [60.0]),  # at the floor
        (10.0, [60.0]),
        (150.0, [120.0, 180.0]),  # whole minutes below 10 min
        (570.0, [540.0, 600.0]),
        (590.0, [540.0, 600.0]),  # the minute grid meets the coarse grid at 10 min
        (600.0, [600.0]),  # exactly on the coarse threshold: 5-minute steps
        (610.0, [600.0, 900.0]),
        (1750.0, [1500.0, 1800.0]),
    ],
)
def test_interval_grid_neighbours_worked_examples(tau: float, expected: list[float]) -> None:
    assert cm.interval_grid_neighbours(tau) == expected


def test_choose_interval_uses_the_given_parameters_grid() -> None:
    fine = cm.CostParams(interval_coarse_above_s=10_000.0, max_interval_s=3600.0)
    # τ* = √(2·C/λ) = √(2 · 32 · 3600) = 480 s
    lam = 1 / 3600
    assert cm.young_daly_interval_s(32.0, lam) == pytest.approx(480.0)
    # τ* = 2280 s (C = 722 s): the default grid caps at 1800 s, a minute grid without cap keeps 2280 s
    assert cm.choose_interval_s(None, 722.0, lam) == 1800.0
    assert cm.choose_interval_s(None, 722.0, lam, fine) == 2280.0
    assert cm.choose_interval_s(None, 722.0, 0.0, fine) == 3600.0  # no preemption: the cap


@pytest.mark.parametrize("q", [0.0, 1.0, 1.5, -0.1])
@pytest.mark.parametrize("mean", [3.0, 0.0])
def test_poisson_quantile_rejects_a_probability_outside_the_open_unit_interval(q: float, mean: float) -> None:
    with pytest.raises(ValueError, match=r"^q must be in \(0, 1\)$"):
        cm.poisson_quantile(mean, q)


@pytest.mark.parametrize("mean", [500.0, 500.5, 501.0, 800.0, 2000.0])
@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_poisson_quantile_near_and_above_the_normal_switch(mean: float, q: float) -> None:
    """Above a mean of 500 the Cornish-Fisher approximation is used; it is within one of the exact
    quantile, and at 500 itself the exact sum is used (so it is exact)."""
    from scipy.stats import poisson

    exact = int(poisson.ppf(q, mean))
    got = cm.poisson_quantile(mean, q)
    assert abs(got - exact) <= (0 if mean <= 500.0 else 1), (got, exact)


def test_poisson_quantile_cornish_fisher_worked_example() -> None:
    # mean 900, q = 0.9: z = 1.2815516; 900 + 1.2815516·30 + (z² - 1)/6 - 0.5 = 938.63; ceil = 939
    assert cm.poisson_quantile(900.0, 0.9) == 939
    # mean 2500, q = 0.99: z = 2.3263479; 2500 + 116.317 + 0.7353 - 0.5 = 2616.55 -> 2617
    assert cm.poisson_quantile(2500.0, 0.99) == 2617
    # cases where the skewness term (z² - 1)/6 decides the rounding
    assert cm.poisson_quantile(600.0, 0.9) == 631  # 600 + 31.392 + 0.1071 - 0.5 = 630.999 -> 631
    assert cm.poisson_quantile(800.0, 0.99) == 867  # 800 + 65.799 + 0.7353 - 0.5 = 866.03 -> 867
    assert cm.poisson_quantile(1000.0, 0.99) == 1074


def test_pessimistic_wall_s_worked_example() -> None:
    """work 7,200 s with 25 % checkpointing, τ = 1,200 s, λ = 1/h, R = 600 s, startup 100 s, wait 50 s.

    base = 9,000 s; mean preemptions = λ·base·(1 + λ(τ/2 + R)) = 2.5 · (1 + 1/3) = 10/3; at q = 0.9 the
    Poisson count is n = 6; lost = n·τ/2 + z·τ·√(n/12) = 3,600 + 1.28155·1,200·0.70711 = 4,687.4 s;
    total = 100 + 9,000 + 4,687.4 + 6·(600 + 50) = 17,687.4 s."""
    from statistics import NormalDist

    lam = 1 / 3600
    args = dict(work_p_s=7200.0, checkpoint_frac=0.25, interval_s=1200.0, rate_per_s=lam, restart_s=600.0)
    assert cm.poisson_quantile(10 / 3, 0.9) == 6
    z = NormalDist().inv_cdf(0.9)
    lost = 6 * 600.0 + z * 1200.0 * math.sqrt(6 / 12)
    want = 100.0 + 9000.0 + lost + 6 * 650.0
    assert want == pytest.approx(17687.4, abs=0.1)
    assert cm.pessimistic_wall_s(**args, startup_s=100.0, quantile=0.9, wait_s=50.0) == pytest.approx(want)
    # the defaults: the 0.9 quantile and no wait for capacity
    assert cm.pessimistic_wall_s(**args, startup_s=100.0) == pytest.approx(want - 6 * 50.0)
    # no preemption: startup and the checkpointed work only
    none = {**args, "rate_per_s": 0.0}
    assert cm.pessimistic_wall_s(**none, startup_s=100.0) == pytest.approx(9100.0)
    # the median (z = 0) with τ = 3,600 s and no restart time: mean preemptions 2.5 · (1 + 1,800/3,600)
    # = 3.75, whose median count is 4 (P(N ≤ 3) = 0.484); lost = 4 · 1,800 s; total 9,000 + 7,200 s
    long = {**args, "interval_s": 3600.0, "restart_s": 0.0}
    assert cm.pessimistic_wall_s(**long, startup_s=0.0, quantile=0.5) == pytest.approx(16200.0)
