"""Jobs scheduled as a group (a sweep's trials): the members a round starts share one pool, no more of them
start than the group's parallelism leaves, and their expected costs add up to no more than its budget
left — constraints inside the one optimisation, exact (the solver's optimum equals a brute force over
every assignment) and kept alike by the greedy and LP-rounding passes and by warm rounds."""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scheduler_paths import both_pricing_paths, decisions  # noqa: F401
from test_scheduler_round import job, pool, spec
from test_scheduler_solver import cand, cap, check_solution

from trainyard.schedule import CandidateCache, JobGroup, RunningJob, SchedulerConfig, schedule_round
from trainyard.schedule.solver import (
    GroupLimit,
    ProblemJob,
    TenantLimit,
    budget_left_units,
    cost_units,
    greedy,
    objective_usd,
    pack,
    solve,
)

# every round runs on the vectorised pricing and on the scalar reference, which must decide alike
pytestmark = pytest.mark.usefixtures("both_pricing_paths")

CFG = SchedulerConfig(time_limit_s=0.5)
MEASURED = {"step_time_s": {"a100-80gb": 1.0, "h100": 0.6}}


def check_groups(jobs, groups, choice) -> None:
    pools: dict[str, set[str]] = defaultdict(set)
    starts: dict[str, int] = defaultdict(int)
    units: dict[str, int] = defaultdict(int)
    for j in jobs:
        idx = choice.get(j.job_id)
        if idx is None or j.group is None:
            continue
        opt = j.options[idx]
        pools[j.group].add(opt.pool)
        starts[j.group] += 1
        units[j.group] += cost_units(opt.expected_cost_usd)
    for g, used in pools.items():
        assert len(used) == 1, f"group {g} split over {used}"
        lim = groups.get(g)
        if lim is not None and lim.starts_left is not None:
            assert starts[g] <= lim.starts_left
        if lim is not None and lim.budget_units is not None:
            assert units[g] <= lim.budget_units


def brute_force(jobs, pools, tenants, groups) -> float:
    """The least objective over every assignment that keeps every constraint (packing included)."""
    best = float("inf")
    for pick in itertools.product(*[[None, *range(len(j.options))] for j in jobs]):
        choice = {j.job_id: i for j, i in zip(jobs, pick, strict=True)}
        per_pool = defaultdict(list)
        t_dev: dict[str, int] = defaultdict(int)
        t_jobs: dict[str, int] = defaultdict(int)
        for j, i in zip(jobs, pick, strict=True):
            if i is not None:
                per_pool[j.options[i].pool].append((j.job_id, j.options[i]))
                t_dev[j.tenant] += j.options[i].devices
                t_jobs[j.tenant] += 1
        if any(pack(pools[name], chosen)[1] for name, chosen in per_pool.items()):
            continue
        if any(
            (lim.devices_left is not None and t_dev[t] > lim.devices_left)
            or (lim.jobs_left is not None and t_jobs[t] > lim.jobs_left)
            for t, lim in tenants.items()
        ):
            continue
        try:
            check_groups(jobs, groups, choice)
        except AssertionError:
            continue
        best = min(best, objective_usd(jobs, choice))
    return best


@st.composite
def grouped(draw):
    pools = {f"p{i}": cap(f"p{i}", draw(st.integers(0, 4)), 1) for i in range(draw(st.integers(1, 3)))}
    jobs = []
    for j in range(draw(st.integers(1, 5))):
        opts = [
            cand(f"j{j}", name, draw(st.sampled_from([1, 2])), draw(st.floats(1, 50)), per_node=1)
            for name in pools
            if draw(st.booleans())
        ]
        opts.sort(key=lambda c: c.objective_usd)
        group = draw(st.sampled_from([None, "g", "g", "h"]))
        jobs.append(ProblemJob(f"j{j}", "t", tuple(opts), draw(st.floats(1, 120)), 1.0, group=group))
    groups = {
        g: GroupLimit(
            draw(st.none() | st.integers(0, 3)),
            draw(st.none() | st.integers(0, 120).map(lambda usd: budget_left_units(float(usd)))),
        )
        for g in ("g", "h")
        if draw(st.booleans())
    }
    return jobs, pools, {"t": TenantLimit(None, None)}, groups


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grouped())
def test_group_constraints_hold_and_the_optimum_is_exact(inst) -> None:
    jobs, pools, tenants, groups = inst
    g = greedy(jobs, pools, tenants, groups)
    check_solution(jobs, pools, tenants, g)
    check_groups(jobs, groups, g)
    sol = solve(jobs, pools, tenants, CFG, groups=groups)
    check_solution(jobs, pools, tenants, sol.choice)
    check_groups(jobs, groups, sol.choice)
    # the model is exact: its optimum is the least objective of any assignment keeping every constraint
    # (objective coefficients are whole thousandths of a dollar: one per job at most in rounding)
    assert sol.objective_usd == pytest.approx(brute_force(jobs, pools, tenants, groups), abs=1e-3 * len(jobs))
    if sol.lower_bound_usd is not None:
        assert sol.lower_bound_usd <= sol.objective_usd + 1e-9


def test_the_budget_row_is_exact_to_a_micro_dollar() -> None:
    assert cost_units(0.1) == 100_000 and budget_left_units(0.1) == 100_000
    assert cost_units(1e-7) == 1 and budget_left_units(1e-7) == 0 and budget_left_units(-3.0) == 0
    pools = {"p": cap("p", 8, 1)}
    jobs = [ProblemJob(f"j{i}", "t", (cand(f"j{i}", "p", 1, 0.1),), 10.0, 1.0, group="g") for i in range(3)]
    for budget, placed in ((0.3, 3), (0.299999, 2), (0.2, 2), (0.05, 0)):
        lim = {"g": GroupLimit(None, budget_left_units(budget))}
        sol = solve(jobs, pools, {}, CFG, groups=lim)
        assert sum(i is not None for i in sol.choice.values()) == placed, budget


def trials(n: int, group: str = "sweep-1", **over) -> list:
    return [
        replace(job(spec(f"{group}-t{i}", measured=MEASURED, **over)), group=group, submit_s=float(i))
        for i in range(n)
    ]


def test_a_groups_members_share_one_pool_where_alone_they_would_split() -> None:
    # a100 is cheaper per job but has room for two; h100 fits all four
    pools = [pool("a100", "a100-80gb", 2.0, available=2), pool("h100", "h100", 4.0, nodes=8)]
    alone = schedule_round([replace(t, group=None) for t in trials(4)], pools, config=CFG)
    assert sorted(p.pool for p in alone.placements) == ["a100", "a100", "h100", "h100"]
    together = schedule_round(trials(4), pools, config=CFG)
    assert len({p.pool for p in together.placements}) == 1
    assert len(together.placements) == 4  # waiting two rounds costs more than h100's premium here
    assert all("group sweep-1 shares" in p.reason for p in together.placements)


def test_parallelism_budget_and_pin_limit_the_starts() -> None:
    pools = [pool("a100", "a100-80gb", 2.0, nodes=8), pool("h100", "h100", 4.0, nodes=8)]
    jobs = trials(5)
    two = schedule_round(jobs, pools, config=CFG, groups={"sweep-1": JobGroup(max_starts=2)})
    assert len(two.placements) == 2 and len(two.unplaced) == 3
    assert all("may start 2 more member(s)" in u.reason for u in two.unplaced)
    one_cost = two.placements[0].expected_cost_usd
    budget = 3.5 * one_cost
    three = schedule_round(jobs, pools, config=CFG, groups={"sweep-1": JobGroup(budget_usd=budget)})
    assert len(three.placements) == 3
    assert sum(p.expected_cost_usd for p in three.placements) <= budget
    assert all("of its budget left for new members" in u.reason for u in three.unplaced)
    pinned = schedule_round(jobs, pools, config=CFG, groups={"sweep-1": JobGroup(pool="h100")})
    assert {p.pool for p in pinned.placements} == {"h100"} and len(pinned.placements) == 5
    gone = schedule_round(jobs, pools, config=CFG, groups={"sweep-1": JobGroup(pool="tpu")})
    assert not gone.placements and all("runs on pool tpu" in u.reason for u in gone.unplaced)
    # a job outside the group is not held back by the group's limits
    other = replace(job(spec("solo", measured=MEASURED)), submit_s=9.0)
    mixed = schedule_round([*jobs, other], pools, config=CFG, groups={"sweep-1": JobGroup(max_starts=0)})
    assert [p.job_id for p in mixed.placements] == ["solo"]


def test_a_groups_running_member_stays_where_it_is() -> None:
    pools = [pool("a100", "a100-80gb", 2.0, nodes=8), pool("h100", "h100", 9.0, nodes=8)]
    s = spec("r", workload={"steps": 20000}, measured=MEASURED)
    home = RunningJob("r", "t", s, 0.0, pool="h100", devices=1, market="on_demand", placed_s=0.0,
                      progress_fraction=0.1)  # fmt: skip
    moved = schedule_round([], pools, [home], now_s=7200.0, config=CFG)
    assert [p.job_id for p in moved.placements if p.migration] == ["r"]  # alone, it would move to a100
    kept = schedule_round([], pools, [replace(home, group="sweep-1")], now_s=7200.0, config=CFG)
    assert kept.kept == ("r",) and not kept.placements


def test_warm_rounds_with_groups_decide_as_fresh_rounds() -> None:
    pools = [
        pool("a100", "a100-80gb", 2.0, available=3),
        pool("h100", "h100", 4.0, nodes=8),
        pool("spot", "a100-80gb", 0.9, market="spot", available=1, interruption_rate_per_hour=0.1),
    ]
    jobs = [*trials(4), *trials(3, group="sweep-2", workload={"steps": 3000})]
    jobs.append(replace(job(spec("solo", measured=MEASURED)), submit_s=5.0))
    cost = schedule_round(trials(1), [pools[0]], config=CFG).placements[0].expected_cost_usd
    sequence = [
        {},
        {"sweep-1": JobGroup(max_starts=2)},
        {"sweep-1": JobGroup(max_starts=2), "sweep-2": JobGroup(budget_usd=2.5 * cost)},
        {"sweep-1": JobGroup(max_starts=3, pool="h100"), "sweep-2": JobGroup(budget_usd=2.5 * cost)},
        {"sweep-1": JobGroup(max_starts=3, pool="h100"), "sweep-2": JobGroup(budget_usd=0.5 * cost)},
        {"sweep-1": JobGroup(max_starts=3, pool="h100"), "sweep-2": JobGroup(budget_usd=0.5 * cost)},
        {},
    ]
    cache = CandidateCache()
    seen = set()
    for step, groups in enumerate(sequence):
        warm = schedule_round(jobs, pools, now_s=60.0 * step, config=CFG, cache=cache, groups=groups)
        fresh = schedule_round(
            jobs, pools, now_s=60.0 * step, config=CFG, cache=CandidateCache(), groups=groups
        )
        assert decisions(warm) == decisions(fresh), step
        seen.add(tuple(sorted((p.job_id, p.pool) for p in warm.placements)))
        for g in ("sweep-1", "sweep-2"):
            assert (
                len({p.pool for p in warm.placements if p.job_id in {j.job_id for j in jobs if j.group == g}})
                <= 1
            )
    last = len(sequence) - 1
    again = schedule_round(
        jobs, pools, now_s=60.0 * last, config=CFG, cache=cache, groups=dict(sequence[last])
    )
    assert again.solve_time_s == 0.0  # nothing the model reads changed: the last answer stands
    assert len(seen) >= 4  # the limits moved the decisions
