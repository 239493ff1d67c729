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


# ---- documents ----------------------------------------------------------------------------------------


def _result(name: str, verdict: str, **over: object) -> S.MetricResult:
    doc: dict = dict(
        name=name, n=30, model=0.5, baseline=0.25, delta=0.25, ci95=(-0.1, 0.2), p_value=0.01,
        p_adjusted=0.02, test="paired_permutation", higher_is_better=True, verdict=verdict,
    )  # fmt: skip
    doc.update(over)
    return S.MetricResult(**doc)


def test_metric_and_guardrail_documents() -> None:
    r = _result("em", "better", test="mcnemar_exact", discordant=(7, 2))
    assert r.to_dict() == {
        "model": 0.5, "baseline": 0.25, "delta": 0.25, "ci95": [-0.1, 0.2], "p_value": 0.01,
        "p_adjusted": 0.02, "test": "mcnemar_exact", "n": 30, "higher_is_better": True, "verdict": "better",
        "discordant": {"model_only": 7, "baseline_only": 2},
    }  # fmt: skip
    assert "discordant" not in _result("loss", "worse").to_dict()
    assert Guardrail("lat", 0.05, 0.01).to_dict() == {
        "name": "lat",
        "threshold": 0.05,
        "value": 0.01,
        "passed": True,
    }
    assert Guardrail("lat", 0.05, 0.05).passed and not Guardrail("lat", 0.05, 0.0500001).passed
    lower = Guardrail("tok_s", 10.0, 10.0, kind="lower")
    assert lower.passed and not Guardrail("tok_s", 10.0, 9.99, kind="lower").passed
    assert not Guardrail("lat", 0.05, float("nan")).passed
    assert not Guardrail("tok_s", 10.0, float("inf"), kind="lower").passed


def test_noninferiority_document() -> None:
    from dataclasses import replace

    g = S.NonInferiorityResult(
        metric="loss", margin=0.1, n=40, delta=0.02, bound=0.07, p_value=0.01, p_adjusted=0.03,
        test="paired_t_one_sided", higher_is_better=False, alpha=0.05, correction="holm", passed=True,
        reason="ok",
    )  # fmt: skip
    doc = {
        "name": "loss", "kind": "non_inferiority", "threshold": 0.1, "value": 0.07, "passed": True,
        "margin": 0.1, "delta": 0.02, "p_value": 0.01, "p_adjusted": 0.03, "alpha": 0.05,
        "correction": "holm", "test": "paired_t_one_sided", "n": 40, "higher_is_better": False,
        "reason": "ok",
    }  # fmt: skip
    assert g.to_dict() == doc and g.label == "loss"
    on = replace(g, dataset="ds://s@2", higher_is_better=True)
    assert on.to_dict() == {**doc, "threshold": -0.1, "higher_is_better": True, "dataset": "ds://s@2"}
    assert on.label == "loss on ds://s@2"


# ---- building blocks against their definitions ---------------------------------------------------------


def test_holm_caps_at_one_and_keeps_the_input_order() -> None:
    assert holm([0.6, 0.9]) == [1.0, 1.0]  # 2 x 0.6 = 1.2, capped
    assert holm([0.04, 0.01]) == pytest.approx([0.04, 0.02])
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])  # 3 x .01, 2 x .03, then monotone
    assert holm([]) == []


def test_mcnemar_without_discordant_pairs_and_the_other_way_round() -> None:
    same = np.array([1.0, 0.0, 1.0, 1.0])
    assert mcnemar_exact(same, same.copy()) == (1.0, 0, 0)
    model = np.array([0] * 9 + [1] * 3 + [1] * 5, dtype=float)
    base = np.array([1] * 9 + [0] * 3 + [1] * 5, dtype=float)
    p, n01, n10 = mcnemar_exact(model, base)
    assert (n01, n10) == (3, 9) and p == pytest.approx(sps.binomtest(3, 12, 0.5).pvalue)


def _mean_diff_ref(x: np.ndarray, y: np.ndarray, axis: int) -> np.ndarray:
    return np.mean(x - y, axis=axis)


def _skewed(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    base = rng.normal(size=n)
    return base + rng.gamma(1.0, 0.5, size=n) - 0.4, base


def test_scipy_path_is_scipys_paired_bca_bootstrap_and_sign_flip_test() -> None:
    model, base = _skewed(40, 12)
    ci = sps.bootstrap(
        (model, base), _mean_diff_ref, paired=True, vectorized=True, method="BCa", n_resamples=300,
        confidence_level=0.95, random_state=np.random.default_rng(5),
    ).confidence_interval  # fmt: skip
    assert S._scipy_ci(model, base, 300, 5) == (ci.low, ci.high)
    ref = sps.permutation_test(
        (model, base), _mean_diff_ref, permutation_type="samples", vectorized=True, n_resamples=300,
        alternative="two-sided", random_state=np.random.default_rng(9),
    )  # fmt: skip
    assert S._scipy_permutation_p(model, base, 300, 9) == ref.pvalue


def test_a_degenerate_bca_interval_falls_back_to_the_percentile_interval() -> None:
    """Differences of 0.1 that vary only by rounding: the jackknife means are all equal, so BCa's
    acceleration is 0/0; the percentile interval of the same paired resamples is used instead."""
    base = np.random.default_rng(0).normal(size=40)
    model = base + 0.1
    assert np.ptp(model - base) > 0
    kw = dict(paired=True, vectorized=True, n_resamples=200)
    bca = sps.bootstrap(
        (model, base), _mean_diff_ref, method="BCa", random_state=np.random.default_rng(3), **kw
    )
    assert not np.isfinite(bca.confidence_interval.low)  # the case this test is about
    pct = sps.bootstrap(
        (model, base), _mean_diff_ref, method="percentile", random_state=np.random.default_rng(3), **kw
    ).confidence_interval
    assert S._scipy_ci(model, base, 200, 3) == (pct.low, pct.high)
    assert pct.high - pct.low < 1e-12  # resampled in pairs: the differences, not the scores, are resampled


def test_the_percentile_fallback_draws_the_resamples_it_was_asked_for() -> None:
    """One difference a unit in the last place above 1.0: the jackknife means all round to 1.0 (BCa is
    0/0), while a resample mean is 1.0 + 2**-52 when it draws that difference three or four times in
    four (5 % of resamples). 20 resamples of seed 1 draw it so too few times to reach the upper bound;
    scipy's default of 9999 would."""
    model, base = np.array([1.0, 1.0, 1.0, 1.0 + 2.0**-52]), np.zeros(4)
    kw = dict(paired=True, vectorized=True, method="percentile")
    pct = sps.bootstrap(
        (model, base), _mean_diff_ref, n_resamples=20, random_state=np.random.default_rng(1), **kw
    )
    assert (
        S._scipy_ci(model, base, 20, 1)
        == (pct.confidence_interval.low, pct.confidence_interval.high)
        == (1.0, 1.0)
    )
    many = sps.bootstrap((model, base), _mean_diff_ref, random_state=np.random.default_rng(1), **kw)
    assert many.confidence_interval.high == 1.0 + 2.0**-52  # so the resample count shows


def test_bootstrap_counts_draw_n_examples_per_resample_in_batches() -> None:
    n, resamples = 7, 2600  # ten full batches of 250 and one of 100
    counts = S._bootstrap_counts(n, resamples, np.random.default_rng(0))
    assert counts.shape == (resamples, n) and counts.dtype == np.float32
    assert np.all(counts.sum(axis=1) == n)  # each resample draws n examples, the last batch's too
    assert np.all(counts >= 0) and np.all(counts.sum(axis=0) > 0)  # every example, the first too
    # each example is drawn Binomial(n, 1/n) times in a resample
    assert np.var(counts, axis=0) == pytest.approx(np.full(n, 1 - 1 / n), abs=0.1)


def test_bca_interval_worked_examples() -> None:
    boot = np.arange(1.0, 101.0)
    # median-unbiased (z0 = 0) and no skew (a = 0): the 2.5 % and 97.5 % quantiles of 1..100
    assert S._bca_from(50.5, boot, np.array([-1.0, 0.0, 1.0])) == pytest.approx((3.475, 97.525))
    z = sps.norm.ppf([0.025, 0.975])
    # theta = 60: 59 of 100 replicates below it (ties do not count), z0 = Phi^-1(0.59)
    z0 = sps.norm.ppf(0.59)
    # constant jackknife: no acceleration
    q = sps.norm.cdf(z0 + (z0 + z))
    assert S._bca_from(60.0, boot, np.full(3, 2.0)) == pytest.approx(tuple(np.quantile(boot, q)))
    # jackknife 0, 0, 3: deviations from the mean 1, 1, -2 -> a = (1 + 1 - 8) / (6 * 6 ** 1.5)
    a = -6 / (6 * 6**1.5)
    q = sps.norm.cdf(z0 + (z0 + z) / (1 - a * (z0 + z)))
    assert S._bca_from(60.0, boot, np.array([0.0, 0.0, 3.0])) == pytest.approx(tuple(np.quantile(boot, q)))
    # the acceleration does not depend on the jackknife's scale (here a sum of squares below 1)
    assert S._bca_from(60.0, boot, np.array([0.0, 0.0, 0.3])) == pytest.approx(
        S._bca_from(60.0, boot, np.array([0.0, 0.0, 3.0]))
    )
    # a 90 % interval
    z90 = sps.norm.ppf([0.05, 0.95])
    q90 = sps.norm.cdf(z0 + (z0 + z90) / (1 - a * (z0 + z90)))
    got = S._bca_from(60.0, boot, np.array([0.0, 0.0, 3.0]), level=0.9)
    assert got == pytest.approx(tuple(np.quantile(boot, q90)))
    # every replicate below theta: z0 is infinite and the BCa levels undefined -> the percentile interval
    assert S._bca_from(200.0, boot, np.array([0.0, 0.0, 3.0])) == pytest.approx((3.475, 97.525))


def test_fast_cis_are_bca_on_the_resampled_means_and_the_leave_one_out_means() -> None:
    model, base = _skewed(60, 4)
    d = np.stack([model - base, (model - base) ** 2], axis=1)
    got = S._fast_cis(d, 300, np.random.default_rng(8))
    counts = S._bootstrap_counts(60, 300, np.random.default_rng(8)).astype(np.float64)
    for j, (lo, hi) in enumerate(got):
        col = d[:, j]
        boot = counts @ col / 60
        jack = np.array([np.delete(col, i).mean() for i in range(60)])
        assert (lo, hi) == pytest.approx(S._bca_from(float(col.mean()), boot, jack), rel=1e-5, abs=1e-6)


def test_fast_sign_flip_p_values_count_as_scipy_does() -> None:
    rng = np.random.default_rng(6)
    d = np.stack([np.ones(64), np.tile([1.0, -1.0], 32), -np.ones(64)], axis=1)
    # nothing as extreme as all 64 positive (or all negative): (0 + 1) / (R + 1), two-sided; a mean of 0:
    # capped at 1
    assert S._fast_permutation_ps(d, 1000, rng) == [2 / 1001, 1.0, 2 / 1001]
    # 8 equal negative differences: only the all-minus flip (1 in 256) is as extreme (scipy: 2/256)
    (p,) = S._fast_permutation_ps(-np.ones((8, 1)), 25600, rng)
    assert p == pytest.approx(2 / 256, abs=0.003)
    # ties within the relative tolerance of 1e-6 count as extreme: [1, 1.5e-6] has flips 0.50000075 (the
    # observed) and 0.49999925, 1.5e-6 apart: only the observed one is as extreme, scipy's exact p is 0.5
    (p,) = S._fast_permutation_ps(np.array([[1.0], [1.5e-6]]), 4000, rng)
    assert p == pytest.approx(0.5, abs=0.06)
    exact = sps.permutation_test(
        (np.array([1.0, 1.5e-6]), np.zeros(2)), _mean_diff_ref, permutation_type="samples", vectorized=True
    )
    assert exact.pvalue == pytest.approx(0.5)
    # the tolerance is relative to the observed mean: [2000, 0.0005] has flips 1000.00025 and 999.99975,
    # within 1e-6 x 1000 of each other, so both count as extreme (where scipy's tighter tolerance says 0.5)
    (p,) = S._fast_permutation_ps(np.array([[2000.0], [0.0005]]), 4000, rng)
    assert p == pytest.approx(1.0, abs=0.1)
    # 52 of 100 differences +1, 48 -1: a flip's mean is at least the observed 0.04 when at least 52 of the
    # signs are +1, P = Binomial(100, 1/2).sf(51); two-sided, as scipy's exact test
    d = np.array([1.0] * 52 + [-1.0] * 48)[:, None]
    (p,) = S._fast_permutation_ps(d, 2000, rng)
    assert p == pytest.approx(2 * sps.binom.sf(51, 100, 0.5), abs=0.06)


class _CountingGenerator:
    """A generator that counts the rows of random numbers drawn from it."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self.rows: list[int] = []

    def integers(self, *args: object, **kwargs: object) -> np.ndarray:
        out = self._rng.integers(*args, **kwargs)  # type: ignore[call-overload]
        self.rows.append(out.shape[0])
        return out


@pytest.mark.parametrize("resamples", [1, 250, 260, 600])
def test_closed_forms_draw_exactly_n_resamples_in_batches(resamples: int) -> None:
    rng = _CountingGenerator(1)
    S._fast_permutation_ps(np.ones((10, 1)), resamples, rng)  # type: ignore[arg-type]
    assert sum(rng.rows) == resamples and max(rng.rows) <= 250
    rng = _CountingGenerator(1)
    S._bootstrap_counts(10, resamples, rng)  # type: ignore[arg-type]
    assert sum(rng.rows) == resamples and max(rng.rows) <= 250


# ---- the comparison's paths --------------------------------------------------------------------------


def test_constant_differences_need_no_resampling() -> None:
    z = np.zeros(30)
    ones = np.ones(30)
    c = compare(
        {
            "acc": MetricInput(z + 0.25, z),
            "em": MetricInput(ones, z, binary=True),
            "same": MetricInput(ones, ones.copy()),
        }
    )
    acc, em, same = c.metrics["acc"], c.metrics["em"], c.metrics["same"]
    # exact sign-flip test: of the 2^30 flips only the two all-same-sign ones are as extreme
    assert (acc.p_value, acc.test, acc.ci95, acc.delta) == (
        2.0**-29,
        "paired_permutation",
        (0.25, 0.25),
        0.25,
    )
    assert (em.p_value, em.test, em.discordant) == (pytest.approx(2.0**-29), "mcnemar_exact", (30, 0))
    assert (same.p_value, same.test, same.ci95, same.discordant) == (1.0, "none", (0.0, 0.0), None)
    assert acc.p_adjusted == pytest.approx(3 * 2.0**-29) and same.p_adjusted == 1.0  # Holm over three
    assert (acc.model, acc.baseline, acc.n) == (0.25, 0.0, 30)
    # n == min_examples is enough
    assert acc.verdict == em.verdict == "better" and same.verdict == "no_difference" and c.verdict == "better"
    assert c.metrics_document() == {k: r.to_dict() for k, r in c.metrics.items()}


def test_tiny_splits() -> None:
    empty = compare({"loss": MetricInput([], [])})
    r = empty.metrics["loss"]
    assert empty.n == 0 and (r.delta, r.ci95, r.p_value, r.test) == (0.0, (0.0, 0.0), 1.0, "none")
    assert np.isnan(r.model) and np.isnan(r.baseline) and r.verdict == "inconclusive"
    one = compare({"loss": MetricInput([1.5], [1.0])}).metrics["loss"]
    assert (one.delta, one.ci95, one.p_value, one.test) == (0.5, (0.5, 0.5), 1.0, "none")
    two = compare({"loss": MetricInput([1.5, 2.5], [1.0, 2.0])}, min_examples=2)
    r = two.metrics["loss"]
    assert (r.p_value, r.test) == (0.5, "paired_permutation") and two.verdict == "no_difference"
    varying = compare({"loss": MetricInput([1.5, 3.0], [1.0, 2.0])}, n_resamples=99, seed=1).metrics["loss"]
    assert varying.test == "paired_permutation" and varying.ci95[0] < varying.ci95[1]
    assert varying.p_value == S._scipy_permutation_p(np.array([1.5, 3.0]), np.array([1.0, 2.0]), 99, 101)


def _mixed(n: int, seed: int) -> dict[str, MetricInput]:
    rng = np.random.default_rng(seed)
    em_b = (rng.random(n) < 0.5).astype(float)
    em_m = np.where(rng.random(n) < 0.3, 1.0 - em_b, em_b)
    a_m, a_b = _skewed(n, seed + 1)
    b_b = rng.gamma(2.0, 1.0, size=n)
    return {  # no true differences: p-values well above the smallest a resampling test can give
        "em": MetricInput(em_m, em_b, binary=True),
        "a": MetricInput(a_m - 0.1, a_b),
        "b": MetricInput(b_b + rng.normal(0.0, 0.5, size=n), b_b, higher_is_better=False),
    }


@pytest.mark.parametrize("n", [40, 500])  # the scipy path up to SCIPY_MAX_N examples included
def test_scipy_path_seeds_each_metric_by_its_place(n: int) -> None:
    metrics = _mixed(n, 2)
    c = compare(metrics, n_resamples=99, seed=3)
    arrays = {k: (np.asarray(v.model), np.asarray(v.baseline)) for k, v in metrics.items()}
    for i, name in enumerate(["em", "a", "b"]):  # intervals: every varying metric, binary ones too
        assert c.metrics[name].ci95 == S._scipy_ci(*arrays[name], 99, 3 + i)
    for i, name in enumerate(["a", "b"]):  # permutation tests: the continuous metrics
        assert c.metrics[name].p_value == S._scipy_permutation_p(*arrays[name], 99, 3 + 100 + i)
        assert c.metrics[name].test == "paired_permutation" and c.metrics[name].p_value > 0.05
    default = compare(metrics, n_resamples=99)  # the default seed is 0
    assert default.metrics["a"].ci95 == S._scipy_ci(*arrays["a"], 99, 1)
    assert default.metrics["a"].p_value == S._scipy_permutation_p(*arrays["a"], 99, 100)
    p, n01, n10 = mcnemar_exact(*arrays["em"])
    assert (c.metrics["em"].p_value, c.metrics["em"].test, c.metrics["em"].discordant) == (
        p, "mcnemar_exact", (n01, n10),
    )  # fmt: skip
    assert [c.metrics[k].p_adjusted for k in ("em", "a", "b")] == holm(
        [c.metrics[k].p_value for k in ("em", "a", "b")]
    )


def test_closed_form_path_above_scipy_max_n_shares_one_generator() -> None:
    n = S.SCIPY_MAX_N + 1
    metrics = _mixed(n, 5)
    c = compare(metrics, n_resamples=120, seed=4)
    d = {k: np.asarray(v.model) - np.asarray(v.baseline) for k, v in metrics.items()}
    rng = np.random.default_rng(4)
    cis = S._fast_cis(np.stack([d["em"], d["a"], d["b"]], axis=1), 120, rng)
    ps = S._fast_permutation_ps(np.stack([d["a"], d["b"]], axis=1), 120, rng)  # the same generator, after
    assert [c.metrics[k].ci95 for k in ("em", "a", "b")] == cis
    assert [c.metrics[k].p_value for k in ("a", "b")] == ps
    assert c.metrics["em"].test == "mcnemar_exact" and c.metrics["a"].test == "paired_permutation"


def test_metric_verdict_rules() -> None:
    assert S._metric_verdict(0.1, 0.049, True, 0.05) == "better"
    assert S._metric_verdict(0.1, 0.05, True, 0.05) == "no_difference"  # p must be below alpha
    assert S._metric_verdict(-0.1, 0.01, True, 0.05) == "worse"
    assert S._metric_verdict(-0.1, 0.01, False, 0.05) == "better"
    assert S._metric_verdict(0.1, 0.01, False, 0.05) == "worse"
    assert S._metric_verdict(0.0, 0.01, True, 0.05) == "no_difference"


def test_overall_verdict_rules() -> None:
    worse, better, same = _result("x", "worse"), _result("y", "better"), _result("z", "no_difference")
    assert S.overall_verdict([better], 29, 30) == "inconclusive"
    assert S.overall_verdict([better], 30, 30) == "better"
    assert S.overall_verdict([better, worse], 30, 30) == "worse"
    assert S.overall_verdict([better, worse], 30, 30, guarded=["x"]) == "better"  # under a margin
    assert S.overall_verdict([same], 30, 30) == "no_difference"
    assert S.overall_verdict([better, same], 30, 30, primary="z") == "no_difference"
    assert S.overall_verdict([better, same], 30, 30, primary="y") == "better"
    # the primary metric is judged even when named among the guarded ones
    assert S.overall_verdict([_result("x", "worse"), better], 30, 30, primary="x", guarded=["x"]) == "worse"


def test_a_dataset_guardrail_does_not_excuse_the_same_metric_on_the_own_split() -> None:
    z = np.zeros(30)
    own = {"acc": MetricInput(z + 0.25, z), "loss": MetricInput(z + 0.5, z, higher_is_better=False)}
    other = MetricInput(z + 0.1, z, higher_is_better=False)
    c = compare(own, dataset_guardrails=[S.DatasetNonInferiority("ds://o@1", "loss", 1.0, other)])
    assert c.metrics["loss"].verdict == "worse" and c.verdict == "worse"
    assert c.metrics["loss"].higher_is_better is False and c.metrics["acc"].higher_is_better is True
    guarded = compare(own, non_inferiority=[S.NonInferiority("loss", 1.0)])
    assert guarded.verdict == "better"


def test_settings_are_carried_into_the_comparison() -> None:
    z = np.zeros(12)
    c = compare({"acc": MetricInput(z + 0.25, z)}, alpha=0.1, min_examples=10, primary="acc")
    assert (c.alpha, c.min_examples, c.primary, c.n, c.verdict) == (0.1, 10, "acc", 12, "better")
    assert compare({"acc": MetricInput(z + 0.25, z)}, min_examples=13).verdict == "inconclusive"


@pytest.mark.parametrize(
    ("metrics", "kwargs", "message"),
    [
        ({}, {}, "compare needs at least one metric"),
        (None, {"alpha": 0.0}, r"alpha must lie in \(0, 0.5\)"),
        (None, {"alpha": 0.5}, r"alpha must lie in \(0, 0.5\)"),
        (None, {"correction": "bonferroni"}, "correction must be 'holm' or 'none'"),
        (
            None,
            {"non_inferiority": [S.NonInferiority("em", float("inf"))]},
            "non-inferiority margin of em must be a positive number",
        ),
        (
            None,
            {"non_inferiority": [S.NonInferiority("em", -0.1)]},
            "non-inferiority margin of em must be a positive number",
        ),
        (
            None,
            {"non_inferiority": [S.NonInferiority("acc", 0.1)], "primary": "acc"},
            "acc is the primary metric; it cannot also be a guardrail",
        ),
        (None, {"non_inferiority": [S.NonInferiority("em", 0.1)] * 2}, "em has two non-inferiority margins"),
        (
            None,
            {"dataset_guardrails": [S.DatasetNonInferiority("ds://x@1", "em", float("inf"))]},
            "non-inferiority margin of em on ds://x@1 must be a positive number",
        ),
        (
            None,
            {"dataset_guardrails": [S.DatasetNonInferiority("ds://x@1", "em", 0.0)]},
            "non-inferiority margin of em on ds://x@1 must be a positive number",
        ),
        (
            None,
            {"dataset_guardrails": [S.DatasetNonInferiority("ds://x@1", "em", 0.1)] * 2},
            "em on ds://x@1 has two non-inferiority margins",
        ),
        (
            {"acc": MetricInput([1.0, 2.0], [1.0])},
            {},
            "metric acc: model and baseline need the same number of examples",
        ),
        (
            {"acc": MetricInput([[1.0, 2.0]], [[1.0, 2.0]])},
            {},
            "metric acc: model and baseline need the same number of examples",
        ),
        ({"acc": MetricInput([1.0, 2.0], [1.0, float("nan")])}, {}, "metric acc: scores must be finite"),
        ({"acc": MetricInput([float("inf"), 2.0], [1.0, 1.0])}, {}, "metric acc: scores must be finite"),
        (
            {"acc": MetricInput([1.0, 2.0], [1.0, 1.0]), "em": MetricInput([1.0], [1.0])},
            {},
            "every metric must cover the same examples",
        ),
    ],
)
def test_bad_comparisons_are_refused_with_the_reason(
    metrics: dict | None, kwargs: dict, message: str
) -> None:
    if metrics is None:
        metrics = {"acc": MetricInput([1.0, 2.0], [1.0, 1.0])}
    with pytest.raises(ValueError, match=f"^{message}$"):
        compare(metrics, **kwargs)


def test_accepted_settings_at_the_edges() -> None:
    z = np.zeros(30)
    metrics = {"acc": MetricInput(z + 0.25, z), "em": MetricInput(z + 1.0, z, binary=True)}
    assert compare(metrics, alpha=0.49, correction="none").passed
    better_em = MetricInput(z + 1.0, z, binary=True)
    two_datasets = [  # the same metric on two datasets, two metrics on one
        S.DatasetNonInferiority("ds://x@1", "em", 0.1, better_em),
        S.DatasetNonInferiority("ds://y@1", "em", 0.1, better_em),
        S.DatasetNonInferiority("ds://x@1", "acc", 0.1, MetricInput(z + 0.25, z)),
    ]
    c = compare(
        metrics, primary="acc", non_inferiority=[S.NonInferiority("em", 0.1)], dataset_guardrails=two_datasets
    )
    assert len(c.non_inferiority) == 4 and c.passed


def test_largest_differences_default_count_ties_and_zeros() -> None:
    wins, losses = S.largest_differences([0.1, -0.5, 0.7, 0.0, -0.2], higher_is_better=True)
    assert wins == [2, 0] and losses == [1, 4]  # a zero difference is neither
    wins, _ = S.largest_differences([0.3] * 40, higher_is_better=True)
    assert wins == [0, 1, 2, 3, 4]  # five by default; ties in the examples' order
    d = np.round(np.random.default_rng(0).random(200), 1)  # many ties
    wins, losses = S.largest_differences(d - 0.5, higher_is_better=True, k=40)
    assert wins == sorted((i for i in range(200) if d[i] > 0.5), key=lambda i: (-d[i], i))[:40]
    assert S.largest_differences([1, -2, 3], higher_is_better=False) == ([1], [2, 0])


def test_boolean_scores_are_zero_one_scores() -> None:
    right = np.ones(30, dtype=bool)
    wrong = np.zeros(30, dtype=bool)
    c = compare(
        {"em": MetricInput(right, wrong, binary=True)},
        dataset_guardrails=[
            S.DatasetNonInferiority("ds://x@1", "em", 0.1, MetricInput(right, wrong, binary=True))
        ],
    )
    assert c.metrics["em"].delta == 1.0 and c.metrics["em"].discordant == (30, 0)
    assert c.non_inferiority[0].delta == 1.0 and c.passed
