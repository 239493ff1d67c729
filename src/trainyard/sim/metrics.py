"""Summary numbers of a simulation run: the ``trainyard simulate --json`` document (DESIGN §3.3)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from trainyard.sim.engine import SimResult

SUMMARY_KEYS = (
    "policy",
    "jobs_total",
    "jobs_completed",
    "total_cost_usd",
    "committed_cost_usd",
    "mean_jct_s",
    "p99_jct_s",
    "deadline_misses",
    "preemptions",
    "lost_work_device_s",
    "solver_time_p99_s",
    "lower_bound_cost_usd",
)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (linear interpolation); 0.0 for no values."""
    if not values:
        return 0.0
    return float(np.percentile(np.asarray(values, dtype=float), q))


def summarize(result: SimResult) -> dict[str, Any]:
    """Exactly the contract keys, in contract order. JCT = completion - submission, completed jobs only;
    a deadline counts as missed when the job finished late or never finished. ``total_cost_usd``
    includes ``committed_cost_usd`` (reserved capacity over the span); ``lower_bound_cost_usd`` is the
    committed spend plus the capacity-aware LP bound on usage (``trainyard.sim.bound``)."""
    jcts = [j.jct_s for j in result.jobs if j.jct_s is not None]
    return {
        "policy": result.policy,
        "jobs_total": len(result.jobs),
        "jobs_completed": len(jcts),
        "total_cost_usd": round(result.total_cost_usd, 6),
        "committed_cost_usd": round(result.committed_cost_usd, 6),
        "mean_jct_s": round(float(np.mean(jcts)), 3) if jcts else 0.0,
        "p99_jct_s": round(percentile(jcts, 99.0), 3),
        "deadline_misses": sum(1 for j in result.jobs if j.missed_deadline),
        "preemptions": sum(j.preemptions for j in result.jobs),
        "lost_work_device_s": round(sum(j.lost_work_device_s for j in result.jobs), 3),
        "solver_time_p99_s": round(percentile(result.round_solve_times_s, 99.0), 6),
        "lower_bound_cost_usd": round(result.lower_bound_cost_usd, 6),
    }
