"""Spot behaviour: measured availability / preemption traces and the seeded random processes.

A trace (format of the Can't Be Late spot traces, see ``trainyard/sim/data/README.md``) gives the number
of instances alive at each tick. Replayed on a pool, ``value / max(value)`` of the pool's nodes are
available; a drop reclaims nodes (the jobs on them get the pool's notice), a rise returns them. The trace
loops when a simulation runs longer than it.

Without a trace a spot pool interrupts each node of an allocation as a Poisson process with the pool's
``interruption_rate_per_hour``; the reclaimed node is replaced at once (capacity is unchanged) and the
job goes back to the queue.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

from trainyard.errors import InvalidInputError


class SpotTraceError(InvalidInputError):
    code = "invalid_spot_trace"
    default_hint = (
        'A spot trace is JSON {"metadata": {"gap_seconds": G}, "data": [instances alive per tick]}.'
    )


@dataclass(frozen=True)
class SpotTrace:
    name: str
    gap_s: float
    values: tuple[int, ...]

    @property
    def max_value(self) -> int:
        return max(self.values)

    @property
    def duration_s(self) -> float:
        return self.gap_s * len(self.values)

    def fraction_at(self, t_s: float, offset_s: float = 0.0) -> float:
        """Share of the pool alive at simulated time ``t_s`` (the trace loops)."""
        i = math.floor((t_s + offset_s) / self.gap_s) % len(self.values)
        return self.values[i] / self.max_value

    def changes(self, start_s: float = 0.0, offset_s: float = 0.0) -> Iterator[tuple[float, float]]:
        """(time, fraction) at every tick where the value changes, from ``start_s`` on, forever (looping)."""
        n = len(self.values)
        i0 = math.floor((start_s + offset_s) / self.gap_s) + 1
        prev = self.values[(i0 - 1) % n]
        i = i0
        idle = 0
        while True:
            v = self.values[i % n]
            if v != prev:
                idle = 0
                yield i * self.gap_s - offset_s, v / self.max_value
                prev = v
            else:
                idle += 1
                if idle > n:  # a constant trace never changes
                    return
            i += 1


def parse_spot_trace(text: str, name: str = "spot trace") -> SpotTrace:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpotTraceError(f"{name}: malformed JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise SpotTraceError(f"{name}: expected an object with a 'data' list")
    meta = doc.get("metadata") or {}
    gap = meta.get("gap_seconds") if isinstance(meta, dict) else None
    if isinstance(gap, bool) or not isinstance(gap, int | float) or not gap > 0:
        raise SpotTraceError(f"{name}: metadata.gap_seconds must be a positive number, got {gap!r}")
    values = doc["data"]
    if not values:
        raise SpotTraceError(f"{name}: 'data' is empty")
    out: list[int] = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0 or not float(v).is_integer():
            raise SpotTraceError(f"{name}: data[{i}] must be a non-negative whole number, got {v!r}")
        out.append(int(v))
    if max(out) == 0:
        raise SpotTraceError(f"{name}: the trace never has an instance available")
    return SpotTrace(name=name, gap_s=float(gap), values=tuple(out))


def stream(seed: int, *key: object) -> random.Random:
    """An independent, reproducible random stream for (seed, key...)."""
    return random.Random(f"trainyard-sim:{seed}:" + ":".join(str(k) for k in key))


def interruption_delay_s(rng: random.Random, rate_per_hour: float, nodes: int) -> float:
    """Time to the first interruption of an allocation of ``nodes`` nodes (each a Poisson process)."""
    if rate_per_hour <= 0 or nodes <= 0:
        return math.inf
    return rng.expovariate(rate_per_hour * nodes / 3600.0)
