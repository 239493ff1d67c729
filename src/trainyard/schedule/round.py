"""One scheduling round: candidates → optimisation → placements with explanations.

``schedule_round`` is the single entry point the control plane calls each round (and the CLI's
``trainyard schedule`` runs once). It is pure: the clock is the ``now_s`` argument.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from trainyard.catalog.pools import Pool
from trainyard.schedule.candidates import (
    _PRICE_FIELDS,
    CandidateCache,
    CountGroups,
    candidates_for,
    capacity_reason,
    count_groups,
    device_counts,
    eligibility,
    fits_now,
    pool_price_key,
    prefetch_predictions_many,
    price_option,
    screen_key,
    to_candidate,
)
from trainyard.schedule.gcpause import gc_paused
from trainyard.schedule.grid import CandidateGrid, Rows, pool_markets, spec_grid
from trainyard.schedule.migration import migration_cost, uniform_progress, worth_moving
from trainyard.schedule.solver import (
    BUDGET_UNITS_PER_USD,
    GroupLimit,
    PoolCapacity,
    ProblemJob,
    Solution,
    TenantLimit,
    budget_left_units,
    cost_units,
    greedy,
    solve,
    whole_nodes,
)
from trainyard.schedule.types import (
    Alternative,
    Candidate,
    JobGroup,
    Placement,
    QueuedJob,
    RoundResult,
    RunningJob,
    SchedulerConfig,
    Unplaced,
)
from trainyard.spec.models import Minimize


def priority_weight(priority: int) -> float:
    return float(2 ** max(-3, min(6, priority)))


def _fmt_usd(usd: float) -> str:
    return f"${usd:,.2f}" if usd >= 0.995 else f"${usd:.4f}".rstrip("0").rstrip(".")


def _fmt_dur(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _label(c: Candidate) -> str:
    return f"{c.devices} × {c.accelerator} {c.market} on {c.pool}"


def _sort_key(c: Candidate) -> tuple[float, float, str, int]:
    return (c.objective_usd, c.expected_hours_p90, c.pool, c.devices)


def prune(
    options: Sequence[Candidate], config: SchedulerConfig, limit: int | None = None
) -> tuple[Candidate, ...]:
    """Keep the cheapest options: ``max_options_per_pool`` per pool, ``max_options_per_job`` in all.

    ``options`` must be sorted cheapest first (by ``_sort_key``).
    """
    kept: list[Candidate] = []
    per_pool: dict[str, int] = defaultdict(int)
    for c in options:
        if per_pool[c.pool] >= config.max_options_per_pool:
            continue
        kept.append(c)
        per_pool[c.pool] += 1
        if len(kept) >= (config.max_options_per_job if limit is None else limit):
            break
    return tuple(kept)


def waiting_cost_usd(
    *,
    priority: int,
    reference_usd: float,
    queued_s: float,
    deadline_abs_s: float | None,
    needed_s: float,
    now_s: float,
    config: SchedulerConfig,
) -> float:
    """Dollars we charge the objective for leaving a job queued one more round.

    Grows with time in the queue and with deadline urgency (needed time over time left), scaled by priority.
    """
    urgency = 1.0
    if deadline_abs_s is not None:
        left_s = max(deadline_abs_s - now_s, 1.0)
        ratio = min(needed_s / left_s, 1.0)
        urgency = min(config.max_urgency, 1.0 + config.deadline_urgency * ratio / (1.0 - ratio + 0.05))
    growth = 1.0 + max(queued_s, 0.0) / 3600.0 / config.wait_growth_h
    base = config.wait_base_usd + config.wait_cost_share * reference_usd
    return priority_weight(priority) * urgency * base * growth


def _objective_for_job(c: Candidate, minimize: Minimize, config: SchedulerConfig) -> Candidate:
    if minimize == Minimize.TIME:
        return replace(c, objective_usd=c.objective_usd + config.time_value_usd_per_hour * c.expected_hours)
    return c


def _infeasible_reason(cands: Sequence[Candidate], pools: Sequence[Pool]) -> str:
    if not pools:
        return "no pools to run on"
    if not cands:
        return "no pool offers a device count this job can use"
    per_pool: dict[str, Candidate] = {}
    for c in cands:
        # a pool's most generous option (most devices) carries the most telling reason
        if c.pool not in per_pool or c.devices > per_pool[c.pool].devices:
            per_pool[c.pool] = c
    parts = [f"{name}: {c.reasons[0]}" for name, c in per_pool.items() if c.reasons][:3]
    more = len(per_pool) - len(parts)
    tail = f" (+{more} more pools)" if more > 0 else ""
    return f"no feasible option on any of {len(per_pool)} pools — " + "; ".join(parts) + tail


def _cost_key(c: Candidate) -> tuple[float, float, str, int]:
    return (c.expected_cost_usd, c.expected_hours, c.pool, c.devices)


def _alternative(c: Candidate) -> Alternative:
    return Alternative(c.pool, c.devices, c.market, c.expected_cost_usd, c.expected_hours)


def _alternatives(chosen: Candidate, by_cost: Sequence[Candidate]) -> tuple[Alternative, ...]:
    """The two cheapest other feasible options (``by_cost`` is sorted by expected cost)."""
    out: list[Alternative] = []
    for c in by_cost:
        if (c.pool, c.devices) == (chosen.pool, chosen.devices):
            continue
        out.append(_alternative(c))
        if len(out) == 2:
            break
    return tuple(out)


def _placement(
    pj: ProblemJob,
    chosen: Candidate,
    reason: str,
    alternatives: tuple[Alternative, ...],
    *,
    from_pool: str | None = None,
) -> Placement:
    """``pj`` placed on ``chosen``: a new start, or with ``from_pool`` a running job's migration."""
    return Placement(
        job_id=pj.job_id,
        tenant=pj.tenant,
        pool=chosen.pool,
        accelerator=chosen.accelerator,
        devices=chosen.devices,
        nodes=chosen.nodes,
        market=chosen.market,
        expected_cost_usd=chosen.expected_cost_usd,
        expected_hours=chosen.expected_hours,
        checkpoint_interval_s=chosen.checkpoint_interval_s,
        reason=reason,
        alternatives=alternatives,
        migration=from_pool is not None,
        from_pool=from_pool,
    )


def _placement_reason(
    chosen: Candidate,
    fitting: Sequence[Candidate],
    feasible: Sequence[Candidate],
    by_cost: Sequence[Candidate],
    pools: Mapping[str, Pool],
) -> str:
    ranked = feasible  # sorted by objective
    head = (
        f"{_label(chosen)}: {_fmt_usd(chosen.expected_cost_usd)}, ~{_fmt_dur(chosen.expected_hours * 3600)}"
    )
    if chosen.market == "reserved":
        why = "reserved capacity (already paid for) fits it"
    elif ranked and (ranked[0].pool, ranked[0].devices) == (chosen.pool, chosen.devices):
        why = (
            "the only feasible option"
            if len(feasible) == 1
            else f"cheapest of {len(feasible)} feasible options"
        )
    elif ranked and not fits_now(ranked[0], pools[ranked[0].pool]):
        why = f"cheaper {_label(ranked[0])} is full ({capacity_reason(ranked[0], pools[ranked[0].pool])})"
    elif fitting and (fitting[0].pool, fitting[0].devices) != (chosen.pool, chosen.devices):
        why = "cheaper options taken by higher-value jobs this round"
    else:
        why = "best trade of cost and time"
    extra = ""
    if chosen.market == "spot" and chosen.checkpoint_interval_s > 0:
        extra = f"; checkpoint every {_fmt_dur(chosen.checkpoint_interval_s)}"
    alts = _alternatives(chosen, by_cost)
    alt = ""
    if alts:
        alt = "; next: " + ", ".join(f"{a.devices} × {a.pool} {_fmt_usd(a.expected_cost_usd)}" for a in alts)
    return f"{head} — {why}{extra}{alt}"


@dataclass(frozen=True)
class _Static:
    """One distinct spec's priced candidates, memoised across rounds (``CandidateCache.views``): they depend
    on the pools' prices and shapes, not on their free capacity nor on the clock."""

    grid: CandidateGrid
    order: np.ndarray  # feasible rows, sorted by ``_sort_key``
    by_cost: np.ndarray  # feasible rows, sorted by ``_cost_key``
    fastest: float  # the fastest feasible option's pessimistic hours
    # per row of ``order``: whether another row dominates it, and the earliest finish of those that do
    # (:func:`dominators`, :func:`pareto_rows`)
    has_dominator: np.ndarray
    dominator_finish_s: np.ndarray


@dataclass(frozen=True)
class _SpecView:
    """One distinct spec's candidates this round (shared by every queued job with that spec)."""

    static: _Static
    fits: np.ndarray  # per grid row: fits the pools' free capacity now
    feasible: Rows  # sorted by objective
    fitting: Rows  # feasible and fitting the pools' free capacity now, sorted
    pruned: tuple[Candidate, ...]
    by_cost: Rows  # feasible, sorted by expected cost (alternatives in explanations)
    min_p90_h: float  # the fastest feasible option's pessimistic hours
    seed: Sequence[Candidate]  # the wider option list the greedy seeding pass looks at

    @property
    def cands(self) -> list[Candidate]:
        return self.static.grid.candidates()


def dominators(grid: CandidateGrid, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every row of ``order`` (feasible rows sorted by ``_sort_key``): whether an earlier row of the same
    pool dominates it, and the earliest p90 finish among the rows that do. Row ``i`` dominates row ``j`` when
    it sorts first (so it costs the objective no more) and takes no more of anything the round's constraints
    count: devices (tenant quotas), the pool capacity it consumes, whole nodes."""
    n = len(order)
    has = np.zeros(n, dtype=bool)
    first = np.full(n, math.inf)
    if n < 2:
        return has, first
    pool = grid.pool[order]
    dev = grid.devices[order]
    cap = grid.capacity[order]
    nodes = grid.nodes[order]
    span = np.where(nodes > 1, nodes, 0)  # whole nodes a multi-node option takes (single-node: none)
    fin = grid.finish[order]
    # rows grouped by pool, each group in order: compare every row with the ones k places before it
    by_pool = np.argsort(pool, kind="stable")
    grouped = pool[by_pool]
    for k in range(1, n):
        i, j = by_pool[:-k], by_pool[k:]
        same = grouped[:-k] == grouped[k:]
        if not same.any():
            break
        hit = same & (dev[i] <= dev[j]) & (cap[i] <= cap[j]) & (span[i] <= span[j])
        if hit.any():
            has[j[hit]] = True
            np.minimum.at(first, j[hit], fin[i[hit]])
    return has, first


def pareto_rows(static: _Static, left_s: float | None, rows_ok: np.ndarray | None = None) -> np.ndarray:
    """The rows of ``static.order`` worth a place in the model for a job with ``left_s`` seconds to its
    deadline (None: no deadline; only rows finishing by it are options then), among those ``rows_ok`` (a mask
    over the grid's rows) allows: the rows no option of the same pool that also finishes in time dominates.

    Whatever the free capacity or a quota, a dominated option can be swapped for the one that dominates it
    without breaking a constraint or raising the objective, and the greedy passes, which try options in
    order, reach the dominating one first: dropping dominated options before the solver leaves the optimum,
    and the greedy's pick, as they were (a property test checks the optimum). Pareto in (objective, finish
    time): a dominating option that misses the deadline does not prune."""
    order, has, fin = static.order, static.has_dominator, static.dominator_finish_s
    keep = ~has if left_s is None else ~has | (fin > left_s)
    if left_s is not None:
        keep &= static.grid.finish[order] <= left_s
    if rows_ok is not None:
        keep &= rows_ok[order]
    return order[keep]


def _static(
    cands_or_grid: Any, pools: Sequence[Pool], name_rank: np.ndarray, markets: Sequence[str]
) -> _Static:
    grid = (
        cands_or_grid
        if isinstance(cands_or_grid, CandidateGrid)
        else CandidateGrid.of(cands_or_grid, pools, markets)
    )
    f = np.flatnonzero(grid.feasible)
    rank = name_rank[grid.pool[f]]
    dev = grid.devices[f]
    order = f[np.lexsort((dev, rank, grid.p90[f], grid.objective[f]))]
    by_cost = f[np.lexsort((dev, rank, grid.hours[f], grid.cost[f]))]
    fastest = float(grid.p90[f].min()) if f.size else 0.0
    return _Static(grid, order, by_cost, fastest, *dominators(grid, order))


def _spec_view(
    qj: QueuedJob,
    pools: Sequence[Pool],
    rnd: _RoundPools,
    pools_key: tuple[Any, ...],
    cfg: SchedulerConfig,
    cache: CandidateCache,
    screened: Mapping[str, list[tuple[Pool, list[int], str]]] | None = None,
) -> _SpecView:
    """Candidates of one spec: the priced part is memoised across rounds (it depends on the pools' prices
    and shapes, not on their free capacity nor on the clock); what fits now is recomputed every round.
    ``screened``: pools' device counts and eligibility per spec key, as ``_prefetch_queue`` found them."""
    progress = queued_progress(qj)
    skey = _view_key(qj, pools_key, cfg, cache)
    static = cache.views.get(skey)
    if static is None:
        fkey = _family_key(qj, rnd, cfg, cache)
        if cfg.vectorised_pricing:
            pre = None if screened is None else screened.get(cache.key(qj.spec))
            # the same pools but for a few prices (a price moved since the spec was priced): only the rows
            # of the pools whose price moved are priced again
            family = cache.views.get(fkey)
            changed = None if family is None else _moved(family[0], rnd)
            if family is not None and changed is not None:
                sub = spec_grid(
                    qj.spec, [pools[i] for i in changed], cfg, cache, progress, prefetched=True,
                    screened=None if pre is None else [pre[i] for i in changed],
                    markets=[rnd.markets[i] for i in changed],
                )  # fmt: skip
                src: Any = family[1].grid.with_pools_repriced(pools, changed, sub)
            else:
                src = spec_grid(
                    qj.spec, pools, cfg, cache, progress, prefetched=True, screened=pre, markets=rnd.markets
                )
        else:
            src = [
                _objective_for_job(c, qj.spec.objective.minimize, cfg)
                for c in candidates_for(
                    job_id="",
                    tenant="",
                    spec=qj.spec,
                    pools=pools,
                    now_s=0.0,  # finish_s then holds the p90 duration; deadlines are checked per job below
                    deadline_abs_s=None,
                    config=cfg,
                    cache=cache,
                    elapsed_fraction=progress,
                )
            ]
        static = _static(src, pools, rnd.name_rank, rnd.markets)
        cache.views[skey] = static
        if cfg.vectorised_pricing:
            cache.views[fkey] = (rnd.prices, static)
    grid = static.grid
    fits = rnd.fits(grid)
    feasible = static.order
    fitting = feasible[fits[feasible]]
    useful_fitting = pareto_rows(static, None, fits) if cfg.pareto_pruning else fitting
    return _SpecView(
        static,
        fits,
        Rows(grid, feasible.tolist()),
        Rows(grid, fitting.tolist()),
        _prune_rows(grid, useful_fitting, cfg),
        Rows(grid, static.by_cost.tolist()),
        static.fastest,
        _seed_rows(grid, useful_fitting, cfg),
    )


@dataclass(frozen=True)
class _RoundPools:
    """What the round's views read of its pools: the free room per pool, the pools' rank by name (the
    candidates' tie-break) and their markets."""

    whole: np.ndarray  # whole free nodes per pool
    single: np.ndarray  # largest single-node gang that fits now per pool
    name_rank: np.ndarray
    markets: list[str]
    prices: tuple[float | None, ...]  # each pool's own price per device-hour
    shape_token: int  # every priced field of the pools but their own prices (``CandidateCache.pools_token``)
    moved: dict[int, tuple[Any, list[int] | None]] = field(default_factory=dict)  # ``_moved``'s memo

    @classmethod
    def of(cls, pools: Sequence[Pool], cache: CandidateCache) -> _RoundPools:
        room = [free_room(p) for p in pools]
        names = [p.name for p in pools]
        _, rank = np.unique(np.asarray(names, dtype=object), return_inverse=True)
        keys = [cache.pool_key(p) for p in pools]
        return cls(
            np.asarray([r[0] for r in room], dtype=np.int64),
            np.asarray([r[1] for r in room], dtype=np.int64),
            np.asarray(rank, dtype=np.int64).reshape(-1),
            pool_markets(pools, cache),
            tuple(k[_PRICE_AT] for k in keys),
            cache.pools_token(("but prices", *(k[:_PRICE_AT] + k[_PRICE_AT + 1 :] for k in keys))),
        )

    def fits(self, grid: CandidateGrid) -> np.ndarray:
        """``fits_now`` of every row of ``grid``."""
        p = grid.pool
        return np.where(grid.nodes > 1, grid.nodes <= self.whole[p], grid.devices <= self.single[p])


_PRICE_AT = _PRICE_FIELDS.index("price_usd_per_device_hour")


def _prune_rows(
    grid: CandidateGrid, rows: np.ndarray, cfg: SchedulerConfig, limit: int | None = None
) -> tuple[Candidate, ...]:
    """:func:`prune` of the grid's ``rows`` (sorted cheapest first)."""
    cap = cfg.max_options_per_job if limit is None else limit
    per_pool_max = cfg.max_options_per_pool
    kept: list[int] = []
    per_pool: dict[int, int] = defaultdict(int)
    pools = grid.pool
    for k in rows.tolist():
        p = int(pools[k])
        if per_pool[p] >= per_pool_max:
            continue
        kept.append(k)
        per_pool[p] += 1
        if len(kept) >= cap:
            break
    return tuple(grid.candidate(k) for k in kept)


def _seed_rows(grid: CandidateGrid, rows: np.ndarray, cfg: SchedulerConfig) -> Sequence[Candidate]:
    if cfg.seed_options_per_job is None:
        return Rows(grid, rows.tolist())
    return _prune_rows(grid, rows, cfg, cfg.seed_options_per_job)


def _view_key(
    qj: QueuedJob, pools_key: tuple[Any, ...], cfg: SchedulerConfig, cache: CandidateCache
) -> tuple[Any, ...]:
    """What a spec's memoised candidate list depends on (``CandidateCache.views``)."""
    return (cache.key(qj.spec), qj.spec.objective.minimize, queued_progress(qj), pools_key,
            cfg.reserved_cost_factor, cfg.time_value_usd_per_hour, cfg.vectorised_pricing)  # fmt: skip


def _family_key(
    qj: QueuedJob, rnd: _RoundPools, cfg: SchedulerConfig, cache: CandidateCache
) -> tuple[Any, ...]:
    """What a spec's memoised candidate list depends on but the pools' prices: the list last priced for it
    on pools equal in all else, with the prices it was priced at, is kept under this key."""
    return ("family", cache.key(qj.spec), qj.spec.objective.minimize, queued_progress(qj), rnd.shape_token,
            cfg.reserved_cost_factor, cfg.time_value_usd_per_hour)  # fmt: skip


#: A spec's rows are priced again pool by pool when at most this share of the pools' prices moved.
REPRICE_MAX_SHARE = 0.25


def _moved(before: tuple[Any, ...], rnd: _RoundPools) -> list[int] | None:
    """The pools whose price moved since ``before`` (the prices a spec was priced at), or None when too many
    did (pricing everything again is then as cheap); memoised in the round per ``before``."""
    hit = rnd.moved.get(id(before))
    if hit is not None and hit[0] is before:
        return hit[1]
    now = rnd.prices
    changed: list[int] | None = [i for i, (a, b) in enumerate(zip(before, now, strict=True)) if a != b]
    if changed is not None and len(changed) > REPRICE_MAX_SHARE * len(now):
        changed = None
    rnd.moved[id(before)] = (before, changed)
    return changed


def _prefetch_queue(
    jobs: Sequence[QueuedJob],
    pools: Sequence[Pool],
    rnd: _RoundPools,
    pools_key: tuple[Any, ...],
    cfg: SchedulerConfig,
    cache: CandidateCache,
) -> dict[str, list[tuple[Pool, list[int], str]]]:
    """Predict, in one vectorised pass per accelerator and topology (``prefetch_predictions_many``), what
    the queue's specs without a memoised candidate list will be priced on; returns each such spec's pools
    with their device counts and eligibility reasons, by spec key."""
    work: list[tuple[Any, CountGroups]] = []
    seen: dict[str, list[tuple[Pool, list[int], str]]] = {}
    # specs alike in what screening reads (escape hatches, markets, memory, device range) share it
    alike: dict[tuple[Any, ...], tuple[list[tuple[Pool, list[int], str]], CountGroups]] = {}
    for qj in jobs:
        key = cache.key(qj.spec)
        if key in seen or _view_key(qj, pools_key, cfg, cache) in cache.views:
            continue
        family = cache.views.get(_family_key(qj, rnd, cfg, cache))
        if family is not None and _moved(family[0], rnd) is not None:
            continue  # priced again only where a price moved (``_spec_view``), on predictions it has
        sk = screen_key(qj.spec, cache)
        hit = alike.get(sk)
        if hit is None:
            screened = [(p, device_counts(qj.spec, p, cache), eligibility(qj.spec, p, cache)) for p in pools]
            groups = count_groups([(p, counts) for p, counts, why in screened if counts and not why], cache)
            hit = alike[sk] = (screened, groups)
        seen[key] = hit[0]
        work.append((qj.spec, hit[1]))
    if work:
        prefetch_predictions_many(work, cache)
    return seen


def free_room(pool: Pool) -> tuple[int, int]:
    """(whole free nodes, largest single-node gang that fits now): what ``fits_now`` reads of a pool."""
    free = pool.free_devices
    whole = free // pool.devices_per_node
    return whole, pool.devices_per_node if whole > 0 else free - whole * pool.devices_per_node


def queued_progress(qj: QueuedJob) -> float:
    """The queued job's done share as priced: clamped to [0, 0.999] (the cost model needs work left)."""
    return min(max(float(qj.progress_fraction), 0.0), 0.999)


def _memo(cache: CandidateCache, name: str, key: Any, make: Any) -> Any:
    """``make()``, or its value of the last round when ``key`` equals that round's (``round_memo``)."""
    hit = cache.round_memo.get(name)
    if hit is not None and hit[0] == key:
        return hit[1]
    value = make()
    cache.round_memo[name] = (key, value)
    return value


def _tenant_limits(cfg: SchedulerConfig, running: Sequence[RunningJob]) -> dict[str, TenantLimit]:
    """Quota left per tenant after its running jobs."""
    devices: dict[str, int] = defaultdict(int)
    count: dict[str, int] = defaultdict(int)
    for rj in running:
        devices[rj.tenant] += rj.devices
        count[rj.tenant] += 1
    return {
        tenant: TenantLimit(
            None if quota.max_devices is None else quota.max_devices - devices[tenant],
            None if quota.max_jobs is None else quota.max_jobs - count[tenant],
        )
        for tenant, quota in cfg.quotas.items()
    }


def _job_options(
    qj: QueuedJob,
    deadline: float | None,
    now_s: float,
    vkey: tuple[Any, ...],
    views: dict[Any, _SpecView],
    pools: Sequence[Pool],
    rnd: _RoundPools,
    pools_key: tuple[Any, ...],
    cfg: SchedulerConfig,
    cache: CandidateCache,
    screened: Mapping[str, list[tuple[Pool, list[int], str]]] | None,
    pin: int | None = None,
) -> tuple[Any, ...]:
    """A queued job's options this round: (its spec's view, feasible rows, feasible, fitting now, the
    model's options, feasible by cost, the greedy seed's wider list, whether its deadline is out of reach).
    ``pin``: the index of the only pool it may use (its group's), or None."""
    view = views.get(vkey)
    if view is None:
        view = _spec_view(qj, pools, rnd, pools_key, cfg, cache, screened)
        views[vkey] = view
    static = view.static
    grid = static.grid
    if deadline is None and pin is None:
        return (view, static.order, view.feasible, view.fitting, view.pruned, view.by_cost, view.seed, False)
    ok = None if pin is None else grid.pool == pin
    left_s = None if deadline is None else deadline - now_s  # the view's finish_s is the p90 duration
    late = False
    allowed = ok
    if left_s is not None:
        on_time = grid.finish <= left_s if ok is None else (grid.finish <= left_s) & ok
        if not on_time[static.order].any() and (ok is None or ok[static.order].any()) and static.order.size:
            # No option can finish by the deadline any more (it has passed, or the job waited too long):
            # the deadline is missed whatever happens, so the job is placed as if it had none (cheapest, or
            # soonest for objective.minimize: time) rather than stranded in the queue. Its waiting cost
            # keeps the deadline's urgency, so it goes first when capacity is short.
            if ok is None:
                return (view, static.order, view.feasible, view.fitting, view.pruned, view.by_cost, view.seed,
                        True)  # fmt: skip
            left_s, late = None, True
        else:
            allowed = on_time
    assert allowed is not None
    feasible_rows = static.order[allowed[static.order]]
    feasible = Rows(grid, feasible_rows.tolist())
    fitting = Rows(grid, feasible_rows[view.fits[feasible_rows]].tolist())
    if cfg.pareto_pruning:
        useful = pareto_rows(static, left_s, view.fits if ok is None else view.fits & ok)
    else:
        use = allowed & view.fits
        useful = static.order[use[static.order]]
    pruned = _prune_rows(grid, useful, cfg)
    by_cost = Rows(grid, static.by_cost[allowed[static.by_cost]].tolist())
    return (view, feasible_rows, feasible, fitting, pruned, by_cost, _seed_rows(grid, useful, cfg), late)


def schedule_round(
    jobs: Sequence[QueuedJob],
    pools: Sequence[Pool],
    running: Sequence[RunningJob] = (),
    now_s: float = 0.0,
    config: SchedulerConfig | None = None,
    *,
    cache: CandidateCache | None = None,
    time_limit_s: float | None = None,
    groups: Mapping[str, JobGroup] | None = None,
) -> RoundResult:
    """Decide placements for the queue (and migrations for running jobs) against live pools.

    ``pools`` carry the current free capacity (``available_devices``, running jobs already excluded) and
    current prices. Running jobs count against tenant quotas; each may stay, move (when it pays off, with
    hysteresis) or be forced off spot when it falls behind its deadline. Queued jobs naming a ``group`` are
    scheduled as one (:class:`JobGroup`: one pool, a limit on starts and on their summed expected cost);
    a group's running members keep their allocations.
    """
    with gc_paused():  # a round allocates in bursts; see schedule.gcpause
        cfg = config or SchedulerConfig()
        cache = cache if cache is not None else CandidateCache()
        cache.trim()
        groups = dict(groups or {})
        limits_of = {
            g: GroupLimit(jg.max_starts, None if jg.budget_usd is None else budget_left_units(jg.budget_usd))
            for g, jg in sorted(groups.items())
        }
        pool_index = {p.name: i for i, p in enumerate(pools)}
        pool_by_name = {p.name: p for p in pools}
        problem: list[ProblemJob] = []
        # job -> (feasible, fitting now: both by objective; feasible by expected cost)
        info: dict[str, tuple[Sequence[Candidate], Sequence[Candidate], Sequence[Candidate]]] = {}
        unplaced: list[Unplaced] = []
        kept: list[str] = []
        running_by_id: dict[str, RunningJob] = {}
        forced_reason: dict[str, str] = {}

        views: dict[tuple[str, Minimize, float], _SpecView] = {}
        late: dict[str, float] = {}  # job -> its deadline, for jobs no option can finish by it any more
        full: list[tuple[ProblemJob, Sequence[Candidate]]] = []
        # the pools' priced fields, as a small token of this cache (a view key hashes it once per job)
        pools_key = (cache.pools_token(tuple(pool_price_key(p) for p in pools)),)
        rnd = _RoundPools.of(pools, cache)
        screened = (
            _prefetch_queue(jobs, pools, rnd, pools_key, cfg, cache) if cfg.vectorised_pricing else None
        )
        tv = cfg.time_value_usd_per_hour
        # a job's options this round depend on its spec's view, the time to its deadline, the pools' prices
        # and free room and the configuration: the last round's are reused where all of those are equal
        rkey = (rnd.whole.tobytes(), rnd.single.tobytes(), pools_key, cfg)
        last_key, last = cache.round_memo.get("options", (None, {}))
        before: dict[Any, Any] = last if last_key == rkey else {}
        this_round: dict[Any, Any] = {}
        cache.round_memo["options"] = (rkey, this_round)
        for qj in jobs:
            deadline = qj.deadline_abs_s
            pinned = None if qj.group is None else (groups.get(qj.group) or JobGroup()).pool
            pin = None if pinned is None else pool_index.get(pinned)
            if pinned is not None and pin is None:
                gone = f"its group {qj.group} runs on pool {pinned}, which is not among this round's pools"
                unplaced.append(Unplaced(qj.job_id, qj.tenant, gone))
                continue
            vkey = (cache.key(qj.spec), qj.spec.objective.minimize, queued_progress(qj))
            jkey = (vkey, None if deadline is None else deadline - now_s, pin)
            got = before.get(jkey)
            if got is None:
                got = _job_options(
                    qj, deadline, now_s, vkey, views, pools, rnd, pools_key, cfg, cache, screened, pin
                )
            this_round[jkey] = got
            view, feasible_rows, feasible, fitting, pruned, by_cost, seed_pool, is_late = got
            grid = view.static.grid
            if is_late and deadline is not None:
                late[qj.job_id] = deadline
            if not feasible:
                cannot = _infeasible_reason(view.cands, pools)
                if pinned is not None:
                    cannot = f"its group {qj.group} runs on pool {pinned}, which cannot run it: " + cannot
                unplaced.append(Unplaced(qj.job_id, qj.tenant, cannot))
                continue
            info[qj.job_id] = (feasible, fitting, by_cost)
            # what the job is expected to cost when it runs later, in objective terms but at list prices
            # (reserved capacity is not assumed to be free later)
            if qj.spec.objective.minimize == Minimize.TIME:
                reference = float((grid.cost[feasible_rows] + tv * grid.hours[feasible_rows]).min())
            else:
                reference = by_cost[0].expected_cost_usd
            wait = waiting_cost_usd(
                priority=qj.priority,
                reference_usd=reference,
                queued_s=now_s - qj.submit_s,
                deadline_abs_s=deadline,
                needed_s=(view.min_p90_h if deadline is None else float(grid.p90[feasible_rows].min()))
                * 3600.0,
                now_s=now_s,
                config=cfg,
            )
            pj = ProblemJob(
                job_id=qj.job_id,
                tenant=qj.tenant,
                options=tuple(pruned),
                unplaced_usd=reference + wait,
                rank_usd=wait,
                group=qj.group,
            )
            full.append((pj, seed_pool))

        # Keep the model small (the cheapest few options per job) without losing good packings: each job also
        # keeps the option a greedy pass over a wider list of its fitting options gives it.
        capacities = {
            p.name: PoolCapacity(
                p.name, p.free_devices, whole_nodes(p.free_devices, p.devices_per_node), p.devices_per_node
            )
            for p in pools
        }
        # (the wider lists are made into candidates only as far as the greedy pass reads them)
        limits = _tenant_limits(cfg, running)
        seeds = _memo(
            cache, "greedy", (full, capacities, limits, limits_of),
            lambda: greedy([replace(pj, options=f) for pj, f in full], capacities, limits, limits_of),
        )  # fmt: skip
        for pj, wider in full:
            opts = list(pj.options)
            g = seeds.get(pj.job_id)
            if g is not None and not any(o is wider[g] for o in opts):
                opts.append(wider[g])
                opts.sort(key=_sort_key)
            problem.append(replace(pj, options=tuple(opts)) if len(opts) != len(pj.options) else pj)

        for rj in running:
            running_by_id[rj.job_id] = rj
            rpj = None  # a group's member stays: a move would split the pool its group shares
            if rj.group is None:
                rpj = _running_problem(rj, pool_by_name, pools, now_s, cfg, cache, forced_reason)
            if rpj is None:
                kept.append(rj.job_id)
            else:
                problem.append(rpj)

        tenants = _tenant_limits(cfg, running)
        # a model equal to the last round's (nothing it reads changed) has the same answer: the solver is
        # deterministic (one worker, fixed seed, deterministic limits), so it is not searched again
        key = (problem, capacities, tenants, limits_of, cfg, time_limit_s)
        again = cache.round_memo.get("solve")
        if again is not None and again[0] == key:
            sol = replace(again[1], wall_time_s=0.0)
        else:
            sol = solve(problem, capacities, tenants, cfg, time_limit_s=time_limit_s, groups=limits_of)
            cache.round_memo["solve"] = (key, sol)

        usage = _tenant_usage(problem, sol)
        group_use = _group_usage(problem, sol)
        placements: list[Placement] = []
        for pj in problem:
            idx = sol.choice.get(pj.job_id)
            if pj.job_id in running_by_id:
                rj = running_by_id[pj.job_id]
                chosen = pj.options[idx] if idx is not None else None
                if chosen is None or chosen.is_stay:
                    kept.append(pj.job_id)
                    continue
                why = forced_reason.get(pj.job_id)
                saving = next((o for o in pj.options if o.is_stay), None)
                head = f"move {rj.pool} → {_label(chosen)}"
                if why:
                    reason = f"{head}: {why}; moving to on-demand capacity to meet the deadline"
                else:
                    stay_usd = saving.expected_cost_usd if saving else 0.0
                    reason = (
                        f"{head}: remaining work {_fmt_usd(stay_usd)} here vs "
                        f"{_fmt_usd(chosen.expected_cost_usd - chosen.migration_cost_usd)} there, "
                        f"migration {_fmt_usd(chosen.migration_cost_usd)}"
                    )
                others = tuple(_alternative(o) for o in pj.options if o is not chosen)[:2]
                placements.append(_placement(pj, chosen, reason, others, from_pool=rj.pool))
                continue
            feasible_now, fitting_now, by_cost_now = info[pj.job_id]
            if idx is None:
                held = _group_reason(pj, fitting_now, group_use, groups)
                if held is None:
                    held = _unplaced_reason(pj, feasible_now, fitting_now, usage, pool_by_name, tenants)
                unplaced.append(Unplaced(pj.job_id, pj.tenant, held))
                continue
            chosen = pj.options[idx]
            reason = _placement_reason(chosen, fitting_now, feasible_now, by_cost_now, pool_by_name)
            if pj.group is not None:
                reason += f"; group {pj.group} shares {chosen.pool}"
            if pj.job_id in late:
                over_s = now_s + chosen.expected_hours_p90 * 3600.0 - late[pj.job_id]
                reason += (
                    f"; misses its deadline: no option finishes by it any more (p90 finish "
                    f"{_fmt_dur(max(over_s, 0.0))} after it)"
                )
            placements.append(_placement(pj, chosen, reason, _alternatives(chosen, by_cost_now)))
        order = {qj.job_id: i for i, qj in enumerate(jobs)}
        order.update({rj.job_id: len(jobs) + i for i, rj in enumerate(running)})
        placements.sort(key=lambda p: order.get(p.job_id, 0))
        unplaced.sort(key=lambda u: order.get(u.job_id, 0))
        kept.sort(key=lambda j: order.get(j, 0))
        return RoundResult(
            placements=tuple(placements),
            unplaced=tuple(unplaced),
            kept=tuple(kept),
            solve_time_s=sol.wall_time_s,
            objective_usd=sol.objective_usd,
            solver_status=sol.status,
            greedy_objective_usd=sol.greedy_objective_usd,
            lower_bound_usd=sol.lower_bound_usd,
        )


def _running_problem(
    rj: RunningJob,
    pool_by_name: Mapping[str, Pool],
    pools: Sequence[Pool],
    now_s: float,
    cfg: SchedulerConfig,
    cache: CandidateCache,
    forced_reason: dict[str, str],
) -> ProblemJob | None:
    """The running job's options (stay + moves), or None when it simply keeps its allocation."""
    current = pool_by_name.get(rj.pool)
    if current is None:
        return None  # its pool is not in this round's view; nothing to compare against
    progress = min(max(rj.progress_fraction, 0.0), 0.999)
    deadline = rj.deadline_abs_s
    dwell = now_s - rj.placed_s >= cfg.min_dwell_s
    maybe_forced = deadline is not None and rj.market == "spot"
    if not dwell and not maybe_forced:
        return None
    stay_quote = price_option(rj.spec, current, rj.devices, progress, cache)
    stay = to_candidate(
        job_id=rj.job_id,
        tenant=rj.tenant,
        spec=rj.spec,
        pool=current,
        option=stay_quote,
        now_s=now_s,
        deadline_abs_s=None,
        config=cfg,
    )
    minimize = rj.spec.objective.minimize
    stay = _objective_for_job(
        replace(stay, is_stay=True, capacity_devices=0, feasible=True, reasons=()), minimize, cfg
    )
    raw = candidates_for(
        job_id=rj.job_id,
        tenant=rj.tenant,
        spec=rj.spec,
        # a full pool cannot take the job; it matters only for the on-demand time a deadline job on spot
        # still needs (Uniform Progress), so otherwise it is not priced at all
        pools=[p for p in pools if p.name != rj.pool and (maybe_forced or p.free_devices > 0)],
        now_s=now_s,
        deadline_abs_s=deadline,
        config=cfg,
        cache=cache,
        elapsed_fraction=progress,
    )
    cands = [_objective_for_job(c, minimize, cfg) for c in raw]
    movable = [c for c in cands if c.feasible and fits_now(c, pool_by_name[c.pool])]
    non_spot = [c for c in cands if c.feasible and c.market != "spot"]
    remaining_od_s = min((c.expected_hours_p90 * 3600.0 for c in non_spot), default=None)
    check = uniform_progress(rj, now_s, remaining_od_s, cfg)
    options: list[Candidate] = []
    restart_s = float(getattr(stay_quote, "restart_s", 0.0) or 0.0)
    for c in movable:
        if check.behind and c.market == "spot":
            continue
        q = price_option(rj.spec, pool_by_name[c.pool], c.devices, progress, cache)
        mc = migration_cost(
            rj.spec,
            from_accelerator=current.accelerator,
            from_devices=rj.devices,
            from_price_usd_per_hour=stay.price_usd_per_hour,
            to=c,
            restart_s=float(getattr(q, "restart_s", restart_s) or 0.0),
            compile_s=float(getattr(q, "compile_s", 0.0) or 0.0),
            config=cfg,
        )
        total = c.expected_cost_usd + mc.usd
        if check.behind:
            options.append(
                replace(c, expected_cost_usd=total, migration_cost_usd=mc.usd, objective_usd=total)
            )
        elif dwell and worth_moving(stay.objective_usd, c.objective_usd, mc, cfg):
            objective = (
                c.objective_usd + mc.usd * (1.0 + cfg.migration_margin) + cfg.migration_min_savings_usd
            )
            options.append(
                replace(c, expected_cost_usd=total, migration_cost_usd=mc.usd, objective_usd=objective)
            )
    if check.behind:
        forced_reason[rj.job_id] = check.reason
        # staying is allowed only as a last resort (no on-demand capacity fits)
        stay = replace(stay, objective_usd=stay.objective_usd + 10.0 * (stay.expected_cost_usd + 1.0) + 1e4)
    if not options:
        return None
    opts = (*prune(sorted(options, key=_sort_key), cfg), stay)
    return ProblemJob(
        job_id=rj.job_id,
        tenant=rj.tenant,
        options=tuple(sorted(opts, key=_sort_key)),
        unplaced_usd=None,
        rank_usd=1e12 if check.behind else 0.0,
        current_devices=rj.devices,
    )


def _group_usage(problem: Sequence[ProblemJob], sol: Solution) -> dict[str, tuple[str, int, int]]:
    """Per group in this round's solution: (the pool its members took, how many started, their budget
    units)."""
    out: dict[str, tuple[str, int, int]] = {}
    for pj in problem:
        i = sol.choice.get(pj.job_id)
        if pj.group is None or i is None:
            continue
        opt = pj.options[i]
        _, n, units = out.get(pj.group, ("", 0, 0))
        out[pj.group] = (opt.pool, n + 1, units + cost_units(opt.expected_cost_usd))
    return out


def _group_reason(
    pj: ProblemJob,
    fitting: Sequence[Candidate],
    use: Mapping[str, tuple[str, int, int]],
    groups: Mapping[str, JobGroup],
) -> str | None:
    """Why a group's member was left out when its group's limits are what held it back, else None."""
    if pj.group is None or not fitting:
        return None
    g = groups.get(pj.group) or JobGroup()
    pool, started, units = use.get(pj.group, ("", 0, 0))
    if g.max_starts is not None and started >= g.max_starts:
        return (
            f"its group {pj.group} may start {max(g.max_starts, 0)} more member(s) now (its parallelism less "
            f"its running members), {'and this round started them' if started else 'none left'}"
        )
    here = [c for c in fitting if not pool or c.pool == pool]
    if pool and not here:
        return f"its group {pj.group} shares {pool} this round, which has no room left for it"
    if g.budget_usd is not None and here:
        left = g.budget_usd - units / BUDGET_UNITS_PER_USD
        cheapest = min(c.expected_cost_usd for c in here)
        if cost_units(cheapest) > budget_left_units(g.budget_usd) - units:
            return (
                f"its group {pj.group} has {_fmt_usd(max(left, 0.0))} of its budget left for new members; "
                f"the cheapest option that fits now is expected to cost {_fmt_usd(cheapest)}"
            )
    return None


def _tenant_usage(problem: Sequence[ProblemJob], sol: Solution) -> dict[str, tuple[int, int]]:
    """Devices and jobs each tenant takes in this round's solution (beyond its running jobs)."""
    dev: dict[str, int] = defaultdict(int)
    cnt: dict[str, int] = defaultdict(int)
    for pj in problem:
        i = sol.choice.get(pj.job_id)
        if i is None:
            continue
        dev[pj.tenant] += pj.options[i].devices - pj.current_devices
        cnt[pj.tenant] += 0 if pj.must_place else 1
    return {t: (dev[t], cnt[t]) for t in dev}


def _unplaced_reason(
    pj: ProblemJob,
    feasible: Sequence[Candidate],
    fitting: Sequence[Candidate],
    usage: Mapping[str, tuple[int, int]],
    pools: Mapping[str, Pool],
    tenants: Mapping[str, TenantLimit],
) -> str:
    cheapest = feasible[0]
    later = f"cheapest feasible later: {_label(cheapest)} at {_fmt_usd(cheapest.expected_cost_usd)}"
    if not fitting:
        named = list(dict.fromkeys(c.pool for c in feasible))
        if len(named) == 1:
            pool = pools[cheapest.pool]
            shape = (
                f"{cheapest.nodes} whole {pool.devices_per_node}-device nodes"
                if cheapest.nodes > 1
                else f"{cheapest.devices} × {cheapest.accelerator} in one node"
            )
            return (
                f"no capacity now: needs {shape}; the only pool that can run it, {pool.name}, has "
                f"{pool.free_devices} of {pool.total_devices} devices available; {later}"
            )
        seen: list[str] = []
        done: set[str] = set()
        for c in feasible:
            if c.pool not in done:
                done.add(c.pool)
                seen.append(capacity_reason(c, pools[c.pool]))
            if len(seen) == 2:
                break
        more = f" (and {len(named) - 2} more pools)" if len(named) > 2 else ""
        return f"no capacity now on the {len(named)} pools that can run it: {'; '.join(seen)}{more}; {later}"
    lim = tenants.get(pj.tenant)
    if lim is not None:
        used_dev, used_jobs = usage.get(pj.tenant, (0, 0))
        smallest = min(c.devices for c in fitting)
        if lim.jobs_left is not None and used_jobs >= lim.jobs_left:
            return f"tenant {pj.tenant} is at its concurrent-job quota; {later}"
        if lim.devices_left is not None and used_dev + smallest > lim.devices_left:
            left = max(lim.devices_left - used_dev, 0)
            return (
                f"tenant {pj.tenant} device quota: {left} devices left, "
                f"the smallest option needs {smallest}; {later}"
            )
    best_now = fitting[0]
    if pj.options and best_now.objective_usd >= (pj.unplaced_usd or 0.0):
        return (
            f"waiting is cheaper: best option available now is {_label(best_now)} at "
            f"{_fmt_usd(best_now.expected_cost_usd)}; {later} (full now)"
        )
    pools_named = sorted({c.pool for c in pj.options})
    return (
        f"the pools that fit it now ({', '.join(pools_named[:4])}) are taken by this round's higher-value "
        f"placements; {later}"
    )
