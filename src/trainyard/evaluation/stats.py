"""Paired comparison of a model against a baseline on the same examples (pure: numpy and scipy only).

For every metric each example i has a model score ``m_i`` and a baseline score ``b_i``; the
comparison works on the per-example differences ``d_i = m_i - b_i``:

- the mean difference and its 95 % BCa bootstrap confidence interval (``scipy.stats.bootstrap`` on the
  paired data);
- a two-sided paired permutation test (random sign flips of ``d_i``, ``scipy.stats.permutation_test``
  with ``permutation_type='samples'``) for continuous scores, or McNemar's exact test (a binomial test
  on the discordant pairs, ``scipy.stats.binomtest``) for binary ones;
- Holm's step-down correction across the metrics of one comparison;
- below ``min_examples`` paired examples the verdict is ``inconclusive`` whatever the p-values say.

A metric is ``better`` when its Holm-adjusted p-value is below ``alpha`` and the mean difference
points the metric's good way (``higher_is_better``), ``worse`` when it points the other way, and
``no_difference`` otherwise. The overall verdict is ``worse`` if any metric is worse, else ``better`` if
any is better, else ``no_difference``; ``passed`` (the promotion gate) needs ``better`` and every
guardrail passing. Holm controls the family-wise error rate, so under the null the gate passes at
most ``alpha`` of the time.

Primary metric and non-inferiority guardrails (``compare(primary=..., non_inferiority=[...])``): the
gate then needs the primary metric to be significantly better, and every guardrail metric to be
non-inferior within its margin ``delta`` (in the metric's own units): a one-sided test of
``H0: mu <= -delta`` against ``H1: mu > -delta``, where ``mu`` is the mean change of the metric in its
good direction. A metric under a margin is judged by that test alone, so a small (significant) loss
within the margin does not block the gate; every other metric must still not be ``worse``.

- continuous scores: the one-sided paired t test on the per-example differences
  (``scipy.stats.ttest_1samp(g, -delta, alternative="greater")`` with ``g`` the oriented differences);
  its bound is the one-sided ``1 - alpha`` confidence bound of the mean change;
- binary (0/1) scores: Tango's score test for a difference of paired proportions (Tango 1998, Stat Med
  17:891), the score statistic with the variance at the restricted maximum-likelihood estimate under
  ``H0`` (a closed-form root of a quadratic); unlike a Wald test it stays valid with few or no
  discordant pairs. Its bound is the score test inverted (``brentq``);
- the guardrail family is Holm-corrected (``correction="holm"``, the default; ``"none"`` tests each at
  ``alpha``). The gate needs every guardrail to pass, an intersection-union test, which already keeps
  the chance of passing a model inferior on any guardrail at or below ``alpha``; Holm is stricter and
  also controls the family-wise error of the individual "non-inferior" claims reported;
- guardrail datasets (``compare(dataset_guardrails=[...])``): a metric measured for both models on
  another dataset's examples (its own n), tested the same way and in the same family: one Holm
  correction over the own-split guardrails and the dataset ones together. Each needs at least
  ``min_examples`` examples of its own; the primary verdict comes from the evaluation's split alone.

Large splits: scipy's generic resampling materialises every resample and its BCa jackknife is
quadratic in n. Above ``SCIPY_MAX_N`` examples the same estimators are computed in closed form for the
mean (bootstrap means as a counts-matrix product shared by all metrics, the jackknife of a mean in
O(n), sign flips as a ±1 matrix product); ``tests/unit/test_evaluation_stats.py`` checks both paths
agree with scipy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from scipy import stats as sps

Verdict = Literal["better", "no_difference", "worse", "inconclusive"]

ALPHA = 0.05
MIN_EXAMPLES = 30
N_RESAMPLES = 2000
SCIPY_MAX_N = 500  # above this, the closed-form paths (same estimators, linear memory per resample)
_BATCH = 250


@dataclass(frozen=True)
class MetricInput:
    """Per-example scores of one metric for the model and the baseline (same order, same examples)."""

    model: Sequence[float] | np.ndarray
    baseline: Sequence[float] | np.ndarray
    higher_is_better: bool = True
    binary: bool = False  # 0/1 scores: McNemar's exact test instead of the permutation test


@dataclass(frozen=True)
class MetricResult:
    name: str
    n: int
    model: float
    baseline: float
    delta: float  # mean(model - baseline)
    ci95: tuple[float, float]
    p_value: float  # raw two-sided p-value of the test below
    p_adjusted: float  # Holm-adjusted across the comparison's metrics
    test: str  # "paired_permutation" | "mcnemar_exact" | "none"
    higher_is_better: bool
    verdict: Verdict
    discordant: tuple[int, int] | None = None  # (model right & baseline wrong, the reverse), binary only

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "model": self.model,
            "baseline": self.baseline,
            "delta": self.delta,
            "ci95": [self.ci95[0], self.ci95[1]],
            "p_value": self.p_value,
            "p_adjusted": self.p_adjusted,
            "test": self.test,
            "n": self.n,
            "higher_is_better": self.higher_is_better,
            "verdict": self.verdict,
        }
        if self.discordant is not None:
            doc["discordant"] = {"model_only": self.discordant[0], "baseline_only": self.discordant[1]}
        return doc


@dataclass(frozen=True)
class Guardrail:
    """A threshold on one measured value: ``value <= threshold`` (``upper``) or ``>=`` (``lower``)."""

    name: str
    threshold: float
    value: float
    kind: Literal["upper", "lower"] = "upper"

    @property
    def passed(self) -> bool:
        if not math.isfinite(self.value):
            return False
        return self.value <= self.threshold if self.kind == "upper" else self.value >= self.threshold

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "threshold": self.threshold, "value": self.value, "passed": self.passed}


@dataclass(frozen=True)
class NonInferiority:
    """A guardrail metric that must not be worse than the baseline by ``margin`` or more (metric units)."""

    metric: str
    margin: float


@dataclass(frozen=True)
class DatasetNonInferiority:
    """A guardrail on another dataset: ``metric`` measured for the model and the baseline on that
    dataset's examples (``scores``; ``None`` when it was not measured there) must not be worse by
    ``margin`` or more. Its examples are its own (any number); it joins the guardrail family."""

    dataset: str
    metric: str
    margin: float
    scores: MetricInput | None = None


@dataclass(frozen=True)
class NonInferiorityResult:
    metric: str
    margin: float  # in the metric's units, > 0
    n: int
    delta: float  # mean(model - baseline), as in the metric's result
    bound: float  # one-sided (1 - alpha) confidence bound of delta on the bad side
    p_value: float  # one-sided p-value of H0: inferior by margin or more
    p_adjusted: float  # after the family's correction
    test: str  # "paired_t_one_sided" | "tango_score" | "none"
    higher_is_better: bool
    alpha: float
    correction: str
    passed: bool
    reason: str
    dataset: str | None = None  # a guardrail dataset; None: the evaluation's own split

    @property
    def label(self) -> str:
        return self.metric if self.dataset is None else f"{self.metric} on {self.dataset}"

    @property
    def limit(self) -> float:
        """The change that is "inferior": ``-margin`` for higher-is-better metrics, ``+margin`` otherwise."""
        return -self.margin if self.higher_is_better else self.margin

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.metric,
            "kind": "non_inferiority",
            "threshold": self.limit,
            "value": self.bound,
            "passed": self.passed,
            "margin": self.margin,
            "delta": self.delta,
            "p_value": self.p_value,
            "p_adjusted": self.p_adjusted,
            "alpha": self.alpha,
            "correction": self.correction,
            "test": self.test,
            "n": self.n,
            "higher_is_better": self.higher_is_better,
            "reason": self.reason,
            **({"dataset": self.dataset} if self.dataset is not None else {}),
        }


@dataclass(frozen=True)
class Comparison:
    n: int
    metrics: dict[str, MetricResult]
    guardrails: list[Guardrail] = field(default_factory=list)
    verdict: Verdict = "inconclusive"
    alpha: float = ALPHA
    min_examples: int = MIN_EXAMPLES
    primary: str | None = None
    non_inferiority: list[NonInferiorityResult] = field(default_factory=list)

    @property
    def reasons(self) -> list[str]:
        """Why the gate passed or did not, one line per condition (failures first)."""
        bad: list[str] = []
        good: list[str] = []
        if self.n < self.min_examples:
            bad.append(f"{self.n} paired examples, fewer than the minimum {self.min_examples}: inconclusive")
        if self.primary is not None:
            r = self.metrics.get(self.primary)
            if r is None:
                bad.append(f"primary metric {self.primary} was not measured")
            else:
                line = (
                    f"primary metric {self.primary}: {r.verdict} (delta {r.delta:+.4g}, "
                    f"Holm-adjusted p {r.p_adjusted:.3g}, alpha {self.alpha:g})"
                )
                (good if r.verdict == "better" else bad).append(line)
        elif self.n >= self.min_examples:
            (good if self.verdict == "better" else bad).append(f"verdict {self.verdict}")
        guarded = {g.metric for g in self.non_inferiority if g.dataset is None}
        for name, r in self.metrics.items():
            if name != self.primary and name not in guarded and r.verdict == "worse":
                bad.append(
                    f"{name} is significantly worse "
                    f"(delta {r.delta:+.4g}, Holm-adjusted p {r.p_adjusted:.3g})"
                )
        for g in self.non_inferiority:
            (good if g.passed else bad).append(f"{g.label}: {g.reason}")
        for t in self.guardrails:
            op = "<=" if t.kind == "upper" else ">="
            line = f"{t.name} {t.value:.4g} {'' if t.passed else 'not '}{op} {t.threshold:.4g}"
            (good if t.passed else bad).append(line)
        return bad + good

    @property
    def passed(self) -> bool:
        return (
            self.verdict == "better"
            and all(g.passed for g in self.non_inferiority)
            and all(g.passed for g in self.guardrails)
        )

    def metrics_document(self) -> dict[str, dict[str, Any]]:
        return {name: r.to_dict() for name, r in self.metrics.items()}


# ---- building blocks ----------------------------------------------------------------------------------


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (monotone, capped at 1), in the input order."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    out = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(p_values[i])))
        out[i] = running
    return out


def mcnemar_exact(model: np.ndarray, baseline: np.ndarray) -> tuple[float, int, int]:
    """Two-sided exact McNemar p-value on 0/1 scores and the discordant counts (model-only, base-only)."""
    m = model.astype(bool)
    b = baseline.astype(bool)
    n01 = int(np.sum(m & ~b))
    n10 = int(np.sum(~m & b))
    if n01 + n10 == 0:
        return 1.0, n01, n10
    return float(sps.binomtest(n01, n01 + n10, 0.5).pvalue), n01, n10


def _mean_diff(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x - y, axis=axis)


def _scipy_ci(model: np.ndarray, baseline: np.ndarray, n_resamples: int, seed: int) -> tuple[float, float]:
    res = sps.bootstrap(
        (model, baseline),
        _mean_diff,
        paired=True,
        vectorized=True,
        method="BCa",
        n_resamples=n_resamples,
        confidence_level=0.95,
        random_state=np.random.default_rng(seed),
    )
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(lo) and math.isfinite(hi)):  # degenerate BCa (e.g. nearly constant differences)
        res = sps.bootstrap(
            (model, baseline),
            _mean_diff,
            paired=True,
            vectorized=True,
            method="percentile",
            n_resamples=n_resamples,
            random_state=np.random.default_rng(seed),
        )
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return lo, hi


def _scipy_permutation_p(model: np.ndarray, baseline: np.ndarray, n_resamples: int, seed: int) -> float:
    res = sps.permutation_test(
        (model, baseline),
        _mean_diff,
        permutation_type="samples",
        vectorized=True,
        n_resamples=n_resamples,
        alternative="two-sided",
        random_state=np.random.default_rng(seed),
    )
    return float(res.pvalue)


def _bootstrap_counts(n: int, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(n_resamples, n) float32 matrix: how often each example is drawn in each bootstrap resample."""
    out = np.empty((n_resamples, n), dtype=np.float32)
    for start in range(0, n_resamples, _BATCH):
        rows = min(_BATCH, n_resamples - start)
        idx = rng.integers(0, n, size=(rows, n)) + (np.arange(rows)[:, None] * n)
        out[start : start + rows] = np.bincount(idx.ravel(), minlength=rows * n).reshape(rows, n)
    return out


def _bca_from(
    theta_hat: float, boot: np.ndarray, jack: np.ndarray, level: float = 0.95
) -> tuple[float, float]:
    """The BCa interval (Efron 1987) from bootstrap replicates and jackknife values (scipy's formulas)."""
    z0 = sps.norm.ppf(np.mean(boot < theta_hat))
    jm = jack.mean()
    num = np.sum((jm - jack) ** 3)
    den = 6.0 * np.sum((jm - jack) ** 2) ** 1.5
    a = num / den if den > 0 else 0.0
    alpha = (1 - level) / 2
    out = []
    for q in (alpha, 1 - alpha):
        z = sps.norm.ppf(q)
        adj = sps.norm.cdf(z0 + (z0 + z) / (1 - a * (z0 + z)))
        out.append(adj)
    if not all(math.isfinite(x) for x in out):
        out = [alpha, 1 - alpha]
    lo, hi = np.quantile(boot, out)
    return float(lo), float(hi)


def _fast_cis(d: np.ndarray, n_resamples: int, rng: np.random.Generator) -> list[tuple[float, float]]:
    """BCa intervals of the mean of each column of ``d`` (n, k), one shared set of resamples."""
    n = d.shape[0]
    counts = _bootstrap_counts(n, n_resamples, rng)
    boot = (counts @ d.astype(np.float32)).astype(np.float64) / n  # (R, k) bootstrap means
    sums = d.sum(axis=0)
    out = []
    for j in range(d.shape[1]):
        theta = float(sums[j] / n)
        jack = (sums[j] - d[:, j]) / (n - 1)  # leave-one-out means, O(n)
        out.append(_bca_from(theta, boot[:, j], jack))
    return out


def _fast_permutation_ps(d: np.ndarray, n_resamples: int, rng: np.random.Generator) -> list[float]:
    """Two-sided sign-flip p-values of the mean of each column of ``d`` (scipy's counting convention)."""
    n, k = d.shape
    observed = d.mean(axis=0)
    ge = np.zeros(k)
    le = np.zeros(k)
    d32 = d.astype(np.float32)
    eps = 1e-6 * np.maximum(1.0, np.abs(observed))  # scipy's relative tolerance for ties
    for start in range(0, n_resamples, _BATCH):
        rows = min(_BATCH, n_resamples - start)
        bits = np.unpackbits(rng.integers(256, size=(rows, (n + 7) // 8), dtype=np.uint8), axis=1)  # bytes
        signs = bits[:, :n].astype(np.float32) * 2.0 - 1.0
        null = (signs @ d32).astype(np.float64) / n  # (rows, k)
        ge += np.sum(null >= observed - eps, axis=0)
        le += np.sum(null <= observed + eps, axis=0)
    p_ge = (ge + 1) / (n_resamples + 1)
    p_le = (le + 1) / (n_resamples + 1)
    return [float(min(1.0, 2 * min(a, b))) for a, b in zip(p_ge, p_le, strict=True)]


# ---- non-inferiority ----------------------------------------------------------------------------------


def paired_t_noninferiority(g: np.ndarray, margin: float, alpha: float) -> tuple[float, float]:
    """One-sided paired t test of ``H0: mean(g) <= -margin`` on oriented differences ``g`` (good > 0):
    ``(p_value, bound)``, the bound being the one-sided ``1 - alpha`` lower confidence bound of the mean."""
    n = g.shape[0]
    mean = float(g.mean())
    sd = float(g.std(ddof=1)) if n >= 2 else 0.0
    if n < 2 or sd == 0.0:  # every difference equal: the mean is known exactly
        return (0.0 if mean > -margin else 1.0), mean
    se = sd / math.sqrt(n)
    t = (mean + margin) / se
    return float(sps.t.sf(t, n - 1)), float(mean - sps.t.ppf(1 - alpha, n - 1) * se)


def tango_restricted_mle(wins: int, losses: int, n: int, d0: float) -> float:
    """The maximum-likelihood estimate of P(loss) — the baseline right and the model wrong — for paired
    binary data under ``P(win) - P(loss) = d0`` (Tango 1998, eq. 4: the positive root of a quadratic)."""
    a = 2.0 * n
    b = -wins - losses + (2.0 * n - wins + losses) * d0
    c = -losses * d0 * (1.0 - d0)
    disc = max(0.0, b * b - 4.0 * a * c)
    return (math.sqrt(disc) - b) / (2.0 * a)


def tango_z(wins: int, losses: int, n: int, d0: float) -> float:
    """Tango's score statistic for ``H0: P(win) - P(loss) = d0`` (``wins``/``losses``: discordant pairs
    in the model's / the baseline's favour, ``n`` pairs in all)."""
    q = tango_restricted_mle(wins, losses, n, d0)
    var = n * (2.0 * q + d0 - d0 * d0)
    num = wins - losses - n * d0
    if var <= 0.0:
        return math.copysign(math.inf, num) if num != 0 else 0.0
    return num / math.sqrt(var)


def tango_noninferiority(wins: int, losses: int, n: int, margin: float, alpha: float) -> tuple[float, float]:
    """One-sided Tango score test of ``H0: P(win) - P(loss) <= -margin``: ``(p_value, bound)``, the bound
    being the smallest difference the test does not reject at ``alpha`` (the score interval's end)."""
    p = float(sps.norm.sf(tango_z(wins, losses, n, -margin)))
    observed = (wins - losses) / n
    lo = -1.0 + 1e-12

    def excess(d0: float) -> float:
        return float(sps.norm.sf(tango_z(wins, losses, n, d0))) - alpha

    if excess(lo) >= 0:
        return p, -1.0
    hi = min(observed, 1.0 - 1e-12)
    if excess(hi) <= 0:  # alpha >= 0.5 or a degenerate table
        return p, hi
    from scipy.optimize import brentq

    return p, float(brentq(excess, lo, hi, xtol=1e-10))


def _noninferiority_results(
    specs: Sequence[NonInferiority],
    metrics: Mapping[str, MetricInput],
    arrays: Mapping[str, tuple[np.ndarray, np.ndarray]],
    n: int,
    *,
    alpha: float,
    min_examples: int,
    correction: str,
    datasets: Sequence[DatasetNonInferiority] = (),
) -> list[NonInferiorityResult]:
    """Every guardrail, on the evaluation's own split (``specs``) and on guardrail datasets, tested as
    one family: a single Holm correction over all of them."""
    # (dataset, metric, margin, scores or None, model array, baseline array, n)
    items: list[tuple[str | None, str, float, MetricInput | None, Any, Any, int]] = []
    for spec in specs:
        mi = metrics.get(spec.metric)
        m, b = arrays[spec.metric] if mi is not None else (None, None)
        items.append((None, spec.metric, spec.margin, mi, m, b, n))
    for ds in datasets:
        if ds.scores is None:
            items.append((ds.dataset, ds.metric, ds.margin, None, None, None, 0))
            continue
        m = np.asarray(ds.scores.model, dtype=np.float64)
        b = np.asarray(ds.scores.baseline, dtype=np.float64)
        if m.shape != b.shape or m.ndim != 1:
            raise ValueError(f"{ds.metric} on {ds.dataset}: model and baseline need the same examples")
        if not (np.all(np.isfinite(m)) and np.all(np.isfinite(b))):
            raise ValueError(f"{ds.metric} on {ds.dataset}: scores must be finite")
        items.append((ds.dataset, ds.metric, ds.margin, ds.scores, m, b, int(m.shape[0])))
    raw: list[tuple[str, float, float, float, bool]] = []
    for _dataset, _metric, margin, mi, m, b, k in items:
        if mi is None:
            raw.append(("none", 1.0, math.nan, math.nan, True))
            continue
        d = m - b
        sign = 1.0 if mi.higher_is_better else -1.0
        g = sign * d
        if k < 1:
            p, bound, test = 1.0, math.nan, "none"
        elif mi.binary:
            wins, losses = int(np.sum(g > 0)), int(np.sum(g < 0))
            p, bound = tango_noninferiority(wins, losses, k, margin, alpha)
            test = "tango_score"
        else:
            p, bound = paired_t_noninferiority(g, margin, alpha)
            test = "paired_t_one_sided"
        raw.append((test, p, float(d.mean()) if k else math.nan, sign * bound, mi.higher_is_better))
    ps = [r[1] for r in raw]
    adjusted = holm(ps) if correction == "holm" else list(ps)
    out = []
    for (dataset, metric, margin, mi, _m, _b, k), (test, p, delta, bound, hib), p_adj in zip(
        items, raw, adjusted, strict=True
    ):
        adj = "Holm-adjusted " if correction == "holm" and len(raw) > 1 else ""
        if mi is None:
            where = "" if dataset is None else f" on {dataset}"
            passed, reason = False, f"not measured{where}, so not shown non-inferior within {margin:g}"
        elif k < min_examples:
            passed = False
            reason = f"{k} paired examples, fewer than the minimum {min_examples}: inconclusive"
        else:
            passed = p_adj < alpha
            side = ">" if hib else "<"
            limit = -margin if hib else margin
            verb = "non-inferior" if passed else "not shown non-inferior"
            reason = (
                f"{verb} within margin {margin:g}: delta {delta:+.4g}, "
                f"{1 - alpha:.0%} bound {bound:+.4g} (needs {side} {limit:+.4g}), "
                f"one-sided {adj}p {p_adj:.3g} {'<' if passed else '>='} alpha {alpha:g} ({test})"
            )
        out.append(
            NonInferiorityResult(
                metric=metric,
                margin=margin,
                n=k,
                delta=delta,
                bound=bound,
                p_value=p,
                p_adjusted=p_adj,
                test=test,
                higher_is_better=hib,
                alpha=alpha,
                correction=correction,
                passed=passed,
                reason=reason,
                dataset=dataset,
            )
        )
    return out


# ---- the comparison -----------------------------------------------------------------------------------


def _metric_verdict(delta: float, p_adj: float, higher_is_better: bool, alpha: float) -> Verdict:
    if p_adj >= alpha or delta == 0:
        return "no_difference"
    good = delta > 0 if higher_is_better else delta < 0
    return "better" if good else "worse"


def compare(
    metrics: Mapping[str, MetricInput],
    *,
    guardrails: Sequence[Guardrail] = (),
    alpha: float = ALPHA,
    min_examples: int = MIN_EXAMPLES,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
    primary: str | None = None,
    non_inferiority: Sequence[NonInferiority] = (),
    correction: Literal["holm", "none"] = "holm",
    dataset_guardrails: Sequence[DatasetNonInferiority] = (),
) -> Comparison:
    """Paired comparison of every metric, Holm-corrected, with the overall verdict (see module doc)."""
    if not metrics:
        raise ValueError("compare needs at least one metric")
    if not 0.0 < alpha < 0.5:
        raise ValueError("alpha must lie in (0, 0.5)")
    if correction not in ("holm", "none"):
        raise ValueError("correction must be 'holm' or 'none'")
    seen: set[str] = set()
    for spec in non_inferiority:
        if not (math.isfinite(spec.margin) and spec.margin > 0):
            raise ValueError(f"non-inferiority margin of {spec.metric} must be a positive number")
        if spec.metric == primary:
            raise ValueError(f"{spec.metric} is the primary metric; it cannot also be a guardrail")
        if spec.metric in seen:
            raise ValueError(f"{spec.metric} has two non-inferiority margins")
        seen.add(spec.metric)
    seen_ds: set[tuple[str, str]] = set()
    for ds in dataset_guardrails:
        if not (math.isfinite(ds.margin) and ds.margin > 0):
            raise ValueError(
                f"non-inferiority margin of {ds.metric} on {ds.dataset} must be a positive number"
            )
        if (ds.dataset, ds.metric) in seen_ds:
            raise ValueError(f"{ds.metric} on {ds.dataset} has two non-inferiority margins")
        seen_ds.add((ds.dataset, ds.metric))
    arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    n = -1
    for name, mi in metrics.items():
        m = np.asarray(mi.model, dtype=np.float64)
        b = np.asarray(mi.baseline, dtype=np.float64)
        if m.shape != b.shape or m.ndim != 1:
            raise ValueError(f"metric {name}: model and baseline need the same number of examples")
        if not (np.all(np.isfinite(m)) and np.all(np.isfinite(b))):
            raise ValueError(f"metric {name}: scores must be finite")
        if n not in (-1, m.shape[0]):
            raise ValueError("every metric must cover the same examples")
        n = m.shape[0]
        arrays[name] = (m, b)
    names = list(metrics)
    rng = np.random.default_rng(seed)
    cis: dict[str, tuple[float, float]] = {}
    raw_p: dict[str, float] = {}
    tests: dict[str, str] = {}
    discordant: dict[str, tuple[int, int]] = {}
    diffs = {name: arrays[name][0] - arrays[name][1] for name in names}
    varying = [name for name in names if n >= 2 and np.ptp(diffs[name]) > 0]
    for name in names:
        if name not in varying:  # every difference equal (or n < 2): nothing to resample
            delta = float(diffs[name].mean()) if n > 0 else 0.0
            cis[name] = (delta, delta)
            if delta == 0 or n < 2:
                raw_p[name], tests[name] = 1.0, "none"
            elif metrics[name].binary:
                raw_p[name], n01, n10 = mcnemar_exact(*arrays[name])
                tests[name], discordant[name] = "mcnemar_exact", (n01, n10)
            else:  # exact sign-flip test: only the all-same-sign flips are as extreme
                raw_p[name], tests[name] = min(1.0, 2.0 ** (1 - n)), "paired_permutation"
    if varying:
        if n <= SCIPY_MAX_N:
            for i, name in enumerate(varying):
                m, b = arrays[name]
                cis[name] = _scipy_ci(m, b, n_resamples, seed + i)
        else:
            dm = np.stack([diffs[name] for name in varying], axis=1)
            for name, ci in zip(varying, _fast_cis(dm, n_resamples, rng), strict=True):
                cis[name] = ci
        perm = [name for name in varying if not metrics[name].binary]
        for name in varying:
            if metrics[name].binary:
                p, n01, n10 = mcnemar_exact(*arrays[name])
                raw_p[name], tests[name], discordant[name] = p, "mcnemar_exact", (n01, n10)
        if perm:
            if n <= SCIPY_MAX_N:
                ps = [
                    _scipy_permutation_p(*arrays[name], n_resamples, seed + 100 + i)
                    for i, name in enumerate(perm)
                ]
            else:
                ps = _fast_permutation_ps(np.stack([diffs[name] for name in perm], axis=1), n_resamples, rng)
            for name, p in zip(perm, ps, strict=True):
                raw_p[name], tests[name] = p, "paired_permutation"
    adjusted = dict(zip(names, holm([raw_p[name] for name in names]), strict=True))
    results: dict[str, MetricResult] = {}
    for name in names:
        m, b = arrays[name]
        delta = float(diffs[name].mean()) if n > 0 else 0.0
        mi = metrics[name]
        verdict: Verdict = (
            "inconclusive"
            if n < min_examples
            else _metric_verdict(delta, adjusted[name], mi.higher_is_better, alpha)
        )
        results[name] = MetricResult(
            name=name,
            n=n,
            model=float(m.mean()) if n else float("nan"),
            baseline=float(b.mean()) if n else float("nan"),
            delta=delta,
            ci95=cis[name],
            p_value=raw_p[name],
            p_adjusted=adjusted[name],
            test=tests[name],
            higher_is_better=mi.higher_is_better,
            verdict=verdict,
            discordant=discordant.get(name),
        )
    ni = _noninferiority_results(
        non_inferiority,
        metrics,
        arrays,
        n,
        alpha=alpha,
        min_examples=min_examples,
        correction=correction,
        datasets=dataset_guardrails,
    )
    return Comparison(
        n=n,
        metrics=results,
        guardrails=list(guardrails),
        verdict=overall_verdict(
            results.values(), n, min_examples, primary, (g.metric for g in ni if g.dataset is None)
        ),
        alpha=alpha,
        min_examples=min_examples,
        primary=primary,
        non_inferiority=ni,
    )


def overall_verdict(
    results: Any, n: int, min_examples: int, primary: str | None = None, guarded: Iterable[str] = ()
) -> Verdict:
    """``inconclusive`` below ``min_examples``; ``worse`` if any metric not under a non-inferiority margin
    is worse; then ``better`` if the primary metric (without one: any metric) is better; else
    ``no_difference``."""
    if n < min_examples:
        return "inconclusive"
    skip = set(guarded) - ({primary} if primary is not None else set())
    judged = [r for r in results if r.name not in skip]
    if any(r.verdict == "worse" for r in judged):
        return "worse"
    if primary is not None:
        primary_better = any(r.name == primary and r.verdict == "better" for r in judged)
        return "better" if primary_better else "no_difference"
    if any(r.verdict == "better" for r in judged):
        return "better"
    return "no_difference"


def largest_differences(
    per_example_delta: Sequence[float], higher_is_better: bool, k: int = 5
) -> tuple[list[int], list[int]]:
    """Indices of the ``k`` largest wins and the ``k`` largest losses of the model (by one metric)."""
    d = np.asarray(per_example_delta, dtype=np.float64)
    gain = d if higher_is_better else -d
    order = np.argsort(-gain, kind="stable")
    wins = [int(i) for i in order if gain[i] > 0][:k]
    losses = [int(i) for i in order[::-1] if gain[i] < 0][:k]
    return wins, losses
