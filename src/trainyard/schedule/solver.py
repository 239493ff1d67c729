"""The placement optimisation: CP-SAT with a greedy warm start and a greedy fallback.

Problem (one round):

* every queued job picks at most one option (gang all-or-nothing: an option is the whole gang);
* every running job in the model picks exactly one option, one of which is "stay" (no new capacity);
* per pool: devices taken ≤ free devices, and nodes taken by multi-node options ≤ whole free nodes
  (a multi-node option takes whole nodes; a single-node option must fit inside one node);
* per tenant: devices ≤ quota left, concurrently running jobs ≤ quota left;
* objective (integer, ``cost_scale`` units per dollar): Σ chosen option cost + Σ over queued jobs left
  unplaced of (reference cost + waiting cost). The reference cost is what the job is expected to cost
  when it runs later on its cheapest structurally feasible option, so leaving a job out never looks
  free: the solver pays a premium now only when it is smaller than the waiting cost.

Determinism: one worker, a fixed seed and a *deterministic* time limit, so equal inputs give equal
answers regardless of machine load. A wall-clock cap backs it up.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from trainyard.schedule.types import Candidate, SchedulerConfig


@dataclass(frozen=True)
class ProblemJob:
    job_id: str
    tenant: str
    options: tuple[Candidate, ...]  # feasible and structurally able to fit now; cheapest objective first
    unplaced_usd: float | None  # reference + waiting cost if left out; None = must be placed (running job)
    rank_usd: float = 0.0  # greedy order: larger goes first (priority × urgency × waiting cost)
    current_devices: int = 0  # devices held now (running jobs), for the tenant device quota

    @property
    def must_place(self) -> bool:
        return self.unplaced_usd is None


@dataclass(frozen=True)
class PoolCapacity:
    name: str
    free_devices: int
    free_nodes: int  # whole free nodes (multi-node options need these)
    devices_per_node: int


@dataclass(frozen=True)
class TenantLimit:
    devices_left: int | None
    jobs_left: int | None


@dataclass(frozen=True)
class Solution:
    choice: Mapping[str, int | None]  # job id -> index into its options (None = unplaced)
    objective_usd: float
    greedy_objective_usd: float
    status: str  # "optimal" | "feasible" | "greedy" | "empty"
    wall_time_s: float


def _units(usd: float, scale: int) -> int:
    return round(usd * scale)


def _tenant_devices(job: ProblemJob, opt: Candidate) -> int:
    return opt.devices - job.current_devices


def _tenant_jobs(job: ProblemJob) -> int:
    return 0 if job.must_place else 1


def objective_usd(jobs: Sequence[ProblemJob], choice: Mapping[str, int | None]) -> float:
    total = 0.0
    for job in jobs:
        idx = choice.get(job.job_id)
        if idx is None:
            total += job.unplaced_usd or 0.0
        else:
            total += job.options[idx].objective_usd
    return total


def greedy(
    jobs: Sequence[ProblemJob],
    pools: Mapping[str, PoolCapacity],
    tenants: Mapping[str, TenantLimit],
) -> dict[str, int | None]:
    """Place jobs one at a time, most pressing first, each on its cheapest option that still fits.

    A queued job is left out when even its cheapest fitting option costs more than waiting.
    """
    free = {p.name: node_free_list(p) for p in pools.values()}
    t_dev = {t: lim.devices_left for t, lim in tenants.items()}
    t_jobs = {t: lim.jobs_left for t, lim in tenants.items()}
    order = sorted(jobs, key=lambda j: (not j.must_place, -j.rank_usd, len(j.options), j.job_id))
    choice: dict[str, int | None] = {}
    for job in order:
        choice[job.job_id] = None
        jl = t_jobs.get(job.tenant)
        if jl is not None and _tenant_jobs(job) > jl and not job.must_place:
            continue
        for idx, opt in enumerate(job.options):
            if job.unplaced_usd is not None and opt.objective_usd >= job.unplaced_usd:
                break  # options are sorted: waiting is cheaper than this and every later one
            slot = None if opt.is_stay else find_slot(free[opt.pool], opt, pools[opt.pool].devices_per_node)
            if not opt.is_stay and slot is None:
                continue
            dl = t_dev.get(job.tenant)
            if dl is not None and _tenant_devices(job, opt) > dl:
                continue
            choice[job.job_id] = idx
            if slot is not None:
                take_slot(free[opt.pool], opt, slot)
            if dl is not None:
                t_dev[job.tenant] = dl - _tenant_devices(job, opt)
            if jl is not None:
                t_jobs[job.tenant] = jl - _tenant_jobs(job)
            break
        if job.must_place and choice[job.job_id] is None:
            # a running job can always stay; its stay option is present by construction
            stays = [i for i, o in enumerate(job.options) if o.is_stay]
            choice[job.job_id] = stays[0] if stays else None
    return choice


def solve(
    jobs: Sequence[ProblemJob],
    pools: Mapping[str, PoolCapacity],
    tenants: Mapping[str, TenantLimit],
    config: SchedulerConfig,
    *,
    time_limit_s: float | None = None,
) -> Solution:
    """Solve one round; falls back to the greedy answer when CP-SAT finds nothing better in time."""
    limit = config.time_limit_s if time_limit_s is None else time_limit_s
    g_choice = greedy(jobs, pools, tenants)
    g_obj = objective_usd(jobs, g_choice)
    if not any(j.options for j in jobs):
        return Solution(g_choice, g_obj, g_obj, "empty", 0.0)
    scale = config.cost_scale

    model = cp_model.CpModel()
    xs: dict[tuple[str, int], cp_model.IntVar] = {}
    pool_dev: dict[str, list[tuple[int, cp_model.IntVar]]] = defaultdict(list)
    pool_nodes: dict[str, list[tuple[int, cp_model.IntVar]]] = defaultdict(list)
    ten_dev: dict[str, list[tuple[int, cp_model.IntVar]]] = defaultdict(list)
    ten_jobs: dict[str, list[cp_model.IntVar]] = defaultdict(list)
    obj_terms: list[tuple[int, cp_model.IntVar]] = []
    constant_units = 0
    for job in jobs:
        if not job.options:
            constant_units += _units(job.unplaced_usd or 0.0, scale)
            continue
        row = []
        base = 0 if job.must_place else _units(job.unplaced_usd or 0.0, scale)
        constant_units += base
        for idx, opt in enumerate(job.options):
            x = model.new_bool_var(f"x[{job.job_id}][{idx}]")
            xs[(job.job_id, idx)] = x
            row.append(x)
            coef = _units(opt.objective_usd, scale) - base
            if coef:
                obj_terms.append((coef, x))
            if not opt.is_stay:
                pool_dev[opt.pool].append((opt.capacity_devices, x))
                if opt.spans_nodes:
                    pool_nodes[opt.pool].append((opt.nodes, x))
            td = _tenant_devices(job, opt)
            if td:
                ten_dev[job.tenant].append((td, x))
            if _tenant_jobs(job):
                ten_jobs[job.tenant].append(x)
        if job.must_place:
            model.add_exactly_one(row)
        else:
            model.add_at_most_one(row)
    for name, terms in pool_dev.items():
        cap = pools[name]
        model.add(sum(c * x for c, x in terms) <= cap.free_devices)
        if pool_nodes.get(name):
            model.add(sum(c * x for c, x in pool_nodes[name]) <= cap.free_nodes)
    for tenant, lim in tenants.items():
        if lim.devices_left is not None and ten_dev.get(tenant):
            model.add(sum(c * x for c, x in ten_dev[tenant]) <= max(lim.devices_left, 0))
        if lim.jobs_left is not None and ten_jobs.get(tenant):
            model.add(sum(ten_jobs[tenant]) <= max(lim.jobs_left, 0))
    model.minimize(sum(c * x for c, x in obj_terms))
    for job in jobs:
        chosen = g_choice.get(job.job_id)
        for idx in range(len(job.options)):
            model.add_hint(xs[(job.job_id, idx)], 1 if chosen == idx else 0)

    solver = cp_model.CpSolver()
    params = solver.parameters
    params.num_workers = max(1, config.num_workers)
    params.random_seed = config.seed
    params.max_deterministic_time = max(limit, 0.001)
    params.max_time_in_seconds = max(limit * 4, 0.05)
    params.log_search_progress = False
    status = solver.solve(model)
    wall = float(solver.wall_time)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Solution(g_choice, g_obj, g_obj, "greedy", wall)
    choice: dict[str, int | None] = {}
    for job in jobs:
        choice[job.job_id] = None
        for idx in range(len(job.options)):
            if solver.boolean_value(xs[(job.job_id, idx)]):
                choice[job.job_id] = idx
                break
    choice = _repair_packing(jobs, pools, choice)
    obj = objective_usd(jobs, choice)
    if obj > g_obj + 1e-9:
        return Solution(g_choice, g_obj, g_obj, "greedy", wall)
    return Solution(choice, obj, g_obj, "optimal" if status == cp_model.OPTIMAL else "feasible", wall)


def _repair_packing(
    jobs: Sequence[ProblemJob], pools: Mapping[str, PoolCapacity], choice: dict[str, int | None]
) -> dict[str, int | None]:
    """Drop chosen options that cannot be given concrete nodes (a running job then stays)."""
    by_pool: dict[str, list[tuple[str, Candidate]]] = defaultdict(list)
    by_id = {j.job_id: j for j in jobs}
    for job_id, idx in choice.items():
        if idx is None:
            continue
        opt = by_id[job_id].options[idx]
        if not opt.is_stay:
            by_pool[opt.pool].append((job_id, opt))
    for name, chosen in by_pool.items():
        _, failed = pack(pools[name], chosen)
        for job_id in failed:
            stays = [i for i, o in enumerate(by_id[job_id].options) if o.is_stay]
            choice[job_id] = stays[0] if stays else None
    return choice


def whole_nodes(free_devices: int, devices_per_node: int) -> int:
    """Whole free nodes, assuming the pool's free devices are consolidated on as few nodes as possible."""
    return free_devices // devices_per_node if devices_per_node > 0 else 0


def nodes_needed(devices: int, devices_per_node: int) -> int:
    return max(1, math.ceil(devices / devices_per_node))


def node_free_list(cap: PoolCapacity) -> list[int]:
    """Free devices per node: the whole free nodes, then the partly used one (if any)."""
    n = cap.devices_per_node
    out = [n] * cap.free_nodes
    rest = cap.free_devices - cap.free_nodes * n
    if rest > 0:
        out.append(min(rest, n))
    return out


def find_slot(free: list[int], opt: Candidate, devices_per_node: int) -> list[int] | None:
    """Node indices an option would occupy: whole free nodes for a multi-node gang, else the tightest node."""
    if opt.spans_nodes:
        whole = [i for i, f in enumerate(free) if f == devices_per_node]
        return whole[: opt.nodes] if len(whole) >= opt.nodes else None
    best: int | None = None
    for i, f in enumerate(free):
        if f >= opt.capacity_devices and (best is None or f < free[best]):
            best = i
    return None if best is None else [best]


def take_slot(free: list[int], opt: Candidate, slot: list[int]) -> None:
    if opt.spans_nodes:
        for i in slot:
            free[i] = 0
    else:
        free[slot[0]] -= opt.capacity_devices


def pack(
    cap: PoolCapacity, options: Sequence[tuple[str, Candidate]]
) -> tuple[dict[str, list[int]], list[str]]:
    """Assign concrete nodes to the options chosen on one pool (multi-node first, then largest first).

    Returns (job id -> node indices, job ids that did not fit). The model's aggregate constraints make a
    failure rare (only sizes that do not divide the node size can fragment it).
    """
    free = node_free_list(cap)
    placed: dict[str, list[int]] = {}
    failed: list[str] = []
    order = sorted(options, key=lambda jo: (not jo[1].spans_nodes, -jo[1].capacity_devices, jo[0]))
    for job_id, opt in order:
        slot = find_slot(free, opt, cap.devices_per_node)
        if slot is None:
            failed.append(job_id)
            continue
        take_slot(free, opt, slot)
        placed[job_id] = slot
    return placed, failed
