"""Pure autoscaling policy on in-flight requests per replica (no I/O; the caller passes the clock)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class AutoscalingPolicy:
    min_replicas: int = 1
    max_replicas: int = 1
    target_in_flight: float = 4.0  # in-flight requests per replica the pool aims at
    scale_up_delay_s: float = 0.0
    scale_down_delay_s: float = 30.0
    cold_start_timeout_s: float = 120.0

    def doc(self) -> dict[str, Any]:
        return {
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "target_in_flight": self.target_in_flight,
            "scale_up_delay_s": self.scale_up_delay_s,
            "scale_down_delay_s": self.scale_down_delay_s,
            "cold_start_timeout_s": self.cold_start_timeout_s,
        }

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> AutoscalingPolicy:
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})


def merge(policies: list[AutoscalingPolicy]) -> AutoscalingPolicy:
    """One replica pool serves every deployment over the same base: it honours the largest bounds."""
    return AutoscalingPolicy(
        min_replicas=max(p.min_replicas for p in policies),
        max_replicas=max(p.max_replicas for p in policies),
        target_in_flight=min(p.target_in_flight for p in policies),
        scale_up_delay_s=min(p.scale_up_delay_s for p in policies),
        scale_down_delay_s=max(p.scale_down_delay_s for p in policies),
        cold_start_timeout_s=max(p.cold_start_timeout_s for p in policies),
    )


@dataclass
class ScaleState:
    """What the policy remembers between ticks for one pool."""

    above_since_s: float | None = None
    below_since_s: float | None = None
    peak_in_flight: float = 0.0
    history: list[tuple[float, int]] = field(default_factory=list)


def desired_replicas(
    policy: AutoscalingPolicy,
    state: ScaleState,
    *,
    current: int,
    in_flight: float,
    waiting: bool,
    now_s: float,
) -> int:
    """The replica count to run now. ``in_flight`` counts requests being served or queued for the pool;
    ``waiting`` is true while a request waits for a first replica (a pool scaled to zero wakes at once)."""
    lo, hi = policy.min_replicas, max(policy.min_replicas, policy.max_replicas)
    want = math.ceil(in_flight / policy.target_in_flight) if in_flight > 0 else 0
    if waiting:
        want = max(want, 1)
    want = max(lo, min(hi, want))
    if current == 0 and want > 0:
        state.above_since_s = state.below_since_s = None
        return want  # nothing serves: no delay
    if want > current:
        state.below_since_s = None
        if state.above_since_s is None:
            state.above_since_s = now_s
        if now_s - state.above_since_s >= policy.scale_up_delay_s:
            state.above_since_s = None
            return want
        return current
    if want < current:
        state.above_since_s = None
        if state.below_since_s is None:
            state.below_since_s = now_s
        if now_s - state.below_since_s >= policy.scale_down_delay_s:
            state.below_since_s = None
            return max(want, current - 1)  # one at a time
        return current
    state.above_since_s = state.below_since_s = None
    return current
