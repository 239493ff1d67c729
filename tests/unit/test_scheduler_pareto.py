"""Pareto pruning of each job's options (``round.pareto_rows``) never removes the optimum.

A round with every option in the model (no per-job or per-pool option limits) is solved to proven optimality
with and without the pruning: the objectives are equal. The rows the pruning drops are really dominated
(same pool, sorted after, no fewer devices, capacity, whole nodes or later finish), and it drops many on the
distinct-shapes benchmark.
"""

from __future__ import annotations

import random
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scheduler_strategies import MARKETS, pool_lists
from test_scheduler_round import spec

from trainyard.schedule import CandidateCache, QueuedJob, RunningJob, SchedulerConfig, schedule_round
from trainyard.schedule.grid import spec_grid
from trainyard.schedule.round import _RoundPools, _static, pareto_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_scheduler
import bench_scheduler_distinct

ACCS = ["a100-80gb", "h100", "t4", "tpu-v4", "trn1", "l4"]
CACHE = CandidateCache()

# every option in the model, a search long enough to prove optimality, and no LP shortcut
EXACT = SchedulerConfig(
    max_options_per_job=10_000, max_options_per_pool=10_000, time_limit_s=20.0, skip_search_gap=0.0
)


@st.composite
def rounds(draw: Any) -> Any:
    pools = draw(pool_lists(ACCS, max_pools=4))
    jobs = []
    for j in range(draw(st.integers(1, 7))):
        lo = draw(st.sampled_from([1, 2, 4, 8]))
        objective: dict[str, Any] = {
            "markets": draw(st.lists(st.sampled_from(MARKETS), min_size=1, max_size=3, unique=True))
        }
        if draw(st.booleans()):
            objective["deadline"] = draw(st.sampled_from(["3h", "12h", "48h"]))
        if draw(st.integers(0, 3)) == 0:
            objective["minimize"] = "time"
        s = spec(
            f"j{j}",
            model={"architecture": "custom", "params_b": draw(st.sampled_from([0.3, 1.5, 7.0]))},
            workload={"steps": draw(st.sampled_from([500, 4000, 30000]))},
            resources={"min_devices": lo, "max_devices": lo * draw(st.sampled_from([1, 2, 4, 8]))},
            objective=objective,
            measured={"step_time_s": {draw(st.sampled_from(ACCS)): draw(st.sampled_from([0.3, 1.0, 2.5]))}},
        )
        jobs.append(
            QueuedJob(
                f"j{j}", draw(st.sampled_from(["a", "b"])), s, submit_s=0.0, priority=draw(st.integers(0, 2))
            )
        )
    return pools, jobs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds(), st.sampled_from([0.0, 3600.0]))
def test_pruning_never_removes_the_optimum(case: Any, now_s: float) -> None:
    pools, jobs = case
    pruned = schedule_round(jobs, pools, now_s=now_s, config=EXACT, cache=CACHE)
    full = schedule_round(jobs, pools, now_s=now_s, config=replace(EXACT, pareto_pruning=False), cache=CACHE)
    tol = (len(jobs) + 1) / EXACT.cost_scale
    for r in (pruned, full):  # both proven optimal (by the search, or by the LP bound meeting the answer)
        proven = r.solver_status in ("optimal", "empty") or (
            r.lower_bound_usd is not None and r.objective_usd - r.lower_bound_usd <= tol
        )
        assert proven, (r.solver_status, r.objective_usd, r.lower_bound_usd)
    # equal optima (two optimal choices may differ by the solver's integer rounding: 1/cost_scale a job)
    assert abs(pruned.objective_usd - full.objective_usd) <= tol, (pruned.objective_usd, full.objective_usd)


def _benchmark_statics(n_jobs: int) -> tuple[list[Any], Any]:
    rng = random.Random(5)
    pools = bench_scheduler.make_pools(100, rng)
    jobs = bench_scheduler_distinct.make_distinct_jobs(n_jobs, rng)
    cache = CandidateCache()
    rnd = _RoundPools.of(pools, cache)
    cfg = SchedulerConfig()
    statics = [
        _static(spec_grid(j.spec, pools, cfg, cache, markets=rnd.markets), pools, rnd.name_rank, rnd.markets)
        for j in jobs
    ]
    return statics, rnd


def test_pruned_rows_are_dominated_and_the_benchmark_loses_many() -> None:
    statics, _ = _benchmark_statics(25)
    kept = total = 0
    for s in statics:
        g, order = s.grid, s.order
        pos = {k: i for i, k in enumerate(order.tolist())}
        span = np.where(g.nodes > 1, g.nodes, 0)
        finishes = np.sort(g.finish[order])
        for left_s in (None, *(finishes[len(finishes) // q] for q in (2, 4) if len(finishes))):
            useful = pareto_rows(s, left_s).tolist()
            on_time = [k for k in order.tolist() if left_s is None or g.finish[k] <= left_s]
            total += len(on_time)
            kept += len(useful)
            # a subsequence of the on-time rows, in order
            assert [k for k in on_time if k in set(useful)] == useful
            # every dropped on-time row has a kept on-time row of its pool, sorted first, dominating it
            for j in set(on_time) - set(useful):
                assert any(
                    pos[i] < pos[j]
                    and g.pool[i] == g.pool[j]
                    and g.devices[i] <= g.devices[j]
                    and g.capacity[i] <= g.capacity[j]
                    and span[i] <= span[j]
                    and g.objective[i] <= g.objective[j]
                    for i in useful
                ), j
    assert total > 1000 and kept < 0.9 * total  # the grid was priced, and pruning drops some of it


def test_pareto_rows_of_short_orders() -> None:
    statics, _ = _benchmark_statics(3)
    s = statics[0]
    one = replace(
        s, order=s.order[:1], has_dominator=s.has_dominator[:1], dominator_finish_s=s.dominator_finish_s[:1]
    )
    assert pareto_rows(one, None).tolist() == s.order[:1].tolist()
    none = replace(
        s, order=s.order[:0], has_dominator=s.has_dominator[:0], dominator_finish_s=s.dominator_finish_s[:0]
    )
    assert pareto_rows(none, None).tolist() == []


def test_rounds_with_running_jobs_and_pruning_decide_alike_on_both_pricing_paths() -> None:
    rng = random.Random(12)
    pools = bench_scheduler.make_pools(30, rng)
    jobs = bench_scheduler_distinct.make_distinct_jobs(40, rng)
    pools = [
        p.model_copy(update={"available_devices": min(p.free_devices, p.devices_per_node)}) for p in pools
    ]
    home = next(
        p for p in pools if p.market.value == "spot" and p.accelerator in jobs[0].spec.measured.step_time_s
    )
    running = [
        RunningJob("run-0", "t", jobs[0].spec, -7200.0, home.name, jobs[0].spec.resources.min_devices or 1,
                   "spot", -7200.0, 0.3)
    ]  # fmt: skip
    cfg = SchedulerConfig(time_limit_s=0.2)
    a = schedule_round(jobs[1:], pools, running, 1800.0, cfg, cache=CandidateCache())
    b = schedule_round(jobs[1:], pools, running, 1800.0, replace(cfg, vectorised_pricing=False))
    assert a.placements == b.placements and a.unplaced == b.unplaced and a.objective_usd == b.objective_usd
