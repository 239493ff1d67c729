"""The paired statistics behind the promotion gate: agreement with scipy, calibration under the null,
power on a planted effect, McNemar and Holm on known values, and the minimum sample size."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from trainyard.evaluation import stats as S
from trainyard.evaluation.stats import Guardrail, MetricInput, compare, holm, mcnemar_exact


def test_holm_known_values() -> None:
    # m = 4: sorted p = .01 .02 .03 .04 -> 4*.01, 3*.02, 2*.03, 1*.04 made monotone
    assert holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([0.001]) == pytest.approx([0.001])


def test_mcnemar_is_a_binomial_test_on_discordant_pairs() -> None:
    model = np.array([1] * 12 + [0] * 2 + [1] * 30 + [0] * 20)
    base = np.array([0] * 12 + [1] * 2 + [1] * 30 + [0] * 20)
    p, n01, n10 = mcnemar_exact(model, base)
    assert (n01, n10) == (12, 2)
    assert p == pytest.approx(sps.binomtest(12, 14, 0.5).pvalue)
    assert p < 0.05


def test_fast_path_agrees_with_scipy() -> None:
    rng = np.random.default_rng(3)
    n = 800
    base = rng.normal(size=n)
    model = base + rng.normal(0.08, 1.0, size=n) + 0.3 * rng.exponential(size=n)  # skewed differences
    d = (model - base)[:, None]
    lo_s, hi_s = S._scipy_ci(model, base, 4000, 0)
    ((lo_f, hi_f),) = S._fast_cis(d, 4000, np.random.default_rng(1))
    width = hi_s - lo_s
    assert abs(lo_f - lo_s) < 0.1 * width and abs(hi_f - hi_s) < 0.1 * width
    p_s = S._scipy_permutation_p(model, base, 4000, 0)
    (p_f,) = S._fast_permutation_ps(d, 4000, np.random.default_rng(2))
    assert abs(p_f - p_s) < 0.02 + 0.2 * p_s


@pytest.mark.parametrize("n", [120, 1500])  # the scipy path and the closed-form path
def test_gate_is_calibrated_under_the_null(n: int) -> None:
    """A model equal in distribution to its baseline passes the gate at most 5 % + noise of the time."""
    rng = np.random.default_rng(11)
    trials = 120
    passed = 0
    for t in range(trials):
        base_loss = rng.gamma(2.0, 1.0, size=n)
        model_loss = base_loss + rng.normal(0.0, 0.5, size=n)  # paired, zero mean shift
        base_em = (rng.random(n) < 0.5).astype(float)
        model_em = np.where(rng.random(n) < 0.2, 1.0 - base_em, base_em)  # flips as likely both ways
        c = compare(
            {
                "loss": MetricInput(model_loss, base_loss, higher_is_better=False),
                "exact_match": MetricInput(model_em, base_em, binary=True),
            },
            n_resamples=300,
            seed=t,
        )
        passed += c.passed
    bound = 0.05 + 3 * np.sqrt(0.05 * 0.95 / trials)
    assert passed / trials <= bound


def test_gate_has_power_on_a_planted_effect() -> None:
    rng = np.random.default_rng(5)
    trials, detected = 25, 0
    for t in range(trials):
        n = 200
        base = rng.gamma(2.0, 1.0, size=n)
        model = base - 0.25 + rng.normal(0.0, 0.8, size=n)  # lower loss by 0.25 (0.3 SD of the diffs)
        c = compare({"loss": MetricInput(model, base, higher_is_better=False)}, n_resamples=500, seed=t)
        detected += c.verdict == "better" and c.passed
        assert c.metrics["loss"].ci95[0] < c.metrics["loss"].ci95[1]
    assert detected / trials >= 0.8


def test_worse_model_is_worse_and_fails() -> None:
    rng = np.random.default_rng(9)
    base = rng.normal(2.0, 0.3, size=300)
    model = base + 0.2 + rng.normal(0, 0.1, size=300)
    c = compare({"loss": MetricInput(model, base, higher_is_better=False)})
    assert c.verdict == "worse" and not c.passed
    r = c.metrics["loss"]
    assert r.delta == pytest.approx(float(np.mean(model - base)))
    assert r.ci95[0] > 0 and r.test == "paired_permutation" and r.p_value < 0.01


def test_better_on_one_metric_worse_on_another_is_worse() -> None:
    rng = np.random.default_rng(2)
    n = 400
    base = rng.normal(2.0, 0.3, size=n)
    em_b = (rng.random(n) < 0.5).astype(float)
    em_m = np.where(rng.random(n) < 0.3, 0.0, em_b)  # the model loses right answers
    c = compare(
        {
            "loss": MetricInput(base - 0.3, base + rng.normal(0, 0.01, n), higher_is_better=False),
            "exact_match": MetricInput(em_m, em_b, binary=True),
        }
    )
    assert c.metrics["loss"].verdict == "better"
    assert c.metrics["exact_match"].verdict == "worse" and c.metrics["exact_match"].test == "mcnemar_exact"
    assert c.verdict == "worse" and not c.passed


def test_too_few_examples_is_inconclusive_even_with_a_huge_effect() -> None:
    base = np.linspace(2.0, 3.0, 10)
    c = compare(
        {"loss": MetricInput(base - 1.0 + 0.01 * np.sin(np.arange(10)), base, higher_is_better=False)}
    )
    assert c.verdict == "inconclusive" and not c.passed
    assert c.metrics["loss"].verdict == "inconclusive"


def test_identical_models_have_no_difference() -> None:
    x = np.random.default_rng(0).normal(size=100)
    c = compare({"loss": MetricInput(x, x.copy(), higher_is_better=False)})
    r = c.metrics["loss"]
    assert c.verdict == "no_difference" and r.p_value == 1.0 and r.ci95 == (0.0, 0.0)


def test_a_failing_guardrail_blocks_the_gate() -> None:
    rng = np.random.default_rng(4)
    base = rng.normal(2.0, 0.3, size=300)
    model = base - 0.3 + rng.normal(0, 0.05, size=300)
    metrics = {"loss": MetricInput(model, base, higher_is_better=False)}
    ok = compare(metrics, guardrails=[Guardrail("latency_s_per_token", 0.05, 0.01)])
    bad = compare(metrics, guardrails=[Guardrail("latency_s_per_token", 0.05, 0.2)])
    assert ok.verdict == bad.verdict == "better"
    assert ok.passed and not bad.passed


def test_largest_differences_orders_wins_and_losses() -> None:
    wins, losses = S.largest_differences([0.1, -0.5, 0.7, 0.0, -0.2], higher_is_better=True, k=2)
    assert wins == [2, 0] and losses == [1, 4]
    wins, losses = S.largest_differences([0.1, -0.5, 0.7], higher_is_better=False, k=5)
    assert wins == [1] and losses == [2, 0]


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(ValueError):
        compare({"loss": MetricInput([1.0, 2.0], [1.0])})
