"""Vectorised candidate pricing: one spec's whole pool × device-count grid priced with array maths.

:func:`spec_candidates` gives exactly the list the scalar reference gives (``candidates_for`` over every
pool, one ``price_option`` and ``to_candidate`` per (pool, device count), then the job's objective): the
same candidates, field for field, in the same order. What it does differently is how the last step of a
quote is computed. The expensive middle step, ``cost.quote.AllocationTimes`` (predictions, checkpoint
stall and interval, restart, interruptions), is memoised per (spec base, pool class, device count) in
the :class:`~trainyard.schedule.candidates.CandidateCache` as the numbers pricing reads of it
(:func:`time_row`); the rows a spec misses are computed together as arrays from the memoised predictions
(``schedule.times.time_rows_many``), and only the ones that do not fit (or have no prediction) go
through the scalar ``allocation_times``, whose reasons are in words. The predictions behind them are
filled with one ``predict_many`` call per accelerator and topology, as before. The pricing of the
remaining work (``cost.quote.price_work``: checkpoint and preemption fractions, expected and pessimistic
wall time, dollars) and the scheduler's own fields (``to_candidate``: p90 finish, capacity, the objective
with reserved capacity at its marginal cost and the time value) are then one numpy expression over every
priced (pool, device count) of the spec, written in the scalar code's operation order so that every
number is the same IEEE double. No ``QuoteOption`` is built on this path.

Rows the cost model or the scheduler rejects for a reason that needs words (the predictor cannot model the
combination, the model does not fit, a budget, device-hour limit, interconnect or preemption reason, a pool
without a price) go through the scalar path one by one, so their reasons are the reference's own strings.

Pure: no I/O.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import replace
from statistics import NormalDist
from typing import Any

import numpy as np

from trainyard.catalog.offers import price_usd_per_device_hour_for
from trainyard.catalog.pools import Pool
from trainyard.cost import model as cm
from trainyard.cost.quote import AllocationTimes, allocation_times
from trainyard.errors import PoolsFileError
from trainyard.schedule.candidates import (
    CandidateCache,
    _never,
    _no_counts,
    _predict_fn,
    device_counts,
    eligibility,
    prefetch_predictions,
    price_option,
    to_candidate,
)
from trainyard.schedule.times import TimeKey, time_rows_many
from trainyard.schedule.types import Candidate, SchedulerConfig
from trainyard.spec.models import JobSpec, Minimize

_PARAMS = cm.DEFAULT_PARAMS
_Z = NormalDist().inv_cdf(_PARAMS.deadline_quantile)


def poisson_quantiles(means: np.ndarray, q: float) -> np.ndarray:
    """``cost.model.poisson_quantile`` of every mean, elementwise, with the same arithmetic: the same
    running sum of Poisson terms (``math.exp`` for the first term), the normal approximation above 500."""
    out = np.zeros(means.shape, dtype=np.int64)
    big = means > 500
    for i in np.flatnonzero(big):
        out[i] = cm.poisson_quantile(float(means[i]), q)
    idx = np.flatnonzero((means > 0) & ~big)
    if idx.size == 0:
        return out
    mean = means[idx]
    p = np.array([math.exp(-m) for m in mean.tolist()])
    cdf = p.copy()
    k = np.zeros(idx.size, dtype=np.int64)
    live = np.flatnonzero(cdf < q)
    while live.size:
        k[live] += 1
        p[live] = p[live] * (mean[live] / k[live])
        cdf[live] = cdf[live] + p[live]
        live = live[cdf[live] < q]
    out[idx] = k
    return out


def _scalar(
    spec: JobSpec, pool: Pool, devices: int, progress: float, config: SchedulerConfig, cache: CandidateCache
) -> Candidate:
    """One option the reference way (``price_option`` + ``to_candidate``)."""
    opt = price_option(spec, pool, devices, progress, cache)
    return to_candidate(
        job_id="", tenant="", spec=spec, pool=pool, option=opt, now_s=0.0, deadline_abs_s=None, config=config
    )


def _times(
    spec: JobSpec,
    pool: Pool,
    devices: int,
    acc: Any,
    pclass: Any,
    cache: CandidateCache,
    predict_fn: Any = None,
    facts: Any = None,
    base: str | None = None,
) -> AllocationTimes:
    """``price_option``'s memoised ``allocation_times``. ``predict_fn`` (``candidates._predict_fn`` of the
    spec and pool), ``facts`` (``cache.facts(spec)``) and ``base`` (``cache.base(spec)``): when the caller
    has them (one per spec or pool instead of one per device count)."""
    tk = (cache.base(spec) if base is None else base, pclass, devices)
    t = cache.times.get(tk)
    if t is None:
        t = allocation_times(
            spec, pool, devices, acc, cache.facts(spec) if facts is None else facts,
            predict_fn=_predict_fn(cache, spec, pool) if predict_fn is None else predict_fn,
        )  # fmt: skip
        cache.times[tk] = t
    return t


class CandidateGrid:
    """A spec's candidates (every pool × device count, feasible or not, in pool order) as columns, with
    the :class:`Candidate` of a row made only when it is asked for (and kept: one object per row).

    ``pools`` are the round's pools (``pool`` holds a row's index into them). The numeric columns hold the
    feasible rows' values (what the round sorts, filters and prunes on); rows made by the scalar path (a
    reason in words, a pool the spec can never use) are kept as made."""

    __slots__ = (
        "_markets",
        "capacity",
        "cost",
        "devices",
        "feasible",
        "finish",
        "hours",
        "interval",
        "made",
        "n",
        "nodes",
        "objective",
        "p90",
        "pool",
        "pools",
        "price_h",
        "step",
    )  # fmt: skip

    def __init__(self, pools: Sequence[Pool], n: int, markets: Sequence[str]) -> None:
        self.pools = pools
        self.n = n
        self._markets = markets  # per pool
        # a row's candidate once made; a tuple: ``_rejected``'s arguments, made when first read
        self.made: list[Candidate | tuple[Any, ...] | None] = [None] * n
        self.pool = np.zeros(n, dtype=np.int64)
        self.feasible = np.zeros(n, dtype=bool)
        self.devices = np.zeros(n, dtype=np.int64)
        self.nodes = np.ones(n, dtype=np.int64)
        self.capacity = np.zeros(n, dtype=np.int64)
        self.cost = np.zeros(n)
        self.hours = np.zeros(n)
        self.p90 = np.zeros(n)
        self.step = np.zeros(n)
        self.price_h = np.zeros(n)
        self.interval = np.zeros(n)
        self.finish = np.zeros(n)
        self.objective = np.zeros(n)

    @classmethod
    def of(cls, cands: Sequence[Candidate], pools: Sequence[Pool], markets: Sequence[str]) -> CandidateGrid:
        """The grid of a list of candidates of ``pools`` (the scalar path's)."""
        g = cls(pools, len(cands), markets)
        index = {p.name: i for i, p in enumerate(pools)}
        for i, c in enumerate(cands):
            g.made[i] = c
            g.pool[i] = index[c.pool]
            if c.feasible:
                g._set(i, c)
        return g

    def _set(self, i: int, c: Candidate) -> None:
        self.feasible[i] = True
        self.devices[i] = c.devices
        self.nodes[i] = c.nodes
        self.capacity[i] = c.capacity_devices
        self.cost[i] = c.expected_cost_usd
        self.hours[i] = c.expected_hours
        self.p90[i] = c.expected_hours_p90
        self.step[i] = c.step_time_s
        self.price_h[i] = c.price_usd_per_hour
        self.interval[i] = c.checkpoint_interval_s
        self.finish[i] = c.finish_s
        self.objective[i] = c.objective_usd

    def candidate(self, i: int) -> Candidate:
        """Row ``i`` as a candidate (the same object every time)."""
        c = self.made[i]
        if isinstance(c, tuple):
            c = self.made[i] = _rejected(*c)
        elif c is None:
            pool = self.pools[int(self.pool[i])]
            dpn = pool.devices_per_node
            nodes = int(self.nodes[i])
            d = int(self.devices[i])
            iv = float(self.interval[i])
            c = self.made[i] = Candidate(
                job_id="",
                tenant="",
                pool=pool.name,
                accelerator=pool.accelerator,
                devices=d,
                nodes=nodes,
                devices_per_node=dpn,
                market=self._markets[int(self.pool[i])],
                expected_cost_usd=float(self.cost[i]),
                expected_hours=float(self.hours[i]),
                expected_hours_p90=float(self.p90[i]),
                step_time_s=float(self.step[i]),
                price_usd_per_hour=float(self.price_h[i]),
                checkpoint_interval_s=iv if iv else 0.0,
                finish_s=float(self.finish[i]),
                feasible=True,
                reasons=(),
                capacity_devices=int(self.capacity[i]),
                objective_usd=float(self.objective[i]),
            )
        return c

    def candidates(self) -> list[Candidate]:
        return [self.candidate(i) for i in range(self.n)]

    def with_pools_repriced(
        self, pools: Sequence[Pool], changed: Sequence[int], sub: CandidateGrid
    ) -> CandidateGrid:
        """This grid on ``pools`` (the same pools as its own but for the prices of those at ``changed``)
        with the rows of those pools taken from ``sub``, their grid alone (:func:`spec_grid` on
        ``[pools[i] for i in changed]``): a pool's rows depend on no other pool, and a price moves no row
        (device counts and eligibility do not read it)."""
        g = CandidateGrid(pools, self.n, self._markets)
        g.made = list(self.made)
        for name in _COLUMNS:
            setattr(g, name, getattr(self, name).copy())
        moved = np.zeros(len(pools), dtype=bool)
        moved[list(changed)] = True
        at = np.flatnonzero(moved[self.pool])
        # rows are in pool order on both grids, so the changed pools' rows come in the same order
        if len(at) != sub.n:
            raise ValueError("the repriced pools' rows do not match the grid's")
        for name in _COLUMNS:
            if name != "pool":
                getattr(g, name)[at] = getattr(sub, name)
        for k, i in enumerate(at.tolist()):
            g.made[i] = sub.made[k]
        return g


_COLUMNS = (
    "pool", "feasible", "devices", "nodes", "capacity", "cost", "hours", "p90", "step", "price_h", "interval",
    "finish", "objective",
)  # fmt: skip


class Rows(Sequence[Candidate]):
    """Some rows of a :class:`CandidateGrid`, in a given order, as a sequence of candidates made on demand."""

    __slots__ = ("grid", "idx")

    def __init__(self, grid: CandidateGrid, idx: list[int]) -> None:
        self.grid = grid
        self.idx = idx

    def __len__(self) -> int:
        return len(self.idx)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self.grid.candidate(k) for k in self.idx[i]]
        return self.grid.candidate(self.idx[i])

    def __iter__(self) -> Any:
        cand = self.grid.candidate
        for k in self.idx:
            yield cand(k)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Rows):
            return self.grid is other.grid and self.idx == other.idx
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


def spec_candidates(
    spec: JobSpec,
    pools: Sequence[Pool],
    config: SchedulerConfig,
    cache: CandidateCache,
    elapsed_fraction: float = 0.0,
    *,
    prefetched: bool = False,
    screened: list[tuple[Pool, list[int], str]] | None = None,
) -> list[Candidate]:
    """Every (pool, device count) candidate of ``spec`` with its objective, as the per-spec view of a
    round builds it: ``candidates_for(job_id="", tenant="", now_s=0, deadline_abs_s=None)`` with
    ``objective.minimize: time`` adding the time value, priced as arrays (see the module docstring).

    ``prefetched``: the round has already asked for the spec's predictions on ``pools``
    (``candidates.prefetch_predictions_many``); any it could not make are predicted one by one.
    ``screened``: each pool's device counts and eligibility reason for the spec, when the caller has them
    (``candidates.device_counts`` and ``candidates.eligibility``, in ``pools`` order)."""
    return spec_grid(
        spec, pools, config, cache, elapsed_fraction, prefetched=prefetched, screened=screened
    ).candidates()


def pool_markets(pools: Sequence[Pool], cache: CandidateCache) -> list[str]:
    return [_market(cache, p) for p in pools]


def spec_grid(
    spec: JobSpec,
    pools: Sequence[Pool],
    config: SchedulerConfig,
    cache: CandidateCache,
    elapsed_fraction: float = 0.0,
    *,
    prefetched: bool = False,
    screened: list[tuple[Pool, list[int], str]] | None = None,
    markets: Sequence[str] | None = None,
) -> CandidateGrid:
    """:func:`spec_candidates` as a :class:`CandidateGrid` (``markets``: :func:`pool_markets`)."""
    if not 0.0 <= elapsed_fraction < 1.0:
        raise ValueError(f"elapsed_fraction must be in [0, 1), got {elapsed_fraction}")
    if screened is None:
        screened = [(p, device_counts(spec, p, cache), eligibility(spec, p, cache)) for p in pools]
    if markets is None:
        markets = pool_markets(pools, cache)
    if not prefetched:
        prefetch_predictions(
            spec, [(pool, counts) for pool, counts, why in screened if counts and not why], cache
        )
    time_value = config.time_value_usd_per_hour if spec.objective.minimize == Minimize.TIME else None
    # in output order; None: a vectorised row; a tuple: a rejected row's ``_rejected`` arguments
    made: list[Candidate | tuple[Any, ...] | None] = []
    slot_pool: list[int] = []
    # the vectorised rows' inputs, one entry per row
    vec_slots: list[int] = []
    rows_pool: list[int] = []
    rows_dev: list[int] = []
    rows_price: list[float] = []
    scalar_rows: list[tuple[int, Pool, int]] = []  # (slot, pool, devices) priced the reference way
    interconnect = spec.resources.min_interconnect_gbps is not None
    times, base, time_rows = cache.times, cache.base(spec), cache.time_rows
    vecs: list[tuple[float, ...]] = []  # ``time_row`` of each vectorised row
    # rows whose allocation times are not memoised: (slot, pool index, devices, memo key), and the keys
    # ``times.time_rows_many`` computes them from (one per memo key)
    pending: list[tuple[int, int, int, tuple[Any, ...]]] = []
    wanted: dict[tuple[Any, ...], int] = {}
    keys: list[TimeKey] = []
    infos = _pool_infos(pools, cache)
    for pi, (pool, counts, why) in enumerate(screened):
        if why or not counts:
            slot_pool.append(pi)
            made.append(_never_memo(spec, pool, counts, why, cache))
            continue
        # counts lie inside the spec's device range and the pool's shape (``candidate_device_counts``), so
        # ``screen_option`` passes them all and returns the pool's price (None: the pool has none)
        acc, pclass, gk, price = infos[pi]
        for devices in counts:
            slot_pool.append(pi)
            if price is None or interconnect:
                scalar_rows.append((len(made), pool, devices))
                made.append(None)
                continue
            tk = (base, pclass, devices)
            vec = time_rows.get(tk)
            if vec is None:
                t = times.get(tk)
                if t is None:
                    if tk not in wanted:
                        wanted[tk] = len(keys)
                        keys.append((acc, gk, pool.devices_per_node, pclass[4], devices))
                    pending.append((len(made), pi, devices, tk))
                    made.append(None)
                    continue
                if t.prediction is None or t.reason:
                    made.append((pool, devices, t, price))
                    continue
                vec = time_rows[tk] = time_row(t)
            vec_slots.append(len(made))
            rows_pool.append(pi)
            rows_dev.append(devices)
            rows_price.append(price)
            vecs.append(vec)
            made.append(None)
    if pending:
        facts = cache.facts(spec)
        got = time_rows_many(spec, keys, cache.shape(spec), cache.predictions, facts.checkpoint_bytes)
        pfs: dict[int, Any] = {}  # the pools' memoised predictors, for rows priced the scalar way
        for slot, pi, devices, tk in pending:
            res = got[wanted[tk]]
            pool = pools[pi]
            acc, pclass, _gk, price = infos[pi]
            assert price is not None  # rows of pools without a price are priced the scalar way
            if isinstance(res, AllocationTimes):
                times[tk] = res
                made[slot] = (pool, devices, res, price)
                continue
            vec = res if res is not None else time_rows.get(tk)
            if vec is None:
                pf = pfs.get(pi)
                if pf is None:
                    pf = pfs[pi] = _predict_fn(cache, spec, pool)
                t = _times(spec, pool, devices, acc, pclass, cache, pf, facts, base)
                if t.prediction is None or t.reason:
                    made[slot] = (pool, devices, t, price)
                    continue
                vec = time_row(t)
            time_rows[tk] = vec
            vec_slots.append(slot)
            rows_pool.append(pi)
            rows_dev.append(devices)
            rows_price.append(price)
            vecs.append(vec)
    progress = elapsed_fraction
    for slot, pool, devices in scalar_rows:
        c = _scalar(spec, pool, devices, progress, config, cache)
        made[slot] = _with_time_value(c, time_value) if time_value is not None else c
    g = CandidateGrid(pools, len(made), markets)
    g.pool[:] = slot_pool
    if vecs:
        cols = _price_rows(
            spec, pools, rows_pool, rows_dev, rows_price, vecs, markets, progress, config, cache, time_value
        )
        words = cols.pop("words")
        at = np.asarray(vec_slots, dtype=np.int64)
        ok = ~words
        sel = at[ok]
        g.feasible[sel] = True
        for name, col in cols.items():
            getattr(g, name)[sel] = col[ok]
        for k in np.flatnonzero(words).tolist():
            pool, d = pools[rows_pool[k]], rows_dev[k]
            c = _scalar(spec, pool, d, progress, config, cache)
            made[vec_slots[k]] = _with_time_value(c, time_value) if time_value is not None else c
    for i, m in enumerate(made):
        if m is not None:
            g.made[i] = m
            if not isinstance(m, tuple) and m.feasible:
                g._set(i, m)
    return g


_PoolInfo = tuple[Any, tuple[Any, ...], tuple[Any, ...], float | None]


def _pool_info(pool: Pool, cache: CandidateCache) -> _PoolInfo:
    acc, pclass = cache.pool_class(pool)
    try:
        price = price_usd_per_device_hour_for(pool, reserved_discount=_PARAMS.reserved_discount)
    except PoolsFileError:
        price = None
    return acc, pclass, cache.pool_topology(pool)[2], price


def _pool_infos(pools: Sequence[Pool], cache: CandidateCache) -> list[_PoolInfo]:
    """Per pool: its accelerator and class (``CandidateCache.pool_class``), its prediction group key
    (``CandidateCache.pool_topology``) and its price per device-hour (None: it has none), memoised for
    the last sequence of pools seen (a round's specs are priced on one), checked object by object."""
    hit = cache._pool_infos
    if hit is not None and len(hit[0]) == len(pools) and all(map(operator.is_, hit[0], pools)):
        return hit[1]
    infos = [_pool_info(p, cache) for p in pools]
    cache._pool_infos = (list(pools), infos)
    return infos


def _never_memo(spec: JobSpec, pool: Pool, counts: list[int], why: str, cache: CandidateCache) -> Candidate:
    """``candidates._never`` for a pool the spec can never use, memoised per (pool, device count, reason):
    such candidates carry no job (``job_id`` and ``tenant`` are empty in a spec's list) and are immutable,
    so specs refused by a pool for the same reason share one."""
    devices = counts[0] if counts else pool.devices_per_node
    reason = why or _no_counts(spec, pool)
    key = (id(pool), devices, reason)
    hit = cache._nevers.get(key)
    if hit is None or hit[0] is not pool:
        if len(cache._nevers) > 65536:
            cache._nevers.clear()
        hit = cache._nevers[key] = (pool, _never("", "", pool, devices, reason))
    return hit[1]


def _market(cache: CandidateCache, pool: Pool) -> str:
    """The pool's market as a string, memoised per pool object (an enum's ``.value`` is slow in a loop)."""
    hit = cache._markets.get(id(pool))
    if hit is None or hit[0] is not pool:
        if len(cache._markets) > 4096:
            cache._markets.clear()
        hit = cache._markets[id(pool)] = (pool, pool.market.value)
    return hit[1]


def _rejected(pool: Pool, devices: int, t: AllocationTimes, price_dev_h: float) -> Candidate:
    """The candidate of an allocation the predictor cannot model or that does not fit (``t.reason``), as
    ``priced_option`` + ``to_candidate`` give it: nothing priced but the allocation's price per hour."""
    n = pool.devices_per_node
    nodes = max(1, math.ceil(devices / n))
    if t.prediction is None:
        price_h, step = (pool.price_usd_per_device_hour or 0.0) * devices, 0.0
    else:
        price_h = price_dev_h * devices
        step = t.step_s if math.isfinite(t.step_s) and t.step_s > 0 else 0.0
    return Candidate(
        job_id="",
        tenant="",
        pool=pool.name,
        accelerator=pool.accelerator,
        devices=devices,
        nodes=nodes,
        devices_per_node=n,
        market=pool.market.value,
        expected_cost_usd=0.0,
        expected_hours=0.0,
        expected_hours_p90=0.0,
        step_time_s=step,
        price_usd_per_hour=price_h,
        checkpoint_interval_s=0.0,
        finish_s=0.0,
        feasible=False,
        reasons=(t.reason or "the cost model rejected this option",),
        capacity_devices=nodes * n if nodes > 1 else devices,
    )


def _with_time_value(c: Candidate, time_value: float) -> Candidate:
    """``round._objective_for_job`` of an ``objective.minimize: time`` job."""
    return replace(c, objective_usd=c.objective_usd + time_value * c.expected_hours)


def time_row(t: AllocationTimes) -> tuple[float, ...]:
    """What :func:`_price_rows` reads of one allocation's times, in its column order (step, p90 step,
    interval, stall, interruption rate, restart, compile, nodes, provisioning)."""
    return (
        t.step_s, t.step_p90_s, t.interval_s, t.stall_s, t.rate_h, t.restart_s, t.compile_s, float(t.nodes),
        _PARAMS.provisioning_s.get(t.accelerator.family, cm.DEFAULT_PROVISIONING_S),
    )  # fmt: skip


def _price_rows(
    spec: JobSpec,
    pools: Sequence[Pool],
    rows_pool: list[int],
    rows_dev: list[int],
    rows_price: list[float],
    vecs: list[tuple[float, ...]],
    markets: Sequence[str],
    progress: float,
    config: SchedulerConfig,
    cache: CandidateCache,
    time_value: float | None,
) -> dict[str, np.ndarray]:
    """``price_work`` + ``to_candidate`` (+ the time value) of every row at once: the grid's columns, and
    ``words``, the rows whose reason needs words (priced again the scalar way)."""
    facts = cache.facts(spec)
    params = _PARAMS
    devices = np.asarray(rows_dev, dtype=np.int64)
    price_dev_h = np.asarray(rows_price, dtype=float)
    cols_t = np.array(vecs, dtype=float).T.copy()  # one row per ``time_row`` field
    step_s, step_p90_s, interval_s, stall_s, rate_h, restart_s, compile_s = cols_t[:7]
    nodes_t = cols_t[7].astype(np.int64)
    provisioning_s = cols_t[8]
    at_pool = np.asarray(rows_pool, dtype=np.int64)
    price_h = price_dev_h * devices
    # cost.quote.price_work, operation for operation
    remaining_steps = facts.total_steps * (1.0 - progress)
    work_s = remaining_steps * step_s
    work_p90_s = remaining_steps * step_p90_s
    read = cm.storage_read_gb_per_s(spec.checkpoint.storage, params)
    load_s = facts.checkpoint_bytes / (np.maximum(1, nodes_t) * read * cm.GB)
    rate_s = rate_h / cm.SECONDS_PER_HOUR
    ckpt_frac = stall_s / interval_s
    pre_frac = rate_s * (interval_s / 2.0 + restart_s)
    startup_s = provisioning_s + compile_s + (load_s if progress > 0 else 0.0)
    billed_s = startup_s + work_s * (1.0 + (ckpt_frac + pre_frac))
    wait_s = np.where(rate_s > 0, params.spot_capacity_wait_s, 0.0)
    wall_s = billed_s + rate_s * work_s * wait_s
    # cost.model.pessimistic_wall_s
    base = work_p90_s * (1.0 + ckpt_frac)
    spot = rate_s > 0
    wall_p90_s = startup_s + base
    if spot.any():
        r, iv, rs = rate_s[spot], interval_s[spot], restart_s[spot]
        b = base[spot]
        mean_n = r * b * (1.0 + r * (iv / 2.0 + rs))
        k = poisson_quantiles(mean_n, params.deadline_quantile).astype(float)
        lost = k * iv / 2.0 + _Z * iv * np.sqrt(k / 12.0)
        wall_p90_s[spot] = startup_s[spot] + b + lost + k * (rs + wait_s[spot])
    cost_usd = price_h * billed_s / cm.SECONDS_PER_HOUR
    # reasons in words (cost.quote.work_reason; the deadline is the scheduler's, checked later): those rows
    # are priced again the reference way
    words = pre_frac >= 1.0
    dl = facts.deadline_s
    if dl is not None:
        words |= wall_p90_s > dl
    budget = spec.objective.budget_usd
    if budget is not None:
        words |= cost_usd > budget
    limit = spec.resources.accelerator_hours
    if limit is not None:
        words |= devices * billed_s / cm.SECONDS_PER_HOUR > limit
    hours = wall_s / cm.SECONDS_PER_HOUR
    p90_h = wall_p90_s / cm.SECONDS_PER_HOUR
    p90_h = np.where(p90_h != 0.0, p90_h, hours)  # to_candidate: ``expected_hours_p90 or expected_hours``
    objective = cost_usd.copy()
    reserved = np.fromiter((m == "reserved" for m in markets), dtype=bool, count=len(markets))[at_pool]
    if reserved.any():
        objective[reserved] = (
            cost_usd[reserved] * config.reserved_cost_factor + 1e-3 * hours[reserved] * devices[reserved]
        )
    if time_value is not None:
        objective = objective + time_value * hours
    finish_s = 0.0 + p90_h * 3600.0
    nodes = np.maximum(nodes_t, 1)
    dpn = np.fromiter((p.devices_per_node for p in pools), dtype=np.int64, count=len(pools))[at_pool]
    return {
        "devices": devices,
        "nodes": nodes,
        "capacity": np.where(nodes > 1, nodes * dpn, devices),
        "cost": cost_usd,
        "hours": hours,
        "p90": p90_h,
        "step": step_s,
        "price_h": price_h,
        "interval": interval_s,
        "finish": finish_s,
        "objective": objective,
        "words": words,
    }
