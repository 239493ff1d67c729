"""Allocation times as arrays: ``cost.quote.allocation_times`` of many (pool class, device count) rows of
one spec in one numpy pass.

:func:`time_rows_many` gives, for every row whose prediction is memoised and fits, the numbers array
pricing reads of its ``AllocationTimes`` (``grid.time_row``'s tuple: step, p90 step, interval, stall,
interruption rate, restart, compile, nodes, provisioning), computed with the scalar code's operations in
its order (measured step times and their scaling, the checkpoint stall and load, the restart, the
Young/Daly grid interval), so every number is the same IEEE double. A row that does not fit (or has no
finite step time) gets ``allocation_times``' own ``AllocationTimes``, its reason in the same words; a row
without a memoised prediction (or reference prediction) is None: the caller prices it the scalar way.

Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from trainyard.cost import model as cm
from trainyard.cost.quote import MEASURED_P90_FACTOR, AllocationTimes
from trainyard.spec.models import JobSpec

#: One row: the pool's accelerator (``cost.quote.pool_accelerator``'s), the pool's prediction group key
#: (``CandidateCache.pool_topology``: name, memory, topology), its devices per node, its interruption rate
#: per instance-hour and the device count.
TimeKey = tuple[Any, tuple[Any, ...], int, float, int]


def _finite_positive(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.isfinite(x) & (x > 0)
    return out


def time_rows_many(
    spec: JobSpec,
    keys: Sequence[TimeKey],
    shape: str,
    predictions: dict[tuple[Any, ...], Any],
    checkpoint_bytes: float,
    params: cm.CostParams = cm.DEFAULT_PARAMS,
) -> list[tuple[float, ...] | AllocationTimes | None]:
    """``grid.time_row(allocation_times(...))`` of every row of ``keys`` whose allocation fits, from the
    memoised predictions (``shape``: the spec's ``CandidateCache.shape``; ``checkpoint_bytes``: its
    ``SpecFacts``'); for a row that does not fit, ``allocation_times``' own answer (its reason); None for a
    row without a memoised prediction, to price the scalar way."""
    n = len(keys)
    out: list[tuple[float, ...] | AllocationTimes | None] = [None] * n
    if n == 0:
        return out
    measured = spec.measured.step_time_s
    d0 = spec.resources.min_devices or 1  # ``cost.quote._measured_reference_devices``
    prov_of = params.provisioning_s
    at: list[int] = []
    p_step: list[float] = []
    p_p90: list[float] = []
    p_fits: list[bool] = []
    m_step: list[float] = []  # the measured step time, nan without one
    meas_l: list[bool] = []
    ref_step: list[float] = []  # the reference count's predicted step time, nan where unread
    compile_l: list[float] = []
    prov_l: list[float] = []
    dpn_l: list[int] = []
    rate_l: list[float] = []
    dev_l: list[int] = []
    preds: list[Any] = []
    nan = float("nan")
    for k, (acc, gk, dpn, rate, d) in enumerate(keys):
        name, mem, rest = gk[0], gk[1], gk[2:]
        p = predictions.get((shape, name, mem, d, *rest))  # ``candidates._prediction_key``
        if p is None:
            continue
        m = measured.get(acc.name)
        ref = nan
        if m is not None and d != d0:
            rp = predictions.get((shape, name, mem, d0, *rest))
            if rp is None:
                continue
            ref = rp.step_time_s
        elif m is None and (not p.fits or not _positive(p.step_time_s)):
            out[k] = _rejected(acc, d, dpn, p, p.reason, p.step_time_s, p.step_time_p90_s, p.source)
            continue
        if acc.compile_required:
            c = p.compile_time_s if p.compile_time_s > 0 else acc.first_compile_s
        else:
            c = 0.0
        at.append(k)
        p_step.append(p.step_time_s)
        p_p90.append(p.step_time_p90_s)
        p_fits.append(bool(p.fits))
        m_step.append(nan if m is None else m)
        meas_l.append(m is not None)
        ref_step.append(ref)
        compile_l.append(c)
        prov_l.append(prov_of.get(acc.family, cm.DEFAULT_PROVISIONING_S))
        dpn_l.append(dpn)
        rate_l.append(rate)
        dev_l.append(d)
        preds.append(p)
    if not at:
        return out
    with np.errstate(all="ignore"):
        cols = _times_columns(
            spec, d0, np.array(p_step), np.array(p_p90), np.array(p_fits, dtype=bool),
            np.array(meas_l, dtype=bool), np.array(m_step), np.array(ref_step), np.array(compile_l),
            np.array(prov_l), np.array(dpn_l, dtype=np.int64), np.array(rate_l),
            np.array(dev_l, dtype=np.int64), checkpoint_bytes, params,
        )  # fmt: skip
    ok, table, step_s, step_p90_s = cols
    rows = table.tolist()
    for j in np.flatnonzero(ok).tolist():
        out[at[j]] = tuple(rows[j])
    for j in np.flatnonzero(~ok).tolist():
        # only measured step times get here: on their reference count with the measurement, elsewhere
        # scaled from it with the prediction's fit
        acc, _gk, dpn, _rate, d = keys[at[j]]
        p = preds[j]
        at0 = d == d0
        out[at[j]] = _rejected(
            acc, d, dpn, p, "" if at0 else p.reason, float(step_s[j]), float(step_p90_s[j]),
            "measured" if at0 else "measured-scaled",
        )  # fmt: skip
    return out


def _positive(x: float) -> bool:
    return math.isfinite(x) and x > 0


def _rejected(
    acc: Any, devices: int, dpn: int, p: Any, fit_reason: str, step_s: float, step_p90_s: float, source: str
) -> AllocationTimes:
    """``allocation_times`` of an allocation whose plan does not fit (or has no finite step time)."""
    reason = fit_reason or f"does not fit in memory on {devices} x {acc.name}"
    nodes = -(-devices // dpn)  # math.ceil(devices / devices_per_node)
    return AllocationTimes(
        acc, devices, nodes, p, reason, step_s=step_s, step_p90_s=step_p90_s, source=source
    )


def _times_columns(
    spec: JobSpec,
    d0: int,
    p_step: np.ndarray,
    p_p90: np.ndarray,
    p_fits: np.ndarray,
    meas: np.ndarray,
    m_step: np.ndarray,
    ref_step: np.ndarray,
    compile_s: np.ndarray,
    provisioning_s: np.ndarray,
    dpn: np.ndarray,
    rate_pool_h: np.ndarray,
    devices: np.ndarray,
    ckpt_bytes: float,
    params: cm.CostParams,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``allocation_times`` of every row, operation for operation: whether it fits (with a finite step
    time), the ``time_row`` columns (one row each), and the step time and its p90 as a row that does not
    fit reports them."""
    at0 = meas & (devices == d0)
    # Step time: measured where the spec names this accelerator (scaled by the predictor from the
    # reference count, linearly where it has no usable scaling), else the predictor's.
    usable = _finite_positive(p_step) & _finite_positive(ref_step)
    scale = np.where(usable, p_step / ref_step, d0 / devices)
    p90_ratio = np.where(usable & _finite_positive(p_p90), p_p90 / p_step, MEASURED_P90_FACTOR)
    scaled = m_step * scale
    scaled_p90 = scaled * np.maximum(p90_ratio, MEASURED_P90_FACTOR)
    step_s = np.where(at0, m_step, np.where(meas, scaled, p_step))
    step_p90_s = np.where(at0, m_step * MEASURED_P90_FACTOR, np.where(meas, scaled_p90, p_p90))
    fits = at0 | p_fits
    ok = fits & _finite_positive(step_s)
    reported_p90_s = step_p90_s
    step_p90_s = np.where(~_finite_positive(step_p90_s) | (step_p90_s < step_s), step_s, step_p90_s)
    # Checkpoint and preemption.
    nodes = -(-devices // dpn)  # math.ceil(devices / devices_per_node)
    url = spec.checkpoint.storage
    if params.async_checkpoint:
        stall_s = ckpt_bytes / (np.maximum(1, devices) * params.host_copy_gb_per_s * cm.GB)
    else:
        write = cm.storage_write_gb_per_s(url, params)
        stall_s = ckpt_bytes / (np.maximum(1, nodes) * write * cm.GB)
    read = cm.storage_read_gb_per_s(url, params)
    load_s = ckpt_bytes / (np.maximum(1, nodes) * read * cm.GB)
    restart_s = provisioning_s + load_s + compile_s
    rate_h = rate_pool_h * nodes
    interval_s = choose_intervals_s(spec.checkpoint.interval_s, stall_s, rate_h / cm.SECONDS_PER_HOUR, params)
    table = np.column_stack(
        (step_s, step_p90_s, interval_s, stall_s, rate_h, restart_s, compile_s, nodes.astype(float),
         provisioning_s)
    )  # fmt: skip
    return ok, table, step_s, reported_p90_s


def choose_intervals_s(
    pinned_s: float | None, checkpoint_s: np.ndarray, rate_per_s: np.ndarray, params: cm.CostParams
) -> np.ndarray:
    """``cost.model.choose_interval_s`` of every row: the pinned interval, the cap without interruptions,
    else the grid point around Young/Daly with the least overhead (the lower one on a tie)."""
    if pinned_s is not None:
        return np.full(checkpoint_s.shape, pinned_s, dtype=float)
    lo, hi = params.min_interval_s, params.max_interval_s
    with np.errstate(all="ignore"):
        tau = np.minimum(np.sqrt(2.0 * np.maximum(checkpoint_s, 0.0) / rate_per_s), hi)
        coarse = params.interval_coarse_above_s
        g = np.where(tau >= coarse, params.interval_coarse_granularity_s, params.interval_granularity_s)
        down = np.floor(tau / g) * g
        up = np.ceil(tau / g) * g
        up = np.where((tau < coarse) & (coarse <= up), coarse, up)
        down = np.minimum(np.maximum(down, lo), hi)
        up = np.minimum(np.maximum(up, lo), hi)
        # ``min`` over the sorted neighbours by overhead: the lower one unless the upper one is strictly less
        cost_up = checkpoint_s / up + rate_per_s * up / 2.0
        cost_down = checkpoint_s / down + rate_per_s * down / 2.0
        pick = np.where(cost_up < cost_down, up, down)
    out: np.ndarray = np.where(rate_per_s > 0, np.where(tau >= hi, hi, np.where(tau <= lo, lo, pick)), hi)
    return out
