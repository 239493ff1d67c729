"""Vectorised candidate pricing: one spec's whole pool × device-count grid priced with array maths.

:func:`spec_candidates` gives exactly the list the scalar reference gives (``candidates_for`` over every
pool, one ``price_option`` and ``to_candidate`` per (pool, device count), then the job's objective): the
same candidates, field for field, in the same order. What it does differently is how the last step of a
quote is computed. The expensive middle step, ``cost.quote.AllocationTimes`` (predictions, checkpoint
stall and interval, restart, interruptions), is still memoised per (spec base, pool class, device count) in
the :class:`~trainyard.schedule.candidates.CandidateCache`; the predictions behind it are filled with one
``predict_many`` call per accelerator and topology, as before. The pricing of the remaining work (``cost.
quote.price_work``: checkpoint and preemption fractions, expected and pessimistic wall time, dollars) and
the scheduler's own fields (``to_candidate``: p90 finish, capacity, the objective with reserved capacity at
its marginal cost and the time value) are then one numpy expression over every priced (pool, device count)
of the spec, written in the scalar code's operation order so that every number is the same IEEE double.
No ``QuoteOption`` is built on this path.

Rows the cost model or the scheduler rejects for a reason that needs words (the predictor cannot model the
combination, the model does not fit, a budget, device-hour limit, interconnect or preemption reason, a pool
without a price) go through the scalar path one by one, so their reasons are the reference's own strings.

Pure: no I/O.
"""

from __future__ import annotations

import math
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
    spec: JobSpec, pool: Pool, devices: int, acc: Any, pclass: Any, cache: CandidateCache
) -> AllocationTimes:
    """``price_option``'s memoised ``allocation_times``."""
    tk = (cache.base(spec), pclass, devices)
    t = cache.times.get(tk)
    if t is None:
        t = allocation_times(
            spec, pool, devices, acc, cache.facts(spec), predict_fn=_predict_fn(cache, spec, pool)
        )
        cache.times[tk] = t
    return t


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
    if not 0.0 <= elapsed_fraction < 1.0:
        raise ValueError(f"elapsed_fraction must be in [0, 1), got {elapsed_fraction}")
    if screened is None:
        screened = [(p, device_counts(spec, p, cache), eligibility(spec, p, cache)) for p in pools]
    if not prefetched:
        prefetch_predictions(
            spec, [(pool, counts) for pool, counts, why in screened if counts and not why], cache
        )
    time_value = config.time_value_usd_per_hour if spec.objective.minimize == Minimize.TIME else None
    slots: list[Candidate | None] = []  # in output order; None: a vectorised row
    # the vectorised rows' inputs, one entry per row
    rows_pool: list[Pool] = []
    rows: list[tuple[int, float, AllocationTimes]] = []  # (devices, price per device-hour, times)
    scalar_rows: list[tuple[int, Pool, int]] = []  # (slot, pool, devices) priced the reference way
    interconnect = spec.resources.min_interconnect_gbps is not None
    times, base = cache.times, cache.base(spec)
    for pool, counts, why in screened:
        if why or not counts:
            slots.append(_never_memo(spec, pool, counts, why, cache))
            continue
        try:
            # counts lie inside the spec's device range and the pool's shape (``candidate_device_counts``),
            # so ``screen_option`` passes them all and returns this price
            price = price_usd_per_device_hour_for(pool, reserved_discount=_PARAMS.reserved_discount)
        except PoolsFileError:
            price = None
        acc, pclass = cache.pool_class(pool)
        for devices in counts:
            t = None
            if price is not None and not interconnect:
                t = times.get((base, pclass, devices))
                if t is None:
                    t = _times(spec, pool, devices, acc, pclass, cache)
            if t is None:
                scalar_rows.append((len(slots), pool, devices))
                slots.append(None)
                continue
            if t.prediction is None or t.reason:
                slots.append(_rejected(pool, devices, t, price if price is not None else 0.0))
                continue
            rows_pool.append(pool)
            rows.append((devices, price if price is not None else 0.0, t))
            slots.append(None)
    progress = elapsed_fraction
    priced = iter(_price_rows(spec, rows_pool, rows, progress, config, cache, time_value))
    scalar_at = {slot: (pool, devices) for slot, pool, devices in scalar_rows}
    out: list[Candidate] = []
    for i, c in enumerate(slots):
        if c is None:
            hit = scalar_at.get(i)
            if hit is None:
                out.append(next(priced))  # the time value is in already
                continue
            c = _scalar(spec, hit[0], hit[1], progress, config, cache)
        if time_value is not None:
            c = _with_time_value(c, time_value)
        out.append(c)
    return out


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


def _price_rows(
    spec: JobSpec,
    pools: list[Pool],
    rows: list[tuple[int, float, AllocationTimes]],
    progress: float,
    config: SchedulerConfig,
    cache: CandidateCache,
    time_value: float | None,
) -> list[Candidate]:
    """``price_work`` + ``to_candidate`` (+ the time value) of every row at once."""
    if not rows:
        return []
    facts = cache.facts(spec)
    params = _PARAMS
    n = len(rows)
    devices = np.fromiter((r[0] for r in rows), dtype=np.int64, count=n)
    price_dev_h = np.fromiter((r[1] for r in rows), dtype=float, count=n)
    ts = [r[2] for r in rows]
    step_s = np.fromiter((t.step_s for t in ts), dtype=float, count=n)
    step_p90_s = np.fromiter((t.step_p90_s for t in ts), dtype=float, count=n)
    interval_s = np.fromiter((t.interval_s for t in ts), dtype=float, count=n)
    stall_s = np.fromiter((t.stall_s for t in ts), dtype=float, count=n)
    rate_h = np.fromiter((t.rate_h for t in ts), dtype=float, count=n)
    restart_s = np.fromiter((t.restart_s for t in ts), dtype=float, count=n)
    compile_s = np.fromiter((t.compile_s for t in ts), dtype=float, count=n)
    nodes_t = np.fromiter((t.nodes for t in ts), dtype=np.int64, count=n)
    provisioning_s = np.fromiter(
        (params.provisioning_s.get(t.accelerator.family, cm.DEFAULT_PROVISIONING_S) for t in ts),
        dtype=float,
        count=n,
    )
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
    markets = [_market(cache, p) for p in pools]
    reserved = np.fromiter((m == "reserved" for m in markets), dtype=bool, count=n)
    if reserved.any():
        objective[reserved] = (
            cost_usd[reserved] * config.reserved_cost_factor + 1e-3 * hours[reserved] * devices[reserved]
        )
    if time_value is not None:
        objective = objective + time_value * hours
    finish_s = 0.0 + p90_h * 3600.0
    out: list[Candidate] = []
    cols = zip(
        pools,
        markets,
        devices.tolist(),
        nodes_t.tolist(),
        cost_usd.tolist(),
        hours.tolist(),
        p90_h.tolist(),
        step_s.tolist(),
        price_h.tolist(),
        interval_s.tolist(),
        finish_s.tolist(),
        objective.tolist(),
        words.tolist(),
        strict=True,
    )
    for pool, market, d, nd, cost, h, h90, step, ph, iv, fin, obj, w in cols:
        if w:
            c = _scalar(spec, pool, d, progress, config, cache)
            out.append(_with_time_value(c, time_value) if time_value is not None else c)
            continue
        dpn = pool.devices_per_node
        nodes = nd if nd > 1 else 1
        out.append(
            Candidate(
                job_id="",
                tenant="",
                pool=pool.name,
                accelerator=pool.accelerator,
                devices=d,
                nodes=nodes,
                devices_per_node=dpn,
                market=market,
                expected_cost_usd=cost,
                expected_hours=h,
                expected_hours_p90=h90,
                step_time_s=step,
                price_usd_per_hour=ph,
                checkpoint_interval_s=iv if iv else 0.0,
                finish_s=fin,
                feasible=True,
                reasons=(),
                capacity_devices=nodes * dpn if nodes > 1 else d,
                objective_usd=obj,
            )
        )
    return out
