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

Large splits: scipy's generic resampling materialises every resample and its BCa jackknife is
quadratic in n. Above ``SCIPY_MAX_N`` examples the same estimators are computed in closed form for the
mean (bootstrap means as a counts-matrix product shared by all metrics, the jackknife of a mean in
O(n), sign flips as a ±1 matrix product); ``tests/unit/test_evaluation_stats.py`` checks both paths
agree with scipy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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
class Comparison:
    n: int
    metrics: dict[str, MetricResult]
    guardrails: list[Guardrail] = field(default_factory=list)
    verdict: Verdict = "inconclusive"
    alpha: float = ALPHA
    min_examples: int = MIN_EXAMPLES

    @property
    def passed(self) -> bool:
        return self.verdict == "better" and all(g.passed for g in self.guardrails)

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
        bits = np.unpackbits(rng.integers(0, 256, size=(rows, (n + 7) // 8), dtype=np.uint8), axis=1)
        signs = bits[:, :n].astype(np.float32) * 2.0 - 1.0
        null = (signs @ d32).astype(np.float64) / n  # (rows, k)
        ge += np.sum(null >= observed - eps, axis=0)
        le += np.sum(null <= observed + eps, axis=0)
    p_ge = (ge + 1) / (n_resamples + 1)
    p_le = (le + 1) / (n_resamples + 1)
    return [float(min(1.0, 2 * min(a, b))) for a, b in zip(p_ge, p_le, strict=True)]


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
) -> Comparison:
    """Paired comparison of every metric, Holm-corrected, with the overall verdict (see module doc)."""
    if not metrics:
        raise ValueError("compare needs at least one metric")
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
    return Comparison(
        n=n,
        metrics=results,
        guardrails=list(guardrails),
        verdict=overall_verdict(results.values(), n, min_examples),
        alpha=alpha,
        min_examples=min_examples,
    )


def overall_verdict(results: Any, n: int, min_examples: int) -> Verdict:
    if n < min_examples:
        return "inconclusive"
    verdicts = [r.verdict for r in results]
    if "worse" in verdicts:
        return "worse"
    if "better" in verdicts:
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
