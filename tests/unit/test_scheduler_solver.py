"""The placement optimisation over hand-made candidates: properties and small hand-checked instances."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ortools.sat.python import cp_model

from trainyard.schedule.solver import (  # the LP rounding tested on its own
    BUDGET_UNITS_PER_USD,
    GroupLimit,
    PoolCapacity,
    ProblemJob,
    TenantLimit,
    _build,
    _lp_round,
    budget_left_units,
    cost_units,
    find_slot,
    greedy,
    node_free_list,
    nodes_needed,
    objective_usd,
    pack,
    set_parameters,
    solve,
    take_slot,
    whole_nodes,
)
from trainyard.schedule.types import Candidate, SchedulerConfig

CFG = SchedulerConfig(time_limit_s=0.2)


def cand(
    job: str, pool: str, devices: int, cost: float, *, per_node: int = 8, tenant: str = "t"
) -> Candidate:
    nodes = max(1, -(-devices // per_node))
    return Candidate(
        job_id=job,
        tenant=tenant,
        pool=pool,
        accelerator="a100-80gb",
        devices=devices,
        nodes=nodes,
        devices_per_node=per_node,
        market="on_demand",
        expected_cost_usd=cost,
        expected_hours=1.0,
        expected_hours_p90=1.2,
        step_time_s=1.0,
        price_usd_per_hour=cost,
        checkpoint_interval_s=1800.0,
        finish_s=3600.0,
        feasible=True,
        capacity_devices=nodes * per_node if nodes > 1 else devices,
        objective_usd=cost,
    )


def cap(name: str, free: int, per_node: int = 8) -> PoolCapacity:
    return PoolCapacity(name, free, free // per_node, per_node)


def check_solution(jobs, pools, tenants, choice) -> None:
    used_dev: dict[str, int] = defaultdict(int)
    t_dev: dict[str, int] = defaultdict(int)
    t_jobs: dict[str, int] = defaultdict(int)
    per_pool: dict[str, list] = defaultdict(list)
    for job in jobs:
        idx = choice[job.job_id]
        if idx is None:
            assert not job.must_place
            continue
        opt = job.options[idx]
        # gangs whole: the chosen option is one of the job's own options, all devices at once
        assert opt.job_id == job.job_id
        used_dev[opt.pool] += opt.capacity_devices
        per_pool[opt.pool].append((job.job_id, opt))
        t_dev[job.tenant] += opt.devices
        t_jobs[job.tenant] += 1
    for name, used in used_dev.items():
        assert used <= pools[name].free_devices, f"pool {name} over capacity"
        _, failed = pack(pools[name], per_pool[name])
        assert not failed, f"pool {name}: {failed} could not get nodes"
    for tenant, lim in tenants.items():
        if lim.devices_left is not None:
            assert t_dev[tenant] <= lim.devices_left
        if lim.jobs_left is not None:
            assert t_jobs[tenant] <= lim.jobs_left


@st.composite
def instances(draw):
    n_pools = draw(st.integers(1, 4))
    pools = {}
    for i in range(n_pools):
        per_node = draw(st.sampled_from([1, 4, 8]))
        nodes = draw(st.integers(1, 4))
        free = draw(st.integers(0, nodes * per_node))
        pools[f"p{i}"] = cap(f"p{i}", free, per_node)
    jobs = []
    for j in range(draw(st.integers(1, 12))):
        tenant = draw(st.sampled_from(["a", "b"]))
        opts = []
        for name, pc in pools.items():
            if draw(st.booleans()):
                devices = draw(st.sampled_from([1, 2, 4, 8, 16]))
                opts.append(
                    cand(
                        f"j{j}",
                        name,
                        devices,
                        draw(st.floats(1, 100)),
                        per_node=pc.devices_per_node,
                        tenant=tenant,
                    )
                )
        opts.sort(key=lambda c: c.objective_usd)
        jobs.append(
            ProblemJob(f"j{j}", tenant, tuple(opts), unplaced_usd=draw(st.floats(1, 200)), rank_usd=1.0)
        )
    tenants = {
        "a": TenantLimit(draw(st.none() | st.integers(0, 16)), draw(st.none() | st.integers(0, 4))),
        "b": TenantLimit(None, None),
    }
    return jobs, pools, tenants


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_solutions_respect_capacity_gangs_and_quotas(inst) -> None:
    jobs, pools, tenants = inst
    g = greedy(jobs, pools, tenants)
    check_solution(jobs, pools, tenants, g)
    sol = solve(jobs, pools, tenants, CFG)
    check_solution(jobs, pools, tenants, sol.choice)
    # never worse than the greedy warm start
    assert sol.objective_usd <= objective_usd(jobs, g) + 1e-6


def test_cheapest_fitting_option_wins_and_capacity_is_shared() -> None:
    pools = {"cheap": cap("cheap", 8), "dear": cap("dear", 8)}
    jobs = [
        ProblemJob("a", "t", (cand("a", "cheap", 8, 10.0), cand("a", "dear", 8, 30.0)), 1000.0),
        ProblemJob("b", "t", (cand("b", "cheap", 8, 12.0), cand("b", "dear", 8, 50.0)), 1000.0),
    ]
    sol = solve(jobs, pools, {}, CFG)
    # a on cheap + b on dear = 60; b on cheap + a on dear = 42: the optimum gives the cheap pool to b
    assert sol.choice == {"a": 1, "b": 0}
    assert abs(sol.objective_usd - 42.0) < 1e-9
    # proven optimal: by CP-SAT, or by the LP bound meeting the rounded solution
    assert sol.status in ("optimal", "lp")
    assert sol.lower_bound_usd is not None and abs(sol.lower_bound_usd - 42.0) < 1e-6


def test_job_waits_when_waiting_is_cheaper_than_the_premium() -> None:
    pools = {"dear": cap("dear", 8)}
    jobs = [ProblemJob("a", "t", (cand("a", "dear", 8, 100.0),), unplaced_usd=60.0)]
    assert solve(jobs, pools, {}, CFG).choice == {"a": None}


def test_multi_node_gang_needs_whole_free_nodes() -> None:
    # 12 free devices on 8-device nodes = 1 whole node + 4 on a partly used one: a 16-device gang cannot run
    pools = {"p": PoolCapacity("p", 12, 1, 8)}
    jobs = [ProblemJob("big", "t", (cand("big", "p", 16, 10.0),), 1000.0)]
    assert solve(jobs, pools, {}, CFG).choice == {"big": None}
    assert node_free_list(pools["p"]) == [8, 4]
    pools = {"p": PoolCapacity("p", 16, 2, 8)}
    assert solve(jobs, pools, {}, CFG).choice == {"big": 0}


def test_tenant_device_and_job_quotas() -> None:
    pools = {"p": cap("p", 64)}
    jobs = [ProblemJob(f"j{i}", "t", (cand(f"j{i}", "p", 4, 10.0 + i),), 1000.0) for i in range(5)]
    sol = solve(jobs, pools, {"t": TenantLimit(devices_left=8, jobs_left=None)}, CFG)
    assert sum(v is not None for v in sol.choice.values()) == 2
    sol = solve(jobs, pools, {"t": TenantLimit(devices_left=None, jobs_left=3)}, CFG)
    assert sum(v is not None for v in sol.choice.values()) == 3


def test_deterministic_for_equal_inputs() -> None:
    pools = {f"p{i}": cap(f"p{i}", 8 * (i % 3)) for i in range(6)}
    jobs = [
        ProblemJob(
            f"j{j}",
            "t",
            tuple(
                sorted(
                    (cand(f"j{j}", f"p{i}", 2 ** (j % 4), 5.0 + (7 * i + 3 * j) % 11) for i in range(6)),
                    key=lambda c: c.objective_usd,
                )
            ),
            40.0,
        )
        for j in range(30)
    ]
    a = solve(jobs, pools, {}, CFG)
    b = solve(jobs, pools, {}, CFG)
    assert a.choice == b.choice and a.objective_usd == b.objective_usd


# --- the parts of one round, as worked examples computed by hand ---------------------------------------


def stay(job: str, pool: str, devices: int, cost: float) -> Candidate:
    """A running job's keep-its-allocation option: no new capacity."""
    return replace(cand(job, pool, devices, cost), is_stay=True, capacity_devices=0)


def test_budget_units_absorb_float_noise_and_round_towards_the_safe_side() -> None:
    assert cost_units(0.1 + 0.2) == 300_000  # 300000.00000000006 is noise, not a micro-dollar more
    assert cost_units(1.0000001) == 1_000_001  # a real tenth of a micro-dollar rounds up
    assert budget_left_units(2.7e-6) == 2  # rounded down, not to the nearest
    assert budget_left_units(-5.0) == 0
    # at millions of dollars the noise reaches the fourth decimal of the units: still absorbed
    assert 4363629.44 * 1e6 == 4363629440000.0005 and cost_units(4363629.44) == 4363629440000
    assert 4384393.97 * 1e6 == 4384393969999.9995 and budget_left_units(4384393.97) == 4384393970000


def test_node_helpers() -> None:
    assert whole_nodes(17, 8) == 2 and whole_nodes(5, 0) == 0
    assert [nodes_needed(d, 8) for d in (0, 1, 8, 9, 16, 17)] == [1, 1, 1, 2, 2, 3]
    assert node_free_list(PoolCapacity("p", 12, 1, 8)) == [8, 4]
    assert node_free_list(PoolCapacity("p", 16, 2, 8)) == [8, 8]
    assert node_free_list(PoolCapacity("p", 3, 0, 8)) == [3]
    # more free devices than whole nodes account for: the rest is one node's worth at most
    assert node_free_list(PoolCapacity("p", 20, 1, 8)) == [8, 8]


def test_find_slot_takes_the_tightest_node_that_fits_and_whole_nodes_for_a_gang() -> None:
    four = cand("a", "p", 4, 1.0)
    assert find_slot([2, 8], four, 8) == [1]  # the first node is too small
    assert find_slot([8, 5, 6, 4], four, 8) == [3]
    assert find_slot([8, 8], four, 8) == [0]  # ties keep the first
    assert find_slot([2, 3], four, 8) is None
    gang = cand("g", "p", 16, 1.0)  # two whole 8-device nodes
    assert find_slot([8, 4, 8, 8], gang, 8) == [0, 2]
    assert find_slot([8, 4, 7], gang, 8) is None
    free = [8, 4, 8, 8]
    take_slot(free, gang, [0, 2])
    take_slot(free, four, [1])
    assert free == [0, 0, 0, 8]


def test_pack_places_gangs_first_then_larger_options_and_reports_what_failed() -> None:
    per5 = PoolCapacity("p", 10, 2, 5)  # two 5-device nodes
    opts = [(j, cand(j, "p", d, 1.0, per_node=5)) for j, d in (("a", 1), ("b", 2), ("c", 3), ("d", 4))]
    # largest first: d+a on one node, c+b on the other; in name order d would find no node
    assert pack(per5, opts) == ({"d": [0], "c": [1], "b": [1], "a": [0]}, [])
    # a failure does not stop the rest: 4 on the full node, 3 fits nowhere, 2 on the partial node
    partial = PoolCapacity("p", 7, 1, 5)  # [5, 2]
    opts = [(j, cand(j, "p", d, 1.0, per_node=5)) for j, d in (("a", 4), ("b", 3), ("c", 2))]
    assert pack(partial, opts) == ({"a": [0], "c": [1]}, ["b"])
    # the gang goes first, so a single-node option is the one that fails, not the gang
    three = PoolCapacity("p", 15, 3, 5)
    opts = [("m", cand("m", "p", 10, 1.0, per_node=5)), ("s", cand("s", "p", 3, 1.0, per_node=5)),
            ("t", cand("t", "p", 3, 1.0, per_node=5))]  # fmt: skip
    assert pack(three, opts) == ({"m": [0, 1], "s": [2]}, ["t"])


def test_greedy_places_in_order_on_the_cheapest_fitting_option() -> None:
    pools = {"p": cap("p", 8), "q": cap("q", 8)}
    jobs = [
        ProblemJob("low", "t", (cand("low", "p", 8, 5.0), cand("low", "q", 8, 6.0)), 100.0, rank_usd=1.0),
        ProblemJob("high", "t", (cand("high", "p", 8, 5.0), cand("high", "q", 8, 9.0)), 100.0, rank_usd=2.0),
        # its only option costs what waiting does: it waits
        ProblemJob("even", "t", (cand("even", "q", 1, 50.0),), 50.0, rank_usd=3.0),
    ]
    # the higher rank takes the cheap pool; the other gets its second choice
    assert greedy(jobs, pools, {}) == {"even": None, "high": 0, "low": 1}
    assert objective_usd(jobs, {"even": None, "high": 0, "low": 1}) == 50.0 + 5.0 + 6.0


def test_greedy_keeps_tenant_quotas_and_counts_a_running_jobs_devices() -> None:
    pools = {"p": cap("p", 64)}
    queued = [ProblemJob(f"j{i}", "t", (cand(f"j{i}", "p", 2, 1.0),), 100.0) for i in range(3)]
    assert greedy(queued, pools, {"t": TenantLimit(None, 2)}) == {"j0": 0, "j1": 0, "j2": None}
    assert greedy(queued, pools, {"t": TenantLimit(4, None)}) == {"j0": 0, "j1": 0, "j2": None}
    assert greedy(queued, pools, {"t": TenantLimit(3, None)}) == {"j0": 0, "j1": None, "j2": None}
    assert greedy(queued, pools, {"t": TenantLimit(0, None)}) == {"j0": None, "j1": None, "j2": None}
    assert greedy(queued, pools, {"t": TenantLimit(None, 0)}) == {"j0": None, "j1": None, "j2": None}
    # a running job holding 4 devices may move to 6 with 2 left (it adds 2) and is not a new job
    run = ProblemJob("r", "t", (cand("r", "p", 6, 1.0), stay("r", "q", 4, 9.0)), None, current_devices=4)
    limits = {"t": TenantLimit(devices_left=2, jobs_left=1)}
    assert greedy([run, queued[0]], pools, limits) == {"r": 0, "j0": None}  # no device left for j0
    assert greedy([run, queued[0]], pools, {"t": TenantLimit(4, 1)}) == {"r": 0, "j0": 0}


def test_greedy_falls_back_to_the_stay_option_when_no_move_fits() -> None:
    pools = {"p": PoolCapacity("p", 4, 0, 8), "q": PoolCapacity("q", 0, 0, 8)}
    run = ProblemJob("r", "t", (cand("r", "p", 8, 1.0), stay("r", "q", 8, 9.0)), None, current_devices=8)
    assert greedy([run], pools, {}) == {"r": 1}
    # a 16-device gang needs two whole nodes; a single-node option needs one node with room
    jobs = [ProblemJob("g", "t", (cand("g", "p", 16, 1.0),), 100.0),
            ProblemJob("s", "t", (cand("s", "p", 6, 1.0),), 100.0)]  # fmt: skip
    assert greedy(jobs, {"p": PoolCapacity("p", 12, 1, 8)}, {}) == {"g": None, "s": 0}
    assert greedy(jobs, {"p": PoolCapacity("p", 22, 2, 8)}, {}) == {"g": 0, "s": 0}
    assert greedy(jobs, {"p": PoolCapacity("p", 21, 2, 8)}, {}) == {"g": 0, "s": None}  # [0, 0, 5]


def test_greedy_keeps_a_groups_pool_starts_and_budget() -> None:
    pools = {"a": cap("a", 64), "b": cap("b", 64)}

    def member(j: str, first: str, second: str) -> ProblemJob:
        opts = (cand(j, first, 1, 1.0), cand(j, second, 1, 2.0))
        return ProblemJob(j, "t", opts, 100.0, rank_usd=10.0 if j == "m0" else 1.0, group="g")

    jobs = [
        member("m0", "a", "b"),
        member("m1", "b", "a"),
        ProblemJob("x", "t", (cand("x", "b", 1, 1.0),), 9.0),
    ]
    # the first member picks pool a; the second follows it there at its dearer option
    assert greedy(jobs, pools, {}) == {"m0": 0, "m1": 1, "x": 0}
    assert greedy(jobs, pools, {}, {"g": GroupLimit(starts_left=1)}) == {"m0": 0, "m1": None, "x": 0}
    assert greedy(jobs, pools, {}, {"g": GroupLimit(starts_left=2)}) == {"m0": 0, "m1": 1, "x": 0}
    assert greedy(jobs, pools, {}, {"g": GroupLimit(starts_left=0)}) == {"m0": None, "m1": None, "x": 0}
    # budget: $1 + $2 is exactly $3
    exact = {"g": GroupLimit(budget_units=3 * BUDGET_UNITS_PER_USD)}
    assert greedy(jobs, pools, {}, exact) == {"m0": 0, "m1": 1, "x": 0}
    short = {"g": GroupLimit(budget_units=3 * BUDGET_UNITS_PER_USD - 1)}
    assert greedy(jobs, pools, {}, short) == {"m0": 0, "m1": None, "x": 0}


def _conflict(pools: dict[str, PoolCapacity]) -> list[ProblemJob]:
    # a running job could move onto the 4 free devices of p for $1 (staying costs $50), but a queued job
    # that costs $1000 to leave out needs them: the optimum keeps r where it is. The greedy pass, which
    # places running jobs first, moves r and leaves q out (1001 against 51).
    run = ProblemJob("r", "t", (cand("r", "p", 4, 1.0), stay("r", "home", 4, 50.0)), None, current_devices=4)
    return [run, ProblemJob("q", "t", (cand("q", "p", 4, 1.0),), 1000.0)]


def test_the_optimiser_beats_the_greedy_pass_and_says_how() -> None:
    pools = {"p": PoolCapacity("p", 4, 0, 8), "home": PoolCapacity("home", 0, 0, 8)}
    jobs = _conflict(pools)
    assert greedy(jobs, pools, {}) == {"r": 0, "q": None}
    sol = solve(jobs, pools, {}, CFG)
    assert sol.choice == {"r": 1, "q": 0}
    assert sol.objective_usd == 51.0 and sol.greedy_objective_usd == 1001.0
    assert sol.status == "lp" and sol.wall_time_s == 0.0  # the LP bound proves the rounding optimal
    assert sol.lower_bound_usd == pytest.approx(51.0)
    # the running job's own devices count for the tenant: r stays (4 - 4 = 0 more), q takes 4 of 4
    sol = solve(jobs, pools, {"t": TenantLimit(devices_left=4, jobs_left=1)}, CFG)
    assert sol.choice == {"r": 1, "q": 0} and sol.objective_usd == 51.0


def test_an_empty_round_and_a_round_without_options() -> None:
    sol = solve([], {}, {}, CFG)
    assert (sol.choice, sol.objective_usd, sol.status, sol.lower_bound_usd) == ({}, 0.0, "empty", 0.0)
    jobs = [ProblemJob("a", "t", (), 7.5)]
    sol = solve(jobs, {}, {}, CFG)
    assert (sol.choice, sol.objective_usd, sol.greedy_objective_usd, sol.status) == (
        {"a": None},
        7.5,
        7.5,
        "empty",
    )


def test_the_search_answer_is_given_concrete_nodes() -> None:
    # 3 + 3 + 4 devices fit two 5-device nodes in total but not node by node: CP-SAT's aggregate answer
    # (all three) is repaired to what packs. A job it left out ("z", dearer than waiting) comes first.
    per5 = {"p": PoolCapacity("p", 10, 2, 5), "home": PoolCapacity("home", 0, 0, 5)}
    jobs = [
        ProblemJob("z", "t", (cand("z", "p", 1, 500.0, per_node=5),), 10.0),
        ProblemJob("a", "t", (cand("a", "p", 3, 1.0, per_node=5),), 100.0),
        ProblemJob("c", "t", (cand("c", "p", 4, 1.0, per_node=5),), 100.0),
        ProblemJob("r", "t", (cand("r", "p", 3, 1.0, per_node=5), stay("r", "home", 3, 50.0)), None,
                   current_devices=3),
    ]  # fmt: skip
    sol = solve(jobs, per5, {}, CFG)
    moved = [(j.job_id, j.options[i]) for j in jobs if (i := sol.choice[j.job_id]) is not None]
    assert pack(per5["p"], [(j, o) for j, o in moved if not o.is_stay])[1] == []
    # c and a pack (4 + 3 on different nodes); r's 3-device move fits nowhere then, so it stays
    assert sol.choice == {"z": None, "a": 0, "c": 0, "r": 1}
    assert sol.objective_usd == 10.0 + 1.0 + 1.0 + 50.0
    assert sol.status == "feasible"  # the aggregate optimum (13) was not packable: nothing is proven
    assert sol.lower_bound_usd is not None and sol.lower_bound_usd <= 13.0 + 1e-6


def test_search_finds_an_all_fitting_packing_and_proves_it() -> None:
    per5 = {"p": PoolCapacity("p", 10, 2, 5)}
    jobs = [
        ProblemJob(j, "t", (cand(j, "p", d, 1.0, per_node=5),), 100.0)
        for j, d in zip("abcd", (1, 2, 3, 4), strict=True)
    ]
    assert greedy(jobs, per5, {}) == {"a": 0, "b": 0, "c": 0, "d": None}  # one by one, d finds no room
    sol = solve(jobs, per5, {}, CFG)
    assert sol.choice == {"a": 0, "b": 0, "c": 0, "d": 0}
    assert sol.objective_usd == 4.0 and sol.greedy_objective_usd == 103.0
    assert sol.status == "optimal" and sol.lower_bound_usd == pytest.approx(4.0)


def test_solver_parameters_are_deterministic_and_light() -> None:
    solver = cp_model.CpSolver()
    set_parameters(solver, replace(CFG, num_workers=0, seed=7, wall_limit_factor=10.0), 0.2)
    p = solver.parameters
    assert (p.num_workers, p.random_seed) == (1, 7)
    assert p.max_deterministic_time == pytest.approx(0.2) and p.max_time_in_seconds == pytest.approx(2.0)
    assert (p.cp_model_probing_level, p.symmetry_level, p.log_search_progress) == (0, 0, False)
    set_parameters(solver, replace(CFG, num_workers=3, wall_limit_factor=10.0), 0.0)
    assert solver.parameters.num_workers == 3
    assert solver.parameters.max_deterministic_time == pytest.approx(0.001)
    assert solver.parameters.max_time_in_seconds == pytest.approx(0.05)


def _brute_force_usd(jobs, pools, tenants) -> float:
    """The optimum of a tiny round by trying every assignment (each job: one of its options or none)."""
    from itertools import product

    best = math.inf
    for picks in product(*[[None, *range(len(j.options))] for j in jobs]):
        choice = {j.job_id: k for j, k in zip(jobs, picks, strict=True)}
        try:
            check_solution(jobs, pools, tenants, choice)
        except AssertionError:
            continue
        best = min(best, objective_usd(jobs, choice))
    return best


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_the_lp_rounding_is_feasible_and_its_bound_is_below_the_optimum(inst) -> None:
    """The LP relaxation's rounding (the search's warm start) respects capacity, gangs and quotas, and its
    bound (the round's proven lower bound when the search is skipped) never exceeds the optimum by more
    than the model's rounding of each cost to a whole unit."""
    jobs, pools, tenants = inst
    jobs = jobs[:5]  # small enough to enumerate every assignment
    m = _build(jobs, pools, tenants, CFG.cost_scale)
    got = _lp_round(m, jobs, pools, tenants, CFG)
    if not any(j.options for j in jobs):
        assert got is None
        return
    assert got is not None
    choice, bound_units = got
    assert set(choice) == {j.job_id for j in jobs}
    check_solution(jobs, pools, tenants, choice)
    optimum = _brute_force_usd(jobs, pools, tenants)
    rounding_usd = len(jobs) / CFG.cost_scale  # each cost is rounded to a whole unit in the model
    assert bound_units / CFG.cost_scale <= optimum + rounding_usd
    assert optimum <= objective_usd(jobs, choice) + 1e-9
    sol = solve(jobs, pools, tenants, CFG)
    # optimal, up to the search's skip tolerance and the unit rounding
    assert optimum - 1e-9 <= sol.objective_usd <= optimum * (1 + CFG.skip_search_gap) + rounding_usd
    assert sol.lower_bound_usd is not None and sol.lower_bound_usd <= optimum + rounding_usd


def test_an_uncontended_round_is_solved_by_the_rounding_with_a_tight_bound() -> None:
    """Room for every job: the LP is integral, the rounding takes each job's cheapest option, its bound
    equals that objective, and the search is skipped ("lp" would be reported had the greedy been worse;
    here both agree, so the greedy's answer stands, proven by the bound)."""
    pools = {"a": cap("a", 8), "b": cap("b", 8)}
    jobs = [
        ProblemJob("x", "t", (cand("x", "a", 2, 3.0), cand("x", "b", 2, 5.0)), unplaced_usd=50, rank_usd=1),
        ProblemJob("y", "t", (cand("y", "b", 4, 2.0), cand("y", "a", 4, 9.0)), unplaced_usd=50, rank_usd=1),
    ]
    tenants = {"t": TenantLimit(None, None)}
    m = _build(jobs, pools, tenants, CFG.cost_scale)
    got = _lp_round(m, jobs, pools, tenants, CFG)
    assert got is not None
    choice, bound_units = got
    assert choice == {"x": 0, "y": 0}
    assert bound_units / CFG.cost_scale == pytest.approx(objective_usd(jobs, choice), abs=1e-3)
    sol = solve(jobs, pools, tenants, CFG)
    assert sol.choice == {"x": 0, "y": 0} and sol.wall_time_s == 0.0
    assert sol.status == "greedy" and sol.lower_bound_usd == pytest.approx(sol.objective_usd, abs=1e-3)


def test_the_rounding_takes_options_in_lp_order_and_skips_what_no_longer_fits() -> None:
    """One 8-device pool, two 8-device jobs: the LP puts the dearer-to-leave job first, the rounding
    takes it and leaves the other (its option no longer fits), and the bound is the LP's."""
    pools = {"a": cap("a", 8)}
    jobs = [
        ProblemJob("cheap", "t", (cand("cheap", "a", 8, 1.0),), unplaced_usd=10, rank_usd=1),
        ProblemJob("urgent", "t", (cand("urgent", "a", 8, 1.0),), unplaced_usd=100, rank_usd=1),
    ]
    tenants = {"t": TenantLimit(None, None)}
    m = _build(jobs, pools, tenants, CFG.cost_scale)
    got = _lp_round(m, jobs, pools, tenants, CFG)
    assert got is not None
    choice, bound_units = got
    assert choice == {"cheap": None, "urgent": 0}
    assert objective_usd(jobs, choice) == pytest.approx(_brute_force_usd(jobs, pools, tenants))
    assert bound_units / CFG.cost_scale <= objective_usd(jobs, choice) + 1e-6


def test_the_rounding_keeps_a_running_job_that_cannot_be_packed_where_it_runs() -> None:
    """Two running jobs both moving 6 devices onto a pool of 12 free devices on nodes of 8 and 4: the
    relaxation counts devices and moves both, the rounding gives the first the node of 8 and finds no
    node for the second, which then keeps its allocation (its stay option), never goes unplaced."""
    pools = {"p": PoolCapacity("p", 12, 1, 8), "q": PoolCapacity("q", 0, 0, 8)}
    jobs = [
        ProblemJob(r, "t", (cand(r, "p", 6, 1.0), stay(r, "q", 6, 9.0)), None, current_devices=6)
        for r in ("r1", "r2")
    ]
    tenants = {"t": TenantLimit(None, None)}
    got = _lp_round(_build(jobs, pools, tenants, CFG.cost_scale), jobs, pools, tenants, CFG)
    assert got is not None
    assert got[0] == {"r1": 0, "r2": 1}


def test_the_rounding_follows_the_relaxation_and_the_quota_edge_is_allowed() -> None:
    """An 8-device job (100 $ to leave), a 4-device job (90 $) on one 8-device node, a 2-device job (80 $)
    elsewhere. The relaxation takes the 4-device job whole and half the 8-device one (bound 52.5 $); the
    rounding takes options by LP value, so the 4-device and the 2-device jobs, and the 8-device job no
    longer fits (102 $: above the 92 $ optimum, which the search then finds). With a quota of exactly
    two jobs and six devices, the two jobs at the edge of both are allowed, and the bound is 102 $."""
    pools = {"a": cap("a", 8), "b": cap("b", 8)}
    jobs = [
        ProblemJob("big", "t", (cand("big", "a", 8, 1.0),), unplaced_usd=100, rank_usd=1),
        ProblemJob("mid", "t", (cand("mid", "a", 4, 1.0),), unplaced_usd=90, rank_usd=1),
        ProblemJob("small", "t", (cand("small", "b", 2, 1.0),), unplaced_usd=80, rank_usd=1),
    ]
    for limits, bound_usd in (
        (TenantLimit(None, None), 52.5),
        (TenantLimit(devices_left=6, jobs_left=2), 102.0),
    ):
        tenants = {"t": limits}
        got = _lp_round(_build(jobs, pools, tenants, CFG.cost_scale), jobs, pools, tenants, CFG)
        assert got is not None
        assert got[0] == {"big": None, "mid": 0, "small": 0}, limits
        assert got[1] / CFG.cost_scale == pytest.approx(bound_usd), limits
    sol = solve(jobs, pools, {"t": TenantLimit(None, None)}, CFG)
    assert sol.choice == {"big": 0, "mid": None, "small": 0} and sol.objective_usd == pytest.approx(92.0)


# --- when the search runs, and what the round reports when it does not ---------------------------------


def test_an_empty_round_spends_no_search_time() -> None:
    assert solve([], {}, {}, CFG).wall_time_s == 0.0
    assert solve([ProblemJob("a", "t", (), 7.5)], {}, {}, CFG).wall_time_s == 0.0


def test_a_round_with_no_feasible_answer_keeps_the_greedy_one_and_proves_nothing() -> None:
    """A running job without a stay option whose only move does not fit: the relaxation is infeasible
    (it must take exactly one option), so is the search; the greedy answer stands and no bound is known."""
    pools = {"p": PoolCapacity("p", 0, 0, 8), "q": cap("q", 8)}
    jobs = [
        ProblemJob("r", "t", (cand("r", "p", 4, 1.0),), None, current_devices=4),
        ProblemJob("w", "t", (cand("w", "q", 2, 3.0),), 50.0),
    ]
    sol = solve(jobs, pools, {}, CFG)
    assert sol.choice == {"r": None, "w": 0} == greedy(jobs, pools, {})
    assert sol.objective_usd == 3.0 and sol.status == "greedy"
    assert sol.lower_bound_usd is None


def test_a_rounding_better_than_the_greedy_pass_by_cents_is_taken_without_a_search() -> None:
    """The conflict of ``_conflict`` at a smaller scale: the greedy pass moves the running job ($1.00) and
    leaves the queued one out ($1.50), $2.50 in all; the rounding keeps it ($1.40) and places the queued one
    ($1.00), $2.40, which its bound proves: the rounding's answer is reported, no search is run."""
    pools = {"p": PoolCapacity("p", 4, 0, 8), "home": PoolCapacity("home", 0, 0, 8)}
    run = ProblemJob("r", "t", (cand("r", "p", 4, 1.0), stay("r", "home", 4, 1.4)), None, current_devices=4)
    jobs = [run, ProblemJob("q", "t", (cand("q", "p", 4, 1.0),), 1.5)]
    assert greedy(jobs, pools, {}) == {"r": 0, "q": None}
    sol = solve(jobs, pools, {}, CFG)
    assert sol.choice == {"r": 1, "q": 0}
    assert sol.objective_usd == pytest.approx(2.4) and sol.greedy_objective_usd == pytest.approx(2.5)
    assert sol.status == "lp" and sol.wall_time_s == 0.0


def test_the_search_is_skipped_when_the_bound_is_within_the_relative_gap() -> None:
    """The big/mid/small round: the greedy answer is $92 (the optimum), the LP bound $52.50, a gap of
    39.5 / 92 = 42.9 % of the answer. A tolerance of 43 % skips the search (the greedy answer, its bound
    the LP's); 42 % does not (the search proves the optimum)."""
    pools = {"a": cap("a", 8), "b": cap("b", 8)}
    jobs = [
        ProblemJob("big", "t", (cand("big", "a", 8, 1.0),), unplaced_usd=100, rank_usd=1),
        ProblemJob("mid", "t", (cand("mid", "a", 4, 1.0),), unplaced_usd=90, rank_usd=1),
        ProblemJob("small", "t", (cand("small", "b", 2, 1.0),), unplaced_usd=80, rank_usd=1),
    ]
    want = {"big": 0, "mid": None, "small": 0}
    skipped = solve(jobs, pools, {}, replace(CFG, skip_search_gap=0.43))
    assert skipped.choice == want and skipped.objective_usd == pytest.approx(92.0)
    assert skipped.status == "greedy" and skipped.wall_time_s == 0.0
    assert skipped.lower_bound_usd == pytest.approx(52.5)
    searched = solve(jobs, pools, {}, replace(CFG, skip_search_gap=0.42))
    assert searched.choice == want and searched.status == "optimal"
    assert searched.lower_bound_usd == pytest.approx(92.0, abs=1e-3)


def test_a_bound_that_meets_the_answer_skips_the_search_even_without_tolerance() -> None:
    pools = {"a": cap("a", 8), "b": cap("b", 8)}
    jobs = [
        ProblemJob("x", "t", (cand("x", "a", 2, 3.0), cand("x", "b", 2, 5.0)), unplaced_usd=50, rank_usd=1),
        ProblemJob("y", "t", (cand("y", "b", 4, 2.0), cand("y", "a", 4, 9.0)), unplaced_usd=50, rank_usd=1),
    ]
    sol = solve(jobs, pools, {}, replace(CFG, skip_search_gap=0.0))
    assert sol.choice == {"x": 0, "y": 0} and sol.objective_usd == 5.0
    assert sol.status == "greedy" and sol.wall_time_s == 0.0 and sol.lower_bound_usd == 5.0


def test_the_skip_tolerance_is_never_below_one_unit_of_the_objective() -> None:
    """A $0.0004 option rounds to 0 units of 1/1000 $, so the LP bound is $0 and the gap 0.4 units. The
    tolerance is ``skip_search_gap`` of the answer in units, but of at least 1 unit: 0.5 of a unit skips
    the search, 0.3 does not."""
    pools = {"p": cap("p", 8)}
    jobs = [ProblemJob("x", "t", (cand("x", "p", 1, 0.0004),), unplaced_usd=1.0)]
    assert CFG.cost_scale == 1000
    skipped = solve(jobs, pools, {}, replace(CFG, skip_search_gap=0.5))
    assert skipped.choice == {"x": 0} and skipped.status == "greedy" and skipped.wall_time_s == 0.0
    searched = solve(jobs, pools, {}, replace(CFG, skip_search_gap=0.3))
    assert searched.choice == {"x": 0} and searched.status == "optimal"


def test_the_rounds_time_limit_overrides_the_configured_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import trainyard.schedule.solver as solver_module

    limits: list[float] = []

    def recording(solver: cp_model.CpSolver, config: SchedulerConfig, limit_s: float) -> None:
        limits.append(limit_s)
        set_parameters(solver, config, limit_s)

    monkeypatch.setattr(solver_module, "set_parameters", recording)
    per5 = {"p": PoolCapacity("p", 10, 2, 5)}
    jobs = [
        ProblemJob(j, "t", (cand(j, "p", d, 1.0, per_node=5),), 100.0)
        for j, d in zip("abcd", (1, 2, 3, 4), strict=True)
    ]
    assert solve(jobs, per5, {}, replace(CFG, time_limit_s=0.3)).status == "optimal"
    assert solve(jobs, per5, {}, replace(CFG, time_limit_s=0.3), time_limit_s=0.7).status == "optimal"
    assert limits == [0.3, 0.7]


def test_a_queued_job_the_search_chose_but_no_node_holds_is_left_out() -> None:
    """3 + 4 + 3 devices on two 5-device nodes: all three fit in total (the search's answer) but not node
    by node. Packed largest first, the 4-device job and one 3-device job get nodes; the other, a queued job
    with no allocation to keep, is left out."""
    per5 = {"p": PoolCapacity("p", 10, 2, 5)}
    jobs = [
        ProblemJob(j, "t", (cand(j, "p", d, 1.0, per_node=5),), 100.0)
        for j, d in zip("ace", (3, 4, 3), strict=True)
    ]
    sol = solve(jobs, per5, {}, CFG)
    assert sol.choice == {"a": 0, "c": 0, "e": None}
    assert sol.objective_usd == 102.0 and sol.status == "feasible"


def test_a_running_job_that_shrinks_frees_more_quota_than_any_row_bound_limits() -> None:
    """A running job holding 200 devices can shrink to 1 ($1, staying costs $9): its tenant row counts
    1 - 200 = -199 devices, far below zero, which the search must allow. The greedy and LP passes shrink it
    but pack only three of the four queued jobs ($104); the search packs all four: $5."""
    pools = {"p": PoolCapacity("p", 10, 2, 5), "q": PoolCapacity("q", 5, 1, 5)}
    run = ProblemJob(
        "r", "t", (cand("r", "q", 1, 1.0, per_node=5), stay("r", "home", 200, 9.0)), None, current_devices=200
    )
    queued = [
        ProblemJob(j, "t", (cand(j, "p", d, 1.0, per_node=5),), 100.0)
        for j, d in zip("abcd", (1, 2, 3, 4), strict=True)
    ]
    tenants = {"t": TenantLimit(devices_left=10, jobs_left=None)}
    sol = solve([run, *queued], pools, tenants, CFG)
    assert sol.greedy_objective_usd == 104.0
    assert sol.choice == {"r": 0, "a": 0, "b": 0, "c": 0, "d": 0}
    assert sol.objective_usd == 5.0 and sol.status == "optimal"


def test_greedy_skips_an_option_that_breaks_a_limit_and_tries_the_next() -> None:
    pools = {"p": PoolCapacity("p", 4, 0, 8), "q": cap("q", 8)}
    # the cheaper option needs 8 devices, the tenant has 4 left: the 2-device one is taken
    quota = [ProblemJob("a", "t", (cand("a", "q", 8, 1.0), cand("a", "q", 2, 2.0)), 100.0)]
    assert greedy(quota, pools, {"t": TenantLimit(4, None)}) == {"a": 1}
    # exactly one device left is enough for a one-device job
    one = [ProblemJob(f"j{i}", "t", (cand(f"j{i}", "q", 1, 1.0),), 100.0) for i in range(2)]
    assert greedy(one, pools, {"t": TenantLimit(1, None)}) == {"j0": 0, "j1": None}
    # a 16-device gang finds no two whole nodes on p: the 4-device option on p is taken instead
    gang = [ProblemJob("g", "t", (cand("g", "p", 16, 1.0), cand("g", "p", 4, 2.0)), 100.0)]
    assert greedy(gang, pools, {}) == {"g": 1}
    # two gangs on one pool of four whole nodes: the second sees the two nodes the first left
    two = [ProblemJob(g, "t", (cand(g, "p", 16, 1.0),), 100.0) for g in ("g1", "g2")]
    assert greedy(two, {"p": PoolCapacity("p", 32, 4, 8)}, {}) == {"g1": 0, "g2": 0}
    assert greedy(two, {"p": PoolCapacity("p", 24, 3, 8)}, {}) == {"g1": 0, "g2": None}


def test_a_running_job_of_a_tenant_over_its_quota_keeps_its_allocation() -> None:
    """The tenant's quota was lowered below what it runs (devices left -2): the running job may not grow,
    and even its stay option (0 more devices) exceeds what is left, yet it keeps running where it is, in
    the greedy pass, the LP rounding and the round."""
    pools = {"p": cap("p", 8), "home": PoolCapacity("home", 0, 0, 8)}
    run = ProblemJob("r", "t", (cand("r", "p", 6, 1.0), stay("r", "home", 4, 9.0)), None, current_devices=4)
    tenants = {"t": TenantLimit(devices_left=-2, jobs_left=None)}
    assert greedy([run], pools, tenants) == {"r": 1}
    got = _lp_round(_build([run], pools, tenants, CFG.cost_scale), [run], pools, tenants, CFG)
    assert got is not None and got[0] == {"r": 1}
    assert solve([run], pools, tenants, CFG).choice == {"r": 1}


def test_the_rounding_leaves_a_running_job_without_stay_unplaced_when_it_cannot_be_packed() -> None:
    pools = {"p": PoolCapacity("p", 12, 1, 8)}
    jobs = [ProblemJob(r, "t", (cand(r, "p", 6, 1.0),), None, current_devices=6) for r in ("r1", "r2")]
    got = _lp_round(_build(jobs, pools, {}, CFG.cost_scale), jobs, pools, {}, CFG)
    assert got is not None and got[0] == {"r1": 0, "r2": None}


def test_the_rounding_goes_on_after_an_option_that_no_longer_fits_or_breaks_the_quota() -> None:
    """After an option it has to skip, the rounding still takes the later ones that fit."""
    # nodes of 8 and 4: A and B (6 devices each) both fit in total, B finds no node; C (4) takes the 4
    pools = {"p": PoolCapacity("p", 12, 1, 8)}
    jobs = [
        ProblemJob("A", "t", (cand("A", "p", 6, 1.0),), 100.0),
        ProblemJob("B", "t", (cand("B", "p", 6, 1.0),), 90.0),
        ProblemJob("C", "t", (cand("C", "p", 4, 1.0),), 50.0),
    ]
    got = _lp_round(_build(jobs, pools, {}, CFG.cost_scale), jobs, pools, {}, CFG)
    assert got is not None and got[0] == {"A": 0, "B": None, "C": 0}
    # ... and after another option of a job it has already placed (A's on a full pool, which comes before
    # C's in the LP order: both at 0, A's the dearer to leave out)
    full = {**pools, "full": cap("full", 0)}
    jobs[0] = ProblemJob("A", "t", (cand("A", "p", 6, 1.0), cand("A", "full", 2, 1.0)), 100.0)
    got = _lp_round(_build(jobs, full, {}, CFG.cost_scale), jobs, full, {}, CFG)
    assert got is not None and got[0] == {"A": 0, "B": None, "C": 0}
    # 6 devices left: A (4) whole, B (4) half in the relaxation; B breaks the quota, C (1) does not
    pools = {"q": cap("q", 64)}
    jobs = [
        ProblemJob("A", "t", (cand("A", "q", 4, 1.0),), 100.0),
        ProblemJob("B", "t", (cand("B", "q", 4, 1.0),), 90.0),
        ProblemJob("C", "t", (cand("C", "q", 1, 1.0),), 6.0),
    ]
    tenants = {"t": TenantLimit(devices_left=6, jobs_left=None)}
    got = _lp_round(_build(jobs, pools, tenants, CFG.cost_scale), jobs, pools, tenants, CFG)
    assert got is not None and got[0] == {"A": 0, "B": None, "C": 0}


def test_the_rounding_does_not_take_an_option_that_costs_what_waiting_does() -> None:
    pools = {"p": cap("p", 8)}
    jobs = [ProblemJob("x", "t", (cand("x", "p", 1, 5.0),), 5.0)]
    got = _lp_round(_build(jobs, pools, {}, CFG.cost_scale), jobs, pools, {}, CFG)
    assert got is not None and got[0] == {"x": None}


def test_a_job_that_costs_nothing_to_leave_out_is_not_placed_at_a_price() -> None:
    """Beside the four jobs only the search packs, a job whose waiting costs nothing ($0) and whose only
    option costs $0.50 stays out: $4 in all."""
    per5 = {"p": PoolCapacity("p", 10, 2, 5), "z": cap("z", 8)}
    jobs = [
        ProblemJob(j, "t", (cand(j, "p", d, 1.0, per_node=5),), 100.0)
        for j, d in zip("abcd", (1, 2, 3, 4), strict=True)
    ]
    jobs.append(ProblemJob("free", "t", (cand("free", "z", 1, 0.5),), 0.0))
    sol = solve(jobs, per5, {}, CFG)
    assert sol.choice == {"a": 0, "b": 0, "c": 0, "d": 0, "free": None}
    assert sol.objective_usd == 4.0 and sol.status == "optimal" and sol.wall_time_s > 0.0
    assert objective_usd(jobs, {"a": None, "b": 0, "c": 0, "d": 0, "free": None}) == 103.0


def test_the_model_counts_a_two_node_gangs_nodes() -> None:
    """18 free devices on nodes of 8 but no whole node: a 16-device gang (two nodes) fits the devices,
    not the nodes. The model knows it, so the bound is the answer (the 8-device job placed, the gang
    out) and no search is needed."""
    pools = {"p": PoolCapacity("p", 18, 0, 8)}
    jobs = [
        ProblemJob("gang", "t", (cand("gang", "p", 16, 1.0),), 1000.0),
        ProblemJob("s", "t", (cand("s", "p", 8, 1.0),), 500.0),
    ]
    sol = solve(jobs, pools, {}, CFG)
    assert sol.choice == {"gang": None, "s": 0} and sol.objective_usd == 1001.0
    assert sol.wall_time_s == 0.0 and sol.lower_bound_usd == pytest.approx(1001.0)


def test_the_search_keeps_a_groups_start_limit_exactly() -> None:
    """The four jobs only the search packs, as one group that may start four: all four start."""
    per5 = {"p": PoolCapacity("p", 10, 2, 5)}
    jobs = [
        ProblemJob(j, "t", (cand(j, "p", d, 1.0, per_node=5),), 100.0, group="g")
        for j, d in zip("abcd", (1, 2, 3, 4), strict=True)
    ]
    sol = solve(jobs, per5, {}, CFG, groups={"g": GroupLimit(starts_left=4)})
    assert sol.choice == {"a": 0, "b": 0, "c": 0, "d": 0} and sol.status == "optimal"
    three = solve(jobs, per5, {}, CFG, groups={"g": GroupLimit(starts_left=3)})
    assert sum(v is not None for v in three.choice.values()) == 3


def test_a_group_without_budget_starts_no_member_however_cheap() -> None:
    pools = {"p": cap("p", 8)}
    jobs = [ProblemJob("m", "t", (cand("m", "p", 1, 1e-6),), 100.0, group="g")]
    for units in (0, -5):
        sol = solve(jobs, pools, {}, CFG, groups={"g": GroupLimit(budget_units=units)})
        assert sol.choice == {"m": None} and sol.objective_usd == 100.0
    assert solve(jobs, pools, {}, CFG, groups={"g": GroupLimit(budget_units=1)}).choice == {"m": 0}


def test_a_repaired_search_answer_worse_than_the_rounding_is_not_taken() -> None:
    """3 + 4 + 3 devices on two 5-device nodes again. The rounding leaves out a ($1.50 to wait); the
    search places all three and its repair drops e ($1.80 to wait): 30 cents worse, so the rounding's
    answer stands."""
    per5 = {"p": PoolCapacity("p", 10, 2, 5)}
    jobs = [
        ProblemJob("a", "t", (cand("a", "p", 3, 1.0, per_node=5),), 1.5, rank_usd=1.0),
        ProblemJob("c", "t", (cand("c", "p", 4, 1.0, per_node=5),), 100.0, rank_usd=1.0),
        ProblemJob("e", "t", (cand("e", "p", 3, 1.0, per_node=5),), 1.8, rank_usd=2.0),
    ]
    sol = solve(jobs, per5, {}, CFG)
    assert sol.choice == {"a": None, "c": 0, "e": 0}
    assert sol.objective_usd == pytest.approx(3.5) and sol.status == "lp" and sol.wall_time_s > 0.0


def test_the_search_puts_a_group_on_the_pool_where_all_its_members_pack() -> None:
    """The four jobs only the search packs, as one group with options on two pools: all four on the
    cheaper one (a member on each pool needs a selector of each pool)."""
    per5 = {"q": PoolCapacity("q", 10, 2, 5), "p": PoolCapacity("p", 10, 2, 5)}
    jobs = [
        ProblemJob(j, "t", (cand(j, "q", d, 1.0, per_node=5), cand(j, "p", d, 2.0, per_node=5)), 100.0,
                   group="g")
        for j, d in zip("abcd", (1, 2, 3, 4), strict=True)
    ]  # fmt: skip
    sol = solve(jobs, per5, {}, CFG)
    assert sol.choice == {"a": 0, "b": 0, "c": 0, "d": 0} and sol.objective_usd == 4.0
    assert sol.status == "optimal"


def test_the_relaxation_of_a_groups_pool_choice_is_tight() -> None:
    """Each member is cheap on a pool of its own, the group must share one: the best is $11 either way.
    In the relaxation a member's share of a pool is at most that pool's selector, so splitting the
    selectors gains nothing: the bound is $11, which proves the greedy answer, and the search is skipped."""
    pools = {"p": cap("p", 8), "q": cap("q", 8)}
    jobs = [
        ProblemJob("m", "t", (cand("m", "p", 1, 1.0), cand("m", "q", 1, 10.0)), 100.0, group="g"),
        ProblemJob("n", "t", (cand("n", "q", 1, 1.0), cand("n", "p", 1, 10.0)), 100.0, group="g"),
    ]
    sol = solve(jobs, pools, {}, CFG)
    assert sol.objective_usd == 11.0 and sol.lower_bound_usd == pytest.approx(11.0)
    assert sol.status == "greedy" and sol.wall_time_s == 0.0
    # the selectors cost nothing: the relaxation's bound is the $11 to the unit
    got = _lp_round(_build(jobs, pools, {}, CFG.cost_scale), jobs, pools, {}, CFG)
    assert got is not None and got[1] == pytest.approx(11_000, abs=0.5)
    assert jobs[0].options[sol.choice["m"]].pool == jobs[1].options[sol.choice["n"]].pool


def test_the_relaxation_stops_at_its_iteration_cap_and_wall_clock() -> None:
    """Twelve jobs of 1 to 4 devices on three pools of 4-device nodes, more than presolve solves alone:
    capped at one simplex iteration, or at no wall time at all, the relaxation gives no rounding and no
    bound (the round goes on from the greedy answer)."""
    pools = {n: cap(n, f, 4) for n, f in (("p", 6), ("q", 5), ("r", 7))}
    jobs = [
        ProblemJob(f"j{i}", "t", tuple(sorted(
            (cand(f"j{i}", p, 1 + (i * 7 + k) % 4, 1.0 + (i * 5 + 3 * k) % 9, per_node=4)
             for k, p in enumerate(pools)), key=lambda c: c.objective_usd)), 10.0 + (i * 3) % 7)
        for i in range(12)
    ]  # fmt: skip
    m = _build(jobs, pools, {}, CFG.cost_scale)
    assert _lp_round(m, jobs, pools, {}, CFG) is not None
    assert _lp_round(m, jobs, pools, {}, replace(CFG, lp_iteration_limit=1)) is None
    assert _lp_round(m, jobs, pools, {}, replace(CFG, lp_wall_limit_s=0.0)) is None


def test_the_rounding_goes_on_after_an_option_a_quota_or_a_group_refuses() -> None:
    """Nodes of 8 and 4 again: A and B (6 devices each) fill the relaxation, B finds no node. D, the
    next in the LP order (at 0, dearer to leave out than C), may not start: its tenant's one job is A,
    or its group may start none. C (4) still takes the node of 4."""
    pools = {"p": PoolCapacity("p", 12, 1, 8)}

    def jobs(d_tenant: str, d_group: str | None) -> list[ProblemJob]:
        return [
            ProblemJob("A", "t", (cand("A", "p", 6, 1.0, tenant="t"),), 100.0),
            ProblemJob("B", "u", (cand("B", "p", 6, 1.0, tenant="u"),), 90.0),
            ProblemJob("D", d_tenant, (cand("D", "p", 6, 1.0, tenant=d_tenant),), 95.0, group=d_group),
            ProblemJob("C", "u", (cand("C", "p", 4, 1.0, tenant="u"),), 50.0),
        ]

    want = {"A": 0, "B": None, "D": None, "C": 0}
    quota = {"t": TenantLimit(devices_left=None, jobs_left=1)}
    js = jobs("t", None)
    got = _lp_round(_build(js, pools, quota, CFG.cost_scale), js, pools, quota, CFG)
    assert got is not None and got[0] == want
    closed = {"g": GroupLimit(starts_left=0)}
    js = jobs("u", "g")
    got = _lp_round(_build(js, pools, {}, CFG.cost_scale, closed), js, pools, {}, CFG, closed)
    assert got is not None and got[0] == want


def test_the_rounding_gives_a_two_node_gang_two_whole_nodes() -> None:
    pools = {"p": cap("p", 16)}
    jobs = [ProblemJob("g", "t", (cand("g", "p", 16, 1.0),), 100.0)]
    got = _lp_round(_build(jobs, pools, {}, CFG.cost_scale), jobs, pools, {}, CFG)
    assert got is not None and got[0] == {"g": 0}


def test_the_rounding_reads_the_relaxations_fractions() -> None:
    """An 8-device job (100 $ to leave) and a 3-device one (90 $) on one 8-device node: the relaxation
    takes the 3-device job whole and 5/8 of the other. The rounding takes the whole one first, so the
    8-device job no longer fits; read as whole numbers (5/8 as 1) the 8-device job, dearer to leave out,
    would come first instead."""
    pools = {"a": cap("a", 8)}
    jobs = [
        ProblemJob("big", "t", (cand("big", "a", 8, 1.0),), unplaced_usd=100, rank_usd=1),
        ProblemJob("mid", "t", (cand("mid", "a", 3, 1.0),), unplaced_usd=90, rank_usd=1),
    ]
    got = _lp_round(_build(jobs, pools, {}, CFG.cost_scale), jobs, pools, {}, CFG)
    assert got is not None
    assert got[0] == {"big": None, "mid": 0}
    # the bound: both left out, less the gains of the whole job and of 5/8 of the other
    assert got[1] / CFG.cost_scale == pytest.approx(100 + 90 - 99 * 5 / 8 - 89)


def test_the_search_starts_from_the_best_answer_so_far_as_a_complete_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The four jobs only the search packs, as a group with options on two pools, and a 5-device job
    that finds a whole node only on the dearer pool: CP-SAT is handed the better of the greedy and the
    rounded answers as a complete hint, every option and the group's pool selector set as that answer
    has them (for a group named "" too)."""
    hints: list[tuple[list[int], list[int]]] = []
    real = cp_model.CpSolver.solve

    def recording(self: cp_model.CpSolver, model: cp_model.CpModel, *args: object, **kw: object) -> object:
        hint = model.proto.solution_hint
        hints.append((list(hint.vars), list(hint.values)))
        return real(self, model, *args, **kw)

    monkeypatch.setattr(cp_model.CpSolver, "solve", recording)
    per5 = {"q": PoolCapacity("q", 10, 2, 5), "p": PoolCapacity("p", 10, 2, 5)}
    for group in ("g", ""):
        jobs = [
            ProblemJob(j, "t", (cand(j, "q", d, 1.0, per_node=5), cand(j, "p", d, 2.0, per_node=5)), 100.0,
                       group=group)
            for j, d in zip("abcd", (1, 2, 3, 4), strict=True)
        ]  # fmt: skip
        z = (cand("z", "q", 5, 1.0, per_node=5), cand("z", "p", 5, 2.0, per_node=5))
        jobs.append(ProblemJob("z", "t", z, 100.0))
        m = _build(jobs, per5, {}, CFG.cost_scale)
        g = greedy(jobs, per5, {})
        lp = _lp_round(m, jobs, per5, {}, CFG)
        assert lp is not None
        best = lp[0] if objective_usd(jobs, lp[0]) < objective_usd(jobs, g) - 1e-9 else g
        hints.clear()
        sol = solve(jobs, per5, {}, CFG)
        assert sol.status == "optimal" and sol.objective_usd < objective_usd(jobs, best)
        ((variables, values),) = hints
        want = [0] * len(m.coef)
        for job in jobs:
            idx = best[job.job_id]
            if idx is not None:
                want[m.first[job.job_id] + idx] = 1
                if job.group is not None:
                    want[m.selector[(job.group, job.options[idx].pool)]] = 1
        assert variables == list(range(len(m.coef))) and values == want, group
        # a selector is set, and an option past a job's first
        assert any(want[m.n_options :]) and any(i for i in best.values())


class _Relaxation:
    """A stand-in for HiGHS that answers the relaxation with given values (its noise, here)."""

    def __init__(self, x: list[float]) -> None:
        self.x, self.calls = x, 0

    def __call__(self, c, **kw):  # type: ignore[no-untyped-def]
        self.calls += 1
        return SimpleNamespace(status=0, x=np.asarray(self.x), fun=float(np.dot(c, self.x)))


def test_relaxation_values_a_millionth_apart_are_ties_broken_by_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """One node of 4 devices, two 4-device jobs: the rounding takes the larger LP value first, but values
    within its noise tolerance (1e-6) are ties, and then the cheaper option goes first."""
    import trainyard.schedule.solver as solver_module

    pools = {"p": cap("p", 4, 4)}
    jobs = [
        ProblemJob("A", "t", (cand("A", "p", 4, 2.0, per_node=4),), 10.0),
        ProblemJob("B", "t", (cand("B", "p", 4, 1.0, per_node=4),), 10.0),
    ]
    m = _build(jobs, pools, {}, CFG.cost_scale)
    for x, placed in (([0.5000004, 0.5], "B"), ([0.500002, 0.5], "A"), ([0.5, 0.5000004], "B")):
        fake = _Relaxation(x)
        monkeypatch.setattr(solver_module, "linprog", fake)
        got = _lp_round(m, jobs, pools, {}, CFG)
        assert fake.calls == 1 and got is not None
        assert {j for j, k in got[0].items() if k is not None} == {placed}, x


def test_the_relaxation_is_solved_with_presolve_and_its_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    import trainyard.schedule.solver as solver_module

    seen: list[dict[str, object]] = []
    real = solver_module.linprog

    def recording(*args, **kw):  # type: ignore[no-untyped-def]
        seen.append(kw["options"])
        return real(*args, **kw)

    monkeypatch.setattr(solver_module, "linprog", recording)
    pools = {"p": cap("p", 8)}
    jobs = [ProblemJob("A", "t", (cand("A", "p", 2, 1.0),), 10.0)]
    assert _lp_round(_build(jobs, pools, {}, CFG.cost_scale), jobs, pools, {}, CFG) is not None
    assert seen == [{"maxiter": CFG.lp_iteration_limit, "time_limit": CFG.lp_wall_limit_s, "presolve": True}]
