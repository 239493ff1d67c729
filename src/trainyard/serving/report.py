"""The shadow report: primary and shadow answers to the same requests, paired."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainyard.serving.traffic import percentile


def _paired_ci95(deltas: Sequence[float]) -> list[float] | None:
    """95 % confidence interval of the mean paired difference (t distribution)."""
    n = len(deltas)
    if n < 2:
        return None
    from scipy import stats

    mean = sum(deltas) / n
    sd = (sum((d - mean) ** 2 for d in deltas) / (n - 1)) ** 0.5
    half = float(stats.t.ppf(0.975, n - 1)) * sd / n**0.5
    return [mean - half, mean + half]


def shadow_report(pairs: Sequence[Any], *, dropped: int, sent: int) -> dict[str, Any]:
    by_model: dict[tuple[str, str], list[Any]] = {}
    for p in pairs:
        by_model.setdefault((p.primary_model, p.shadow_model), []).append(p)
    out = []
    for (primary, shadow), ps in sorted(by_model.items()):
        ok = [p for p in ps if p.shadow_status == 200 and p.shadow_latency_s is not None]
        lat_delta = [p.shadow_latency_s - p.primary_latency_s for p in ok]
        tok_delta = [float(p.shadow_completion_tokens - p.primary_completion_tokens) for p in ok]
        out.append(
            {
                "primary": primary,
                "shadow": shadow,
                "pairs": len(ps),
                "shadow_errors": len(ps) - len(ok),
                "agreement": {
                    "exact_match_rate": (sum(p.exact_match for p in ok) / len(ok)) if ok else None,
                    "mean_similarity": (sum(p.similarity for p in ok) / len(ok)) if ok else None,
                },
                "latency_s": {
                    "primary_p50": percentile([p.primary_latency_s for p in ok], 50),
                    "primary_p95": percentile([p.primary_latency_s for p in ok], 95),
                    "shadow_p50": percentile([p.shadow_latency_s for p in ok], 50),
                    "shadow_p95": percentile([p.shadow_latency_s for p in ok], 95),
                    "mean_paired_delta": (sum(lat_delta) / len(lat_delta)) if lat_delta else None,
                    "paired_delta_ci95": _paired_ci95(lat_delta),
                },
                "completion_tokens": {
                    "primary_mean": (sum(p.primary_completion_tokens for p in ok) / len(ok)) if ok else None,
                    "shadow_mean": (sum(p.shadow_completion_tokens for p in ok) / len(ok)) if ok else None,
                    "paired_delta_ci95": _paired_ci95(tok_delta),
                },
                "examples": [
                    {"request_id": p.request_id, "primary": p.primary_text, "shadow": p.shadow_text}
                    for p in ps[-3:]
                ],
            }
        )
    return {"comparisons": out, "mirrored": sent, "dropped": dropped}
