"""The capacity-aware lower bound on a simulation's spend: a linear programme over (job, option) shares.

Each job the run completed must be done once, in shares over its feasible options (an option is a pool
and a device count, priced at the job's *true* step time with one start-up and no checkpoints or
preemptions, as in the per-job bound); each pool's device-seconds, summed over the shares placed on it,
stay within the capacity the pool offered over the run (the integral of its capacity over the simulated
span). Time order and deadlines are relaxed (any share may run at any time), so the work of every
schedule the simulator produces is a feasible point and the optimum bounds its usage spend from below.
Reserved pools enter at marginal cost zero: they are paid for as committed spend whether used or not.
Solved with HiGHS (``scipy.optimize.linprog``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import csr_matrix


@dataclass(frozen=True)
class BoundOption:
    """One way to do a whole job: on ``pool``, costing ``cost_usd`` and holding ``device_s`` of it."""

    pool: str
    cost_usd: float
    device_s: float


@dataclass(frozen=True)
class CapacityBound:
    usage_usd: float  # the LP optimum (usage spend; the caller adds committed spend)
    status: str  # "optimal", or why the per-job bound was used instead ("infeasible", ...)


def capacity_lower_bound(
    options: Mapping[str, Sequence[BoundOption]], capacity_device_s: Mapping[str, float]
) -> CapacityBound:
    """min Σ share·cost s.t. each job's shares sum to 1 and each pool's Σ share·device_s ≤ its capacity.

    Falls back to the sum of each job's cheapest option (the per-job bound) when the programme has no
    solution (a job whose options all sit on pools with no capacity)."""
    jobs = [j for j, opts in options.items() if opts]
    fallback = sum(min(o.cost_usd for o in options[j]) for j in jobs)
    if not jobs:
        return CapacityBound(0.0, "optimal")
    cost: list[float] = []
    eq_rows: list[int] = []
    pool_rows: dict[str, int] = {}
    rows: list[int] = []
    vals: list[float] = []
    for r, j in enumerate(jobs):
        for o in options[j]:
            cost.append(o.cost_usd)
            eq_rows.append(r)
            rows.append(pool_rows.setdefault(o.pool, len(pool_rows)))
            vals.append(o.device_s)
    n = len(cost)
    cols = np.arange(n)
    a_ub = csr_matrix((vals, (rows, cols)), shape=(len(pool_rows), n))
    b_ub = np.array([max(0.0, float(capacity_device_s.get(p, 0.0))) for p in pool_rows])
    a_eq = csr_matrix((np.ones(n), (eq_rows, cols)), shape=(len(jobs), n))
    res = linprog(
        np.asarray(cost), A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=np.ones(len(jobs)), bounds=(0.0, None),
        method="highs",
    )  # fmt: skip
    if res.status != 0:
        return CapacityBound(fallback, "infeasible" if res.status == 2 else f"linprog status {res.status}")
    return CapacityBound(max(0.0, float(res.fun)), "optimal")
