"""Pure traffic logic: weighted route choice (sticky per key), canary judgement over a window of
outcomes, and the shadow comparison of two answers. No I/O, no clock reads (times are passed in)."""

from __future__ import annotations

import difflib
import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Route:
    model: str  # the model reference as given
    weight: float
    shadow: bool = False
    canary: bool = False

    def doc(self) -> dict[str, Any]:
        return {"model": self.model, "weight": self.weight, "shadow": self.shadow, "canary": self.canary}


def routes_from_docs(docs: Sequence[dict[str, Any]]) -> list[Route]:
    return [
        Route(
            model=str(d["model"]),
            weight=float(d.get("weight", 0)),
            shadow=bool(d.get("shadow", False)),
            canary=bool(d.get("canary", False)),
        )
        for d in docs
    ]


def sticky_point(key: str) -> float:
    """A point in [0, 1) fixed by ``key``: the same user lands on the same route while weights stay."""
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def choose_route(routes: Sequence[Route], sticky_key: str | None, rng: random.Random | None = None) -> Route:
    served = [r for r in routes if not r.shadow and r.weight > 0]
    if not served:
        raise ValueError("no route with a positive weight")
    if len(served) == 1:
        return served[0]
    total = sum(r.weight for r in served)
    u = sticky_point(sticky_key) if sticky_key else (rng or random).random()
    acc = 0.0
    for r in served:
        acc += r.weight / total
        if u < acc:
            return r
    return served[-1]


@dataclass(frozen=True)
class CanaryPolicy:
    max_error_rate: float = 0.05
    max_p95_latency_s: float | None = None
    window_s: float = 60.0
    min_requests: int = 10

    def doc(self) -> dict[str, Any]:
        return {
            "max_error_rate": self.max_error_rate,
            "max_p95_latency_s": self.max_p95_latency_s,
            "window_s": self.window_s,
            "min_requests": self.min_requests,
        }


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); 0.0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))
    return s[k]


def canary_breach(
    outcomes: Sequence[tuple[float, bool, float]], policy: CanaryPolicy, now_s: float
) -> dict[str, Any] | None:
    """``outcomes``: (time_s, ok, latency_s) of the canary's requests. Returns why it breaches, or None."""
    window = [o for o in outcomes if o[0] >= now_s - policy.window_s]
    n = len(window)
    if n < policy.min_requests:
        return None
    errors = sum(1 for o in window if not o[1])
    rate = errors / n
    p95 = percentile([o[2] for o in window if o[1]], 95)
    stats = {"requests": n, "errors": errors, "error_rate": rate, "p95_latency_s": p95}
    if rate > policy.max_error_rate:
        return {**stats, "reason": f"error rate {rate:.1%} > {policy.max_error_rate:.1%} over {n} requests"}
    if policy.max_p95_latency_s is not None and p95 > policy.max_p95_latency_s:
        return {
            **stats,
            "reason": f"p95 latency {p95:.3f} s > {policy.max_p95_latency_s:.3f} s over {n} requests",
        }
    return None


def compare_answers(primary: str, shadow: str) -> tuple[bool, float]:
    """(exact match after whitespace normalisation, word-level similarity ratio in [0, 1])."""
    a, b = primary.split(), shadow.split()
    return a == b, difflib.SequenceMatcher(a=a, b=b, autojunk=False).ratio()
