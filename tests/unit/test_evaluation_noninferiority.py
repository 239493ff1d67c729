"""Non-inferiority guardrails of the promotion gate: the one-sided tests against scipy on known answers,
Tango's score test against a numerical restricted maximum likelihood, calibration at the margin, power,
the gate's decisions and reasons, and invariants (hypothesis) that must hold for any data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize
from scipy import stats as sps

from trainyard.evaluation import stats as S
from trainyard.evaluation.stats import MetricInput, NonInferiority, compare

# ---- known answers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("shift", "sd", "margin", "n"), [(-0.02, 0.3, 0.05, 200), (0.1, 1.0, 0.2, 40)])
def test_continuous_test_is_scipys_one_sided_paired_t(shift: float, sd: float, margin: float, n: int) -> None:
    rng = np.random.default_rng(7)
    base = rng.gamma(2.0, 1.0, size=n)
    model = base + rng.normal(shift, sd, size=n)
    ref = sps.ttest_rel(model + margin, base, alternative="greater")  # H0: mean(model - base) <= -margin
    p, bound = S.paired_t_noninferiority(model - base, margin, 0.05)
    assert p == pytest.approx(ref.pvalue, rel=1e-10)
    assert bound == pytest.approx(ref.confidence_interval(0.95).low - margin, rel=1e-10)
    c = compare({"acc": MetricInput(model, base)}, non_inferiority=[NonInferiority("acc", margin)])
    (g,) = c.non_inferiority
    assert g.test == "paired_t_one_sided" and g.p_value == pytest.approx(ref.pvalue, rel=1e-10)
    assert g.passed == (ref.pvalue < 0.05)


def test_lower_is_better_metrics_are_tested_in_their_good_direction() -> None:
    rng = np.random.default_rng(3)
    base = rng.gamma(2.0, 1.0, size=150)
    model = base + rng.normal(0.03, 0.2, size=150)  # loss up by 0.03, margin 0.1
    c = compare(
        {"loss": MetricInput(model, base, higher_is_better=False)},
        non_inferiority=[NonInferiority("loss", 0.1)],
    )
    (g,) = c.non_inferiority
    ref = sps.ttest_rel(model - 0.1, base, alternative="less")  # H0: mean(model - base) >= +margin
    assert g.p_value == pytest.approx(ref.pvalue, rel=1e-10)
    assert g.bound == pytest.approx(ref.confidence_interval(0.95).high + 0.1, rel=1e-10)
    assert g.to_dict()["threshold"] == 0.1 and g.bound < 0.1 and g.passed


def _tango_reference(wins: int, losses: int, n: int, d0: float) -> tuple[float, float]:
    """The restricted MLE of P(loss) found numerically, and the score test's one-sided p-value from it."""
    rest = n - wins - losses

    def nll(q: float) -> float:
        out = -rest * math.log(1.0 - 2.0 * q - d0)
        if wins:
            out -= wins * math.log(q + d0)
        if losses:
            out -= losses * math.log(q)
        return out

    lo = max(0.0, -d0) + 1e-13
    hi = (1.0 - d0) / 2.0 - 1e-13
    q = float(optimize.minimize_scalar(nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-13}).x)
    z = (wins - losses - n * d0) / math.sqrt(n * (2 * q + d0 - d0 * d0))
    return q, float(sps.norm.sf(z))


@pytest.mark.parametrize(
    ("wins", "losses", "n", "margin"),
    [(12, 15, 200, 0.05), (0, 0, 100, 0.1), (30, 5, 120, 0.02), (3, 20, 60, 0.1), (40, 41, 81, 0.05)],
)
def test_tango_matches_the_numerical_restricted_mle(wins: int, losses: int, n: int, margin: float) -> None:
    q_ref, p_ref = _tango_reference(wins, losses, n, -margin)
    assert S.tango_restricted_mle(wins, losses, n, -margin) == pytest.approx(q_ref, abs=1e-7)
    p, bound = S.tango_noninferiority(wins, losses, n, margin, 0.05)
    assert p == pytest.approx(p_ref, rel=1e-5, abs=1e-12)
    # the bound is where the test stops rejecting: p(bound) = alpha
    assert _tango_reference(wins, losses, n, bound)[1] == pytest.approx(0.05, abs=1e-6)


def test_tango_without_a_margin_is_mcnemars_z() -> None:
    for wins, losses in [(12, 2), (5, 9), (30, 31)]:
        assert S.tango_z(wins, losses, 100, 0.0) == pytest.approx((wins - losses) / math.sqrt(wins + losses))


def test_binary_guardrail_uses_tango_and_counts_discordant_pairs() -> None:
    base = np.array([1] * 40 + [0] * 40 + [1] * 10 + [0] * 6, dtype=float)
    model = np.array([1] * 40 + [0] * 40 + [0] * 10 + [1] * 6, dtype=float)  # 6 wins, 10 losses
    c = compare(
        {"exact_match": MetricInput(model, base, binary=True)},
        non_inferiority=[NonInferiority("exact_match", 0.1)],
    )
    (g,) = c.non_inferiority
    assert g.test == "tango_score"
    assert g.p_value == pytest.approx(_tango_reference(6, 10, 96, -0.1)[1], rel=1e-5)
    assert g.delta == pytest.approx(-4 / 96)


def test_holm_across_the_guardrails() -> None:
    rng = np.random.default_rng(1)
    n = 300
    base = {k: rng.normal(size=n) for k in ("a", "b", "c")}
    model = {k: base[k] + rng.normal(-0.05, 0.5, size=n) for k in base}
    metrics = {k: MetricInput(model[k], base[k]) for k in base}
    specs = [NonInferiority(k, 0.1) for k in base]
    holm = compare(metrics, non_inferiority=specs)
    none = compare(metrics, non_inferiority=specs, correction="none")
    raw = [g.p_value for g in none.non_inferiority]
    assert [g.p_value for g in holm.non_inferiority] == pytest.approx(raw)
    assert [g.p_adjusted for g in holm.non_inferiority] == pytest.approx(S.holm(raw))
    assert [g.p_adjusted for g in none.non_inferiority] == pytest.approx(raw)
    assert all(g.correction == "holm" for g in holm.non_inferiority)


# ---- the gate ----------------------------------------------------------------------------------------


def _pair(rng: np.random.Generator, n: int, em_loss_rate: float) -> dict[str, MetricInput]:
    base_loss = rng.gamma(2.0, 1.0, size=n)
    model_loss = base_loss - 0.3 + rng.normal(0, 0.3, size=n)  # clearly better on the primary metric
    base_em = (rng.random(n) < 0.6).astype(float)
    model_em = np.where(rng.random(n) < em_loss_rate, 0.0, base_em)  # loses some right answers
    return {
        "loss": MetricInput(model_loss, base_loss, higher_is_better=False),
        "exact_match": MetricInput(model_em, base_em, binary=True),
    }


def test_a_small_loss_within_the_margin_passes_and_a_large_one_blocks() -> None:
    rng = np.random.default_rng(4)
    small = _pair(rng, 2000, 0.01)  # exact match down ~0.6 points: significant, but within 3 points
    large = _pair(rng, 2000, 0.15)  # down ~9 points
    without = compare(small, primary="loss")
    assert without.metrics["exact_match"].verdict == "worse" and not without.passed  # no margin: blocked
    ok = compare(small, primary="loss", non_inferiority=[NonInferiority("exact_match", 0.03)])
    assert ok.verdict == "better" and ok.passed
    assert ok.non_inferiority[0].passed and ok.non_inferiority[0].bound > -0.03
    bad = compare(large, primary="loss", non_inferiority=[NonInferiority("exact_match", 0.03)])
    assert bad.verdict == "better" and not bad.passed  # the primary metric is better; the guardrail fails
    assert bad.reasons[0].startswith("exact_match: not shown non-inferior within margin 0.03")
    assert any(r.startswith("primary metric loss: better") for r in bad.reasons)


def test_the_primary_metric_must_be_better() -> None:
    rng = np.random.default_rng(8)
    n = 400
    base_loss = rng.gamma(2.0, 1.0, size=n)
    base_em = (rng.random(n) < 0.4).astype(float)
    model_em = np.where(rng.random(n) < 0.3, 1.0, base_em)  # better exact match, same loss
    metrics = {
        "loss": MetricInput(base_loss + rng.normal(0, 0.2, n), base_loss, higher_is_better=False),
        "exact_match": MetricInput(model_em, base_em, binary=True),
    }
    assert compare(metrics).passed  # any metric better opens the gate without a primary metric
    c = compare(metrics, primary="loss")
    assert c.verdict == "no_difference" and not c.passed
    assert c.reasons[0].startswith("primary metric loss: no_difference")
    assert compare(metrics, primary="exact_match").passed
    missing = compare(metrics, primary="bleu")
    assert not missing.passed and missing.reasons[0] == "primary metric bleu was not measured"


def test_an_unmeasured_guardrail_or_too_few_examples_fail_it() -> None:
    rng = np.random.default_rng(2)
    metrics = _pair(rng, 200, 0.0)
    c = compare(metrics, primary="loss", non_inferiority=[NonInferiority("toxicity", 0.01)])
    assert not c.passed and c.non_inferiority[0].reason.startswith("not measured")
    few = compare(_pair(rng, 20, 0.0), primary="loss", non_inferiority=[NonInferiority("exact_match", 0.5)])
    assert (
        few.verdict == "inconclusive" and not few.passed and "inconclusive" in few.non_inferiority[0].reason
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"non_inferiority": [NonInferiority("exact_match", 0.0)]},
        {"non_inferiority": [NonInferiority("exact_match", float("nan"))]},
        {"non_inferiority": [NonInferiority("loss", 0.1)], "primary": "loss"},
        {"non_inferiority": [NonInferiority("exact_match", 0.1)] * 2},
        {"alpha": 0.5},
        {"correction": "bonferroni"},
    ],
)
def test_bad_gate_settings_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        compare(_pair(np.random.default_rng(0), 50, 0.0), **kwargs)


# ---- calibration and power ---------------------------------------------------------------------------


def test_calibrated_at_the_margin() -> None:
    """A model exactly ``margin`` worse (the boundary of H0) passes the guardrail at most alpha + noise."""
    rng = np.random.default_rng(21)
    trials, n, margin = 400, 300, 0.05
    passed_t = passed_b = 0
    for _ in range(trials):
        base = rng.normal(size=n)
        model = base - margin + rng.standard_t(5, size=n) * 0.4  # skewless heavy tails
        passed_t += S.paired_t_noninferiority(model - base, margin, 0.05)[0] < 0.05
        # binary: P(win) = 0.10, P(loss) = 0.15 -> difference exactly -margin
        u = rng.random(n)
        wins, losses = int(np.sum(u < 0.10)), int(np.sum((u >= 0.10) & (u < 0.25)))
        passed_b += S.tango_noninferiority(wins, losses, n, margin, 0.05)[0] < 0.05
    bound = 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials)
    assert passed_t / trials <= bound
    assert passed_b / trials <= bound


def test_power_when_the_model_is_as_good() -> None:
    rng = np.random.default_rng(22)
    trials, n, margin = 100, 1000, 0.05  # expected power: about 0.94 (binary), 0.99 (continuous)
    passed_b = passed_t = 0
    for _ in range(trials):
        u = rng.random(n)
        wins, losses = int(np.sum(u < 0.12)), int(np.sum((u >= 0.12) & (u < 0.24)))  # no true difference
        passed_b += S.tango_noninferiority(wins, losses, n, margin, 0.05)[0] < 0.05
        d = rng.normal(0.0, 0.4, size=n)
        passed_t += S.paired_t_noninferiority(d, margin, 0.05)[0] < 0.05
    assert passed_b / trials >= 0.8 and passed_t / trials >= 0.8


# ---- invariants --------------------------------------------------------------------------------------

scores = st.lists(st.floats(-5, 5, allow_nan=False, width=32), min_size=35, max_size=80)
bits = st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1)), min_size=35, max_size=120)
margins = st.floats(0.001, 2.0)


@settings(max_examples=60, deadline=None)
@given(scores, scores, margins, margins)
def test_a_wider_margin_never_raises_p(m: list[float], b: list[float], m1: float, m2: float) -> None:
    k = min(len(m), len(b))
    d = np.asarray(m[:k]) - np.asarray(b[:k])
    lo, hi = sorted((m1, m2))
    assert S.paired_t_noninferiority(d, hi, 0.05)[0] <= S.paired_t_noninferiority(d, lo, 0.05)[0] + 1e-12


@settings(max_examples=60, deadline=None)
@given(bits, margins, margins)
def test_a_wider_margin_never_raises_p_binary(pairs: list[tuple[int, int]], m1: float, m2: float) -> None:
    wins = sum(1 for a, b in pairs if a > b)
    losses = sum(1 for a, b in pairs if a < b)
    lo, hi = sorted((min(m1, 0.99), min(m2, 0.99)))
    p_hi = S.tango_noninferiority(wins, losses, len(pairs), hi, 0.05)[0]
    assert p_hi <= S.tango_noninferiority(wins, losses, len(pairs), lo, 0.05)[0] + 1e-12


@settings(max_examples=60, deadline=None)
@given(bits, st.floats(0.01, 0.5))
def test_turning_a_loss_into_a_win_never_raises_p(pairs: list[tuple[int, int]], margin: float) -> None:
    n = len(pairs)
    wins = sum(1 for a, b in pairs if a > b)
    losses = sum(1 for a, b in pairs if a < b)
    if losses == 0:
        return
    before = S.tango_noninferiority(wins, losses, n, margin, 0.05)[0]
    assert S.tango_noninferiority(wins + 1, losses - 1, n, margin, 0.05)[0] <= before + 1e-12


@settings(max_examples=40, deadline=None)
@given(scores, scores, margins, st.floats(0.0, 3.0))
def test_improving_the_model_never_raises_p_and_orientation_does_not_matter(
    m: list[float], b: list[float], margin: float, gain: float
) -> None:
    k = min(len(m), len(b))
    mm, bb = np.asarray(m[:k], dtype=float), np.asarray(b[:k], dtype=float)
    spec = [NonInferiority("s", margin)]
    up = compare({"s": MetricInput(mm, bb)}, non_inferiority=spec, n_resamples=50)
    down = compare({"s": MetricInput(-mm, -bb, higher_is_better=False)}, non_inferiority=spec, n_resamples=50)
    better = compare({"s": MetricInput(mm + gain, bb)}, non_inferiority=spec, n_resamples=50)
    (g_up,), (g_down,), (g_better,) = up.non_inferiority, down.non_inferiority, better.non_inferiority
    assert g_up.p_value == pytest.approx(g_down.p_value, abs=1e-12)
    assert g_up.passed == g_down.passed
    assert g_down.bound == pytest.approx(-g_up.bound, abs=1e-9)
    assert g_better.p_value <= g_up.p_value + 1e-12


@settings(max_examples=40, deadline=None)
@given(bits, st.floats(0.01, 0.5))
def test_binary_orientation_does_not_matter(pairs: list[tuple[int, int]], margin: float) -> None:
    m = np.array([a for a, _ in pairs], dtype=float)
    b = np.array([x for _, x in pairs], dtype=float)
    spec = [NonInferiority("em", margin)]
    right = compare({"em": MetricInput(m, b, binary=True)}, non_inferiority=spec, n_resamples=50)
    wrong = compare(
        {"em": MetricInput(1 - m, 1 - b, binary=True, higher_is_better=False)},
        non_inferiority=spec,
        n_resamples=50,
    )
    assert right.non_inferiority[0].p_value == pytest.approx(wrong.non_inferiority[0].p_value, abs=1e-12)
    assert right.non_inferiority[0].bound == pytest.approx(-wrong.non_inferiority[0].bound, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(scores, scores, margins, st.sampled_from(["holm", "none"]))
def test_decision_agrees_with_the_bound_and_adjusted_p(
    m: list[float], b: list[float], margin: float, correction: str
) -> None:
    k = min(len(m), len(b))
    mm, bb = np.asarray(m[:k], dtype=float), np.asarray(b[:k], dtype=float)
    c = compare(
        {"s": MetricInput(mm, bb), "t": MetricInput(bb, mm)},
        non_inferiority=[NonInferiority("s", margin), NonInferiority("t", margin)],
        correction=correction,  # type: ignore[arg-type]
        n_resamples=50,
    )
    for g in c.non_inferiority:
        assert g.p_adjusted >= g.p_value - 1e-15
        assert g.passed == (g.p_adjusted < 0.05)
        if g.passed:  # rejected after the correction, so rejected alone: the bound clears the margin
            assert g.bound >= -margin - 1e-9
    assert c.passed <= all(g.passed for g in c.non_inferiority)


# ---- the CLI's margins -------------------------------------------------------------------------------


def test_cli_margins_parse_metric_equals_margin() -> None:
    from trainyard.cli.eval_cmd import _margins
    from trainyard.errors import InvalidInputError

    assert _margins(["exact_match=0.02", " loss = 0.1"]) == {"exact_match": 0.02, "loss": 0.1}
    for bad in ("exact_match", "exact_match=", "=0.1", "exact_match=-1", "exact_match=nan", "em=x"):
        with pytest.raises(InvalidInputError):
            _margins([bad])


# ---- edge cases of the tests, worked by hand ----------------------------------------------------------


def test_paired_t_without_spread_knows_the_mean_exactly() -> None:
    assert S.paired_t_noninferiority(np.full(5, 0.1), 0.05, 0.05) == (0.0, 0.1)
    # a mean exactly at the margin is not shown non-inferior
    assert S.paired_t_noninferiority(np.full(5, -0.05), 0.05, 0.05) == (1.0, -0.05)
    assert S.paired_t_noninferiority(np.array([0.3]), 0.05, 0.05) == (0.0, 0.3)
    assert S.paired_t_noninferiority(np.array([-0.3]), 0.05, 0.05) == (1.0, -0.3)
    # two examples already have a spread: t = (0.5 + 0.5) / (0.7071 / sqrt 2) = 2, one degree of freedom
    g = np.array([0.0, 1.0])
    ref = sps.ttest_1samp(g, -0.5, alternative="greater")
    p, bound = S.paired_t_noninferiority(g, 0.5, 0.05)
    assert p == pytest.approx(ref.pvalue, rel=1e-12) and p == pytest.approx(sps.t.sf(2.0, 1), rel=1e-12)
    assert bound == pytest.approx(0.5 - sps.t.ppf(0.95, 1) * 0.5, rel=1e-12)


def test_tango_score_at_the_ends_of_the_difference() -> None:
    assert S.tango_z(0, 0, 50, 0.0) == 0.0  # no discordant pairs, no difference: no evidence
    assert S.tango_restricted_mle(0, 0, 50, 0.0) == 0.0  # and no loss is the likeliest
    assert S.tango_z(1, 0, 1, 0.0) == 1.0  # McNemar's (1 - 0) / sqrt(1): a variance of exactly 1
    # d0 = +1 (the model always right, the baseline always wrong) has no variance: any other table is
    # infinitely far below it; d0 = -1 the same from above
    assert S.tango_z(3, 2, 10, 1.0) == -math.inf
    assert S.tango_z(3, 0, 10, -1.0) == math.inf


def test_tango_bounds_at_the_edges() -> None:
    # every pair a loss: no difference above -1 is rejected, the bound is -1
    p, bound = S.tango_noninferiority(0, 20, 20, 0.1, 0.05)
    assert bound == -1.0 and p == pytest.approx(float(sps.norm.sf(S.tango_z(0, 20, 20, -0.1))))
    # alpha >= 0.5: the observed difference itself is the bound; the p-value does not depend on alpha
    p6, bound6 = S.tango_noninferiority(6, 10, 96, 0.1, 0.6)
    assert bound6 == -4 / 96 and p6 == S.tango_noninferiority(6, 10, 96, 0.1, 0.05)[0]


def test_guardrail_reasons_state_the_numbers() -> None:
    z = np.zeros(30)
    metrics = {
        "acc": MetricInput(z + 0.25, z),
        "f1": MetricInput(z - 0.25, z),
        "loss": MetricInput(z + 0.5, z, higher_is_better=False),
        "ppl": MetricInput(z + 1.5, z, higher_is_better=False),
    }
    own = {k: metrics[k] for k in ("acc", "loss")}  # a metric not under a margin must not be worse
    one = compare(own, primary="acc", non_inferiority=[NonInferiority("loss", 1.0)])
    (g,) = one.non_inferiority
    assert g.reason == (
        "non-inferior within margin 1: delta +0.5, 95% bound +0.5 (needs < +1), "
        "one-sided p 0 < alpha 0.05 (paired_t_one_sided)"
    )
    assert (g.n, g.delta, g.bound, g.p_value, g.p_adjusted, g.passed) == (30, 0.5, 0.5, 0.0, 0.0, True)
    assert (g.margin, g.alpha, g.correction, g.dataset, g.higher_is_better) == (
        1.0,
        0.05,
        "holm",
        None,
        False,
    )
    assert one.passed and one.verdict == "better"
    specs = [NonInferiority("f1", 0.5), NonInferiority("ppl", 1.0)]
    metrics.pop("loss")
    both = compare(metrics, primary="acc", non_inferiority=specs, alpha=0.1)
    f1, ppl = both.non_inferiority
    assert f1.reason == (
        "non-inferior within margin 0.5: delta -0.25, 90% bound -0.25 (needs > -0.5), "
        "one-sided Holm-adjusted p 0 < alpha 0.1 (paired_t_one_sided)"
    )
    assert ppl.reason == (
        "not shown non-inferior within margin 1: delta +1.5, 90% bound +1.5 (needs < +1), "
        "one-sided Holm-adjusted p 1 >= alpha 0.1 (paired_t_one_sided)"
    )
    assert not ppl.passed and not both.passed and both.verdict == "better"
    plain = compare(metrics, primary="acc", non_inferiority=specs, correction="none").non_inferiority
    assert "one-sided p 0 < alpha 0.05" in plain[0].reason and plain[0].correction == "none"


def test_a_guardrail_passes_only_below_alpha() -> None:
    rng = np.random.default_rng(13)
    base = rng.normal(size=40)
    model = base + rng.normal(-0.02, 0.3, size=40)
    p, _ = S.paired_t_noninferiority(model - base, 0.1, 0.05)
    assert 0.0 < p < 0.5
    at = compare({"acc": MetricInput(model, base)}, non_inferiority=[NonInferiority("acc", 0.1)], alpha=p)
    assert at.non_inferiority[0].p_value == p and not at.non_inferiority[0].passed
    above = compare(
        {"acc": MetricInput(model, base)},
        non_inferiority=[NonInferiority("acc", 0.1)],
        alpha=min(0.49, p * 1.01),
    )
    assert above.non_inferiority[0].passed


def test_unmeasured_guardrails_and_tiny_guardrail_datasets() -> None:
    z = np.zeros(30)
    metrics = {"acc": MetricInput(z + 0.25, z)}
    datasets = [
        S.DatasetNonInferiority("ds://gone@1", "acc", 5.0),
        S.DatasetNonInferiority("ds://empty@1", "acc", 0.5, MetricInput([], [], higher_is_better=False)),
        S.DatasetNonInferiority("ds://one@1", "acc", 0.5, MetricInput([2.0], [1.0], higher_is_better=False)),
        S.DatasetNonInferiority("ds://few@1", "acc", 0.5, MetricInput([1.0] * 12, [2.0] * 12)),
    ]
    c = compare(
        metrics, non_inferiority=[NonInferiority("tox", 0.01)], dataset_guardrails=datasets, min_examples=12
    )
    tox, gone, empty, one, few = c.non_inferiority
    assert tox.reason == "not measured, so not shown non-inferior within 0.01"
    assert gone.reason == "not measured on ds://gone@1, so not shown non-inferior within 5"
    assert (tox.n, gone.n) == (30, 0)  # the own split's examples; none on a dataset not measured
    for g in (tox, gone):
        assert (g.test, g.p_value, g.higher_is_better, g.passed) == ("none", 1.0, True, False)
        assert math.isnan(g.delta) and math.isnan(g.bound) and g.to_dict()["threshold"] == -g.margin
    assert (empty.test, empty.p_value, empty.n, empty.passed) == ("none", 1.0, 0, False)
    assert math.isnan(empty.delta) and math.isnan(empty.bound) and empty.higher_is_better is False
    assert empty.reason == "0 paired examples, fewer than the minimum 12: inconclusive"
    # one example: the one-sided t test without spread (the loss up by 1 > margin 0.5: not non-inferior)
    assert (one.test, one.p_value, one.n, one.delta, one.bound) == ("paired_t_one_sided", 1.0, 1, 1.0, 1.0)
    # min_examples reaches the guardrail datasets: 12 examples are enough here
    assert few.n == 12 and few.test == "paired_t_one_sided" and few.p_value == 1.0
    assert few.reason.startswith("not shown non-inferior within margin 0.5: delta -1, 95% bound -1 ")


@pytest.mark.parametrize(
    ("scores", "message"),
    [
        (MetricInput([1.0, 2.0], [1.0]), "acc on ds://x@1: model and baseline need the same examples"),
        (
            MetricInput([[1.0, 2.0]], [[1.0, 2.0]]),
            "acc on ds://x@1: model and baseline need the same examples",
        ),
        (MetricInput([1.0, 2.0], [1.0, float("nan")]), "acc on ds://x@1: scores must be finite"),
        (MetricInput([float("inf"), 2.0], [1.0, 1.0]), "acc on ds://x@1: scores must be finite"),
    ],
)
def test_bad_guardrail_dataset_scores_are_refused(scores: MetricInput, message: str) -> None:
    z = np.zeros(30)
    with pytest.raises(ValueError, match=f"^{message}$"):
        compare(
            {"acc": MetricInput(z, z)},
            dataset_guardrails=[S.DatasetNonInferiority("ds://x@1", "acc", 0.1, scores)],
        )
