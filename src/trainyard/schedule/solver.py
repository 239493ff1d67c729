"""The placement optimisation: CP-SAT with a greedy warm start and a greedy fallback.

Problem (one round):

* every queued job picks at most one option (gang all-or-nothing: an option is the whole gang);
* every running job in the model picks exactly one option, one of which is "stay" (no new capacity);
* per pool: devices taken ≤ free devices, and nodes taken by multi-node options ≤ whole free nodes
  (a multi-node option takes whole nodes; a single-node option must fit inside one node);
* per tenant: devices ≤ quota left, concurrently running jobs ≤ quota left;
* per group (a sweep's trials, ``ProblemJob.group``): every member started this round goes on one pool
  (a selector ``y[g, p]`` per pool of the group's options, ``Σ_p y[g, p] ≤ 1`` and, per member and pool,
  ``Σ x[member's options on p] ≤ y[g, p]``), at most ``starts_left`` members start, and the members
  started cost in all no more than ``budget_units`` (expected cost of each option rounded up to a
  millionth of a dollar, the budget left rounded down, so the integer row implies the dollar one);
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
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model
from scipy.optimize import linprog
from scipy.sparse import csr_matrix

from trainyard.schedule.types import Candidate, SchedulerConfig

# OR-Tools and SciPy (about 0.5 s of imports) load with the scheduler, not inside the first round: a
# control plane imports it at start-up, and its first round then costs what every cold round costs. The
# CLI imports command modules only when their command runs, so other commands do not pay for them.


@dataclass(frozen=True)
class ProblemJob:
    job_id: str
    tenant: str
    # feasible and structurally able to fit now; cheapest objective first (the greedy seeding pass also
    # takes wider, lazily made sequences)
    options: Sequence[Candidate]
    unplaced_usd: float | None  # reference + waiting cost if left out; None = must be placed (running job)
    rank_usd: float = 0.0  # greedy order: larger goes first (priority × urgency × waiting cost)
    current_devices: int = 0  # devices held now (running jobs), for the tenant device quota
    group: str | None = None  # the group it is scheduled with (queued jobs only): :class:`GroupLimit`

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
class GroupLimit:
    """What a group's members may take this round; ``None`` means unlimited. Members always share a pool."""

    starts_left: int | None = None
    budget_units: int | None = None  # in BUDGET_UNITS_PER_USD (see :func:`budget_left_units`)


#: The budget rows count dollars in millionths: exact to a micro-dollar, far inside int64 for any budget.
BUDGET_UNITS_PER_USD = 1_000_000


def cost_units(usd: float) -> int:
    """An option's expected cost in budget units, rounded up (so Σ units ≤ budget units ⇒ Σ $ ≤ budget $)."""
    return math.ceil(round(usd * BUDGET_UNITS_PER_USD, 3))


def budget_left_units(usd: float) -> int:
    """A budget left in budget units, rounded down (a negative budget is none at all)."""
    return max(0, math.floor(round(usd * BUDGET_UNITS_PER_USD, 3)))


class _Groups:
    """The group constraints as the greedy passes check them: the pool a group's members took, the starts
    and the budget it has left."""

    def __init__(self, groups: Mapping[str, GroupLimit] | None) -> None:
        groups = groups or {}
        self.pool: dict[str, str] = {}
        self.starts = {g: lim.starts_left for g, lim in groups.items() if lim.starts_left is not None}
        self.budget = {g: lim.budget_units for g, lim in groups.items() if lim.budget_units is not None}

    def closed(self, job: ProblemJob) -> bool:
        """No member of the job's group may start any more."""
        g = job.group
        return g is not None and self.starts.get(g, 1) < 1

    def allows(self, job: ProblemJob, opt: Candidate) -> bool:
        g = job.group
        if g is None or opt.is_stay:
            return True
        p = self.pool.get(g)
        if p is not None and opt.pool != p:
            return False
        if self.starts.get(g, 1) < 1:
            return False
        b = self.budget.get(g)
        return b is None or cost_units(opt.expected_cost_usd) <= b

    def take(self, job: ProblemJob, opt: Candidate) -> None:
        g = job.group
        if g is None or opt.is_stay:
            return
        self.pool[g] = opt.pool
        if g in self.starts:
            self.starts[g] -= 1
        if g in self.budget:
            self.budget[g] -= cost_units(opt.expected_cost_usd)


@dataclass(frozen=True)
class Solution:
    choice: Mapping[str, int | None]  # job id -> index into its options (None = unplaced)
    objective_usd: float
    greedy_objective_usd: float
    status: str  # "optimal" | "feasible" (CP-SAT) | "lp" (LP rounding) | "greedy" | "empty"
    wall_time_s: float  # CP-SAT's own wall time (the LP and the greedy come on top)
    lower_bound_usd: float | None  # a proven lower bound on the objective (LP or CP-SAT); None if unknown


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
    groups: Mapping[str, GroupLimit] | None = None,
) -> dict[str, int | None]:
    """Place jobs one at a time, most pressing first, each on its cheapest option that still fits.

    A queued job is left out when even its cheapest fitting option costs more than waiting. A group's
    first member placed picks the pool its later members must use.
    """
    grp = _Groups(groups)
    free = {p.name: node_free_list(p) for p in pools.values()}
    # quick bounds per pool (whole free nodes, largest free share of a node) to skip hopeless options fast
    whole = {name: fl.count(pools[name].devices_per_node) for name, fl in free.items()}
    biggest = {name: max(fl, default=0) for name, fl in free.items()}
    t_dev = {t: lim.devices_left for t, lim in tenants.items()}
    t_jobs = {t: lim.jobs_left for t, lim in tenants.items()}
    order = sorted(jobs, key=lambda j: (not j.must_place, -j.rank_usd, len(j.options), j.job_id))
    choice: dict[str, int | None] = {}
    for job in order:
        choice[job.job_id] = None
        tenant = job.tenant
        jl = t_jobs.get(tenant)
        dl = t_dev.get(tenant)
        if not job.must_place and ((jl is not None and jl < 1) or (dl is not None and dl < 1)):
            continue  # the tenant's quota is used up (every queued option needs a job slot and a device)
        if grp.closed(job):
            continue
        limit = job.unplaced_usd
        held = job.current_devices
        for idx, opt in enumerate(job.options):
            if limit is not None and opt.objective_usd >= limit:
                break  # options are sorted: waiting is cheaper than this and every later one
            if dl is not None and opt.devices - held > dl:
                continue
            if not grp.allows(job, opt):
                continue
            slot = None
            if not opt.is_stay:
                pool = opt.pool
                nodes = opt.nodes
                if nodes > 1:
                    if whole[pool] < nodes:
                        continue
                elif biggest[pool] < opt.capacity_devices:
                    continue
                per_node = pools[pool].devices_per_node
                fl = free[pool]
                slot = find_slot(fl, opt, per_node)
                if slot is None:
                    continue
                take_slot(fl, opt, slot)
                whole[pool] = fl.count(per_node)
                biggest[pool] = max(fl, default=0)
            choice[job.job_id] = idx
            grp.take(job, opt)
            if dl is not None:
                t_dev[tenant] = dl - (opt.devices - held)
            if jl is not None:
                t_jobs[tenant] = jl - _tenant_jobs(job)
            break
        if job.must_place and choice[job.job_id] is None:
            # a running job can always stay; its stay option is present by construction
            stays = [i for i, o in enumerate(job.options) if o.is_stay]
            choice[job.job_id] = stays[0] if stays else None
    return choice


@dataclass
class _Matrix:
    """The round's 0/1 program in index form, shared by the LP relaxation and the CP-SAT model.

    Variable k < ``n_options`` is option ``opt[k]`` of job ``job[k]``; ``coef[k]`` is its objective
    coefficient in integer units (option cost minus the job's unplaced cost); the variables after them are
    the groups' pool selectors (``selector[(group, pool)]``, objective 0); rows are ``Σ a·x ≤ bound``
    (capacity, quotas, groups) and one choice row per job (``= 1`` for running jobs, ``≤ 1`` for queued ones).
    """

    job: list[int] = field(default_factory=list)
    opt: list[int] = field(default_factory=list)
    coef: list[int] = field(default_factory=list)
    choice_rows: list[tuple[int, int, bool]] = field(default_factory=list)  # (first var, count, exactly one)
    rows: list[tuple[list[int], list[int], int]] = field(default_factory=list)
    constant_units: int = 0
    first: dict[str, int] = field(default_factory=dict)
    n_options: int = 0
    selector: dict[tuple[str, str], int] = field(default_factory=dict)


def _build(
    jobs: Sequence[ProblemJob],
    pools: Mapping[str, PoolCapacity],
    tenants: Mapping[str, TenantLimit],
    scale: int,
    groups: Mapping[str, GroupLimit] | None = None,
) -> _Matrix:
    m = _Matrix()
    # group -> its members' option variables, and per (group, member, pool) the member's variables there
    grp_vars: dict[str, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
    grp_pool: dict[str, dict[tuple[int, str], list[int]]] = defaultdict(dict)
    pool_dev: dict[str, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
    pool_nodes: dict[str, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
    ten_dev: dict[str, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
    ten_jobs: dict[str, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
    k = 0
    for j, job in enumerate(jobs):
        base = 0 if job.must_place else _units(job.unplaced_usd or 0.0, scale)
        m.constant_units += base
        if not job.options:
            continue
        m.first[job.job_id] = k
        counts_job = _tenant_jobs(job)
        for idx, opt in enumerate(job.options):
            m.job.append(j)
            m.opt.append(idx)
            m.coef.append(_units(opt.objective_usd, scale) - base)
            if not opt.is_stay:
                pd = pool_dev[opt.pool]
                pd[0].append(k)
                pd[1].append(opt.capacity_devices)
                if opt.nodes > 1:
                    pn = pool_nodes[opt.pool]
                    pn[0].append(k)
                    pn[1].append(opt.nodes)
            td = _tenant_devices(job, opt)
            if td:
                t = ten_dev[job.tenant]
                t[0].append(k)
                t[1].append(td)
            if counts_job:
                tj = ten_jobs[job.tenant]
                tj[0].append(k)
                tj[1].append(1)
            if job.group is not None and not opt.is_stay:
                gv = grp_vars[job.group]
                gv[0].append(k)
                gv[1].append(cost_units(opt.expected_cost_usd))
                grp_pool[job.group].setdefault((j, opt.pool), []).append(k)
            k += 1
        m.choice_rows.append((m.first[job.job_id], len(job.options), job.must_place))
    m.n_options = k
    for g in sorted(grp_vars):
        vs, units = grp_vars[g]
        glim = (groups or {}).get(g)
        if glim is not None and glim.starts_left is not None:
            m.rows.append((vs, [1] * len(vs), max(glim.starts_left, 0)))
        if glim is not None and glim.budget_units is not None:
            m.rows.append((vs, units, max(glim.budget_units, 0)))
        on = grp_pool[g]
        names = sorted({p for _, p in on})
        if len(names) < 2:
            continue  # every member's options are on one pool: nothing to share
        for p in names:
            m.selector[(g, p)] = k
            m.coef.append(0)
            k += 1
        m.rows.append(([m.selector[(g, p)] for p in names], [1] * len(names), 1))
        for (_, p), member in on.items():
            m.rows.append(([*member, m.selector[(g, p)]], [1] * len(member) + [-1], 0))
    for name, (vs, cs) in pool_dev.items():
        m.rows.append((vs, cs, pools[name].free_devices))
        if name in pool_nodes:
            m.rows.append((*pool_nodes[name], pools[name].free_nodes))
    for tenant, lim in tenants.items():
        if lim.devices_left is not None and tenant in ten_dev:
            m.rows.append((*ten_dev[tenant], max(lim.devices_left, 0)))
        if lim.jobs_left is not None and tenant in ten_jobs:
            m.rows.append((*ten_jobs[tenant], max(lim.jobs_left, 0)))
    return m


def _decode(m: _Matrix, jobs: Sequence[ProblemJob], values: Sequence[int]) -> dict[str, int | None]:
    choice: dict[str, int | None] = {job.job_id: None for job in jobs}
    for k, v in enumerate(values[: m.n_options]):
        if v:
            choice[jobs[m.job[k]].job_id] = m.opt[k]
    return choice


def _lp_round(
    m: _Matrix,
    jobs: Sequence[ProblemJob],
    pools: Mapping[str, PoolCapacity],
    tenants: Mapping[str, TenantLimit],
    config: SchedulerConfig,
    groups: Mapping[str, GroupLimit] | None = None,
) -> tuple[dict[str, int | None], float] | None:
    """LP relaxation (HiGHS) and a rounding: options taken in decreasing LP value, each if it still fits.

    The relaxation of this assignment-with-knapsacks program is nearly integral, so the rounding is
    usually within a fraction of a percent of the optimum. Returns (choice, LP lower bound in units).
    """
    n = len(m.coef)
    if n == 0:
        return None
    r_idx: list[int] = []
    c_idx: list[int] = []
    vals: list[int] = []
    b_ub: list[float] = []
    for vs, cs, bound in m.rows:
        r = len(b_ub)
        r_idx.extend([r] * len(vs))
        c_idx.extend(vs)
        vals.extend(cs)
        b_ub.append(float(bound))
    a_eq_rows: list[int] = []
    eq_cols: list[int] = []
    b_eq: list[float] = []
    for start, count, exact in m.choice_rows:
        if exact:
            a_eq_rows.extend([len(b_eq)] * count)
            eq_cols.extend(range(start, start + count))
            b_eq.append(1.0)
        else:
            r = len(b_ub)
            r_idx.extend([r] * count)
            c_idx.extend(range(start, start + count))
            vals.extend([1] * count)
            b_ub.append(1.0)
    a_ub = csr_matrix((np.asarray(vals, dtype=float), (r_idx, c_idx)), shape=(len(b_ub), n))
    a_eq = None
    if b_eq:
        a_eq = csr_matrix((np.ones(len(eq_cols)), (a_eq_rows, eq_cols)), shape=(len(b_eq), n))
    res = linprog(
        np.asarray(m.coef, dtype=float),
        A_ub=a_ub,
        b_ub=np.asarray(b_ub),
        A_eq=a_eq,
        b_eq=np.asarray(b_eq) if b_eq else None,
        bounds=(0.0, 1.0),
        method="highs",
        # an iteration cap keeps the answer independent of machine load; the wall clock is only a safety net
        options={
            "maxiter": config.lp_iteration_limit,
            "time_limit": config.lp_wall_limit_s,
            "presolve": True,
        },
    )
    if res.status != 0 or res.x is None:
        return None
    x = np.round(np.asarray(res.x), 6)
    coef = np.asarray(m.coef)
    n_opt = m.n_options
    x, coef = x[:n_opt], coef[:n_opt]  # the groups' selectors follow from the options taken
    order = np.lexsort((np.arange(n_opt), coef, -x))  # LP value desc, then cheaper, then stable
    chosen = [False] * n_opt
    grp = _Groups(groups)
    free = {p.name: node_free_list(p) for p in pools.values()}
    t_dev = {t: lim.devices_left for t, lim in tenants.items()}
    t_jobs = {t: lim.jobs_left for t, lim in tenants.items()}
    taken: set[int] = set()
    for k in order.tolist():
        j = m.job[k]
        job = jobs[j]
        if j in taken or (coef[k] >= 0 and not job.must_place):
            continue
        opt = job.options[m.opt[k]]
        jl = t_jobs.get(job.tenant)
        if jl is not None and _tenant_jobs(job) > jl:
            continue
        dl = t_dev.get(job.tenant)
        td = _tenant_devices(job, opt)
        if dl is not None and td > dl:
            continue
        if not grp.allows(job, opt):
            continue
        slot = None
        if not opt.is_stay:
            slot = find_slot(free[opt.pool], opt, pools[opt.pool].devices_per_node)
            if slot is None:
                continue
            take_slot(free[opt.pool], opt, slot)
        chosen[k] = True
        grp.take(job, opt)
        taken.add(j)
        if dl is not None:
            t_dev[job.tenant] = dl - td
        if jl is not None:
            t_jobs[job.tenant] = jl - _tenant_jobs(job)
    choice = _decode(m, jobs, chosen)
    for job in jobs:  # a running job left without a fitting move stays
        if job.must_place and choice[job.job_id] is None:
            stays = [i for i, o in enumerate(job.options) if o.is_stay]
            choice[job.job_id] = stays[0] if stays else None
    return choice, float(res.fun) + m.constant_units


def solve(
    jobs: Sequence[ProblemJob],
    pools: Mapping[str, PoolCapacity],
    tenants: Mapping[str, TenantLimit],
    config: SchedulerConfig,
    *,
    time_limit_s: float | None = None,
    groups: Mapping[str, GroupLimit] | None = None,
) -> Solution:
    """Solve one round.

    Greedy (fallback) → LP relaxation + rounding (warm start, lower bound) → CP-SAT from the best of
    the two as a complete hint; the best solution found wins. ``time_limit_s`` is CP-SAT's deterministic
    limit; the LP stops at ``lp_iteration_limit`` simplex iterations.
    """
    limit = config.time_limit_s if time_limit_s is None else time_limit_s
    g_choice = greedy(jobs, pools, tenants, groups)
    g_obj = objective_usd(jobs, g_choice)
    if not any(j.options for j in jobs):
        return Solution(g_choice, g_obj, g_obj, "empty", 0.0, g_obj)
    scale = config.cost_scale
    m = _build(jobs, pools, tenants, scale, groups)

    best_choice, best_obj, best_status = g_choice, g_obj, "greedy"
    bound_usd = -math.inf
    lp = _lp_round(m, jobs, pools, tenants, config, groups)
    if lp is not None:
        lp_choice, lp_bound_units = lp
        bound_usd = lp_bound_units / scale
        lp_obj = objective_usd(jobs, lp_choice)
        if lp_obj < best_obj - 1e-9:
            best_choice, best_obj, best_status = lp_choice, lp_obj, "lp"

    gap_units = (best_obj - bound_usd) * scale
    if bound_usd > -math.inf and gap_units <= config.skip_search_gap * max(abs(best_obj) * scale, 1.0):
        # the LP bound proves the rounding within the tolerance: no search needed
        return Solution(best_choice, best_obj, g_obj, best_status, 0.0, min(bound_usd, best_obj))

    model = cp_model.CpModel()
    proto = model.proto
    for start, count, exact in m.choice_rows:
        c = proto.constraints.add()
        (c.exactly_one if exact else c.at_most_one).literals.extend(range(start, start + count))
    for _ in range(len(m.coef)):
        proto.variables.add().domain.extend((0, 1))
    for vs, cs, bound in m.rows:
        c = proto.constraints.add()
        c.linear.vars.extend(vs)
        c.linear.coeffs.extend(cs)
        c.linear.domain.extend((-(2**62), bound))
    nz = [k for k, v in enumerate(m.coef) if v]
    proto.objective.vars.extend(nz)
    proto.objective.coeffs.extend([m.coef[k] for k in nz])
    hint = [0] * len(m.coef)
    for job in jobs:
        idx = best_choice.get(job.job_id)
        if idx is not None and job.job_id in m.first:
            hint[m.first[job.job_id] + idx] = 1
            sel = m.selector.get((job.group or "", job.options[idx].pool))
            if job.group is not None and sel is not None:
                hint[sel] = 1
    proto.solution_hint.vars.extend(range(len(m.coef)))
    proto.solution_hint.values.extend(hint)

    solver = cp_model.CpSolver()
    set_parameters(solver, config, limit)
    status = solver.solve(model)
    wall = float(solver.wall_time)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        bound_usd = max(bound_usd, (solver.best_objective_bound + m.constant_units) / scale)
        choice = _repair_packing(jobs, pools, _decode(m, jobs, list(solver.response_proto.solution)))
        obj = objective_usd(jobs, choice)
        if obj <= best_obj + 1e-9:
            proven = (
                status == cp_model.OPTIMAL
                and obj <= (solver.objective_value + m.constant_units + len(jobs)) / scale  # unit rounding
            )
            best_choice, best_obj = choice, obj
            best_status = "optimal" if proven else "feasible"
    lower = None if bound_usd == -math.inf else min(bound_usd, best_obj)
    return Solution(best_choice, best_obj, g_obj, best_status, wall, lower)


def set_parameters(solver: cp_model.CpSolver, config: SchedulerConfig, limit_s: float) -> None:
    """One worker, fixed seed, deterministic time limit (wall-clock cap as a safety net), light presolve."""
    params = solver.parameters
    params.num_workers = max(1, config.num_workers)
    params.random_seed = config.seed
    params.max_deterministic_time = max(limit_s, 0.001)
    params.max_time_in_seconds = max(limit_s * config.wall_limit_factor, 0.05)
    params.cp_model_probing_level = 0
    params.symmetry_level = 0
    params.log_search_progress = False


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
