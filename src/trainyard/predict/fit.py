"""Fitting efficiency parameters to measurements, leave-one-model-out evaluation, and feedback.

- :func:`fit_calibration` fits :class:`EfficiencyParams` per (family, stack, precision) group by
  regularised least squares on ``log(predicted / measured)`` step times (priors keep groups with few rows
  sensible), then per accelerator where one has enough rows of its own — on dense-model rows only; then
  the family's MoE term (``moe_eff``, routed-expert matmul efficiency) on its MoE rows with the dense
  parameters fixed, so MoE rows never move the dense calibration.
- :func:`leave_one_model_out` refits without each model in turn and predicts that model's rows: the
  error it reports is never measured on rows the parameters were tuned on. Its residuals give the p10/p90
  bands of the packaged calibration.
- :func:`ingest_measurement` is the feedback API: (spec, accelerator, devices, measured step time) in, an
  updated :class:`Calibration` out (pure; persisting it is the caller's business).
- :func:`calibrate_from_profiles` fits the ``cpu`` parameters to profiles of this machine.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from trainyard.catalog.accelerators import Accelerator, get_accelerator
from trainyard.predict import engine
from trainyard.predict.calib_data import CalibrationRow
from trainyard.predict.model import _candidates, _context, predict, shares_host
from trainyard.predict.params import (
    PRIORS,
    Calibration,
    EfficiencyParams,
    Measurement,
    correction_key,
    stack_of,
)
from trainyard.predict.workload import compute_dtype
from trainyard.spec.models import JobSpec

# (name, log-space prior sigma, lower bound, upper bound)
_FREE = {
    "mm_max": (0.6, 0.05, 0.98),
    "dim_knee": (2.0, 1.0, 1e4),
    "token_knee": (2.0, 1.0, 1e5),
    "attn_ratio": (1.0, 0.05, 2.0),
    "layer_overhead_s": (2.0, 1e-7, 1e-1),
    "comm_eff": (0.5, 0.1, 1.0),
    "overlap": (0.5, 0.05, 1.0),
    "mem_eff": (0.5, 0.1, 1.0),
}


def _free_for(n_rows: int) -> tuple[str, ...]:
    """The parameters a group of ``n_rows`` measurements fits (the rest stay at their priors)."""
    if n_rows >= 12:
        return tuple(_FREE)
    if n_rows >= 5:
        return ("mm_max", "attn_ratio", "layer_overhead_s", "comm_eff")
    if n_rows >= 3:
        # A stack with a handful of published runs (Neuron: four) still fits the width knee next to the
        # cap: its runs differ in tensor degree (Neuron's 4- and 16-chip tensor groups), i.e. in the
        # per-device width the knee acts on.
        return ("mm_max", "dim_knee")
    return ("mm_max",)


@dataclass
class _Prepared:
    """A measurement with its workload and plan candidates resolved, ready to re-time cheaply."""

    label: str
    w: Any
    cand: dict[str, np.ndarray]
    topo: engine.Topology
    hw: engine.Hardware
    pins: engine.Pins
    measured_s: float

    def time(self, p: EfficiencyParams) -> float:
        ev = engine.evaluate(self.w, self.cand, self.topo, self.hw, p, self.pins)
        fits = ev.memory_bytes <= self.hw.memory_bytes
        t = np.where(fits, ev.step_time_s, np.inf) if fits.any() else ev.step_time_s
        return float(np.min(t))


def _prepare(
    spec: JobSpec,
    acc: Accelerator,
    devices: int,
    measured_s: float,
    *,
    plan: dict[str, Any] | None = None,
    stack: str | None = None,
    fast_domain_devices: int | None = None,
    inter_node_gbps: float | None = None,
    calibration: Calibration | None = None,
    label: str = "",
    devices_per_node: int | None = None,
) -> _Prepared:
    ctx, _, _, _ = _context(
        spec,
        acc,
        devices_per_node=devices_per_node,
        inter_node_gbps=inter_node_gbps,
        calibration=calibration or Calibration(params={}),
        stack=stack,
        plan=plan,
        fast_domain_devices=fast_domain_devices,
    )
    topo, cand = _candidates(ctx, devices)
    if not cand:
        raise ValueError(f"{label}: no plan matches the published configuration")
    return _Prepared(label, ctx.w, cand, topo, ctx.hw, ctx.pins, measured_s)


def prepare_row(row: CalibrationRow) -> _Prepared:
    return _prepare(
        row.spec,
        get_accelerator(row.accelerator),
        row.devices,
        row.measured_step_time_s,
        plan=row.plan,
        stack=row.stack,
        fast_domain_devices=row.fast_domain_devices,
        inter_node_gbps=row.inter_node_gbps,
        label=f"{row.model_name}@{row.accelerator}x{row.devices}",
    )


def _to_vec(p: EfficiencyParams, free: Sequence[str]) -> np.ndarray:
    return np.array([math.log(getattr(p, k)) for k in free])


def _from_vec(base: EfficiencyParams, free: Sequence[str], x: np.ndarray) -> EfficiencyParams:
    values: dict[str, Any] = {k: float(math.exp(v)) for k, v in zip(free, x, strict=True)}
    return replace(base, **values)


def fit_params(
    prepared: Sequence[_Prepared],
    prior: EfficiencyParams,
    free: Sequence[str],
    *,
    key: str,
    prior_scale: float = 1.0,
    upper: dict[str, float] | None = None,
) -> EfficiencyParams:
    """Regularised least squares in log space around ``prior`` (``upper`` overrides upper bounds)."""
    if not prepared or not free:
        return replace(prior, key=key, n_rows=len(prepared))
    x0 = _to_vec(prior, free)
    sig = np.array([_FREE[k][0] * prior_scale for k in free])
    lo = np.array([math.log(_FREE[k][1]) for k in free])
    hi = np.array([math.log((upper or {}).get(k, _FREE[k][2])) for k in free])
    x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)
    meas = np.array([r.measured_s for r in prepared])

    def resid(x: np.ndarray) -> np.ndarray:
        p = _from_vec(prior, free, x)
        pred = np.array([r.time(p) for r in prepared])
        return np.concatenate([np.log(pred / meas), (x - x0) / sig])

    sol = least_squares(resid, x0, bounds=(lo, hi), method="trf", x_scale=1.0, max_nfev=60 * len(free))
    return replace(_from_vec(prior, free, sol.x), key=key, n_rows=len(prepared))


# An accelerator with this many rows of its own in a group gets its own parameters (TPU v5e and v5p have
# 5-7 MaxText rows each, 3-6 of them left when one model is held out).
MIN_ROWS_ACCELERATOR = 3


def _group_key(row: CalibrationRow) -> str:
    return row.group


# Candidate widths of the per-accelerator fits' prior, as multiples of the group fit's own widths. Which
# one a calibration uses is chosen by cross-validation over models inside the rows it is fitted on
# (:func:`choose_accelerator_prior_scale`), never by the rows it will be scored on.
ACCELERATOR_PRIOR_SCALES = (1.0, 2.0, 4.0)
PRIOR_SCALE_FOLDS = 4


def fit_calibration(
    rows: Iterable[CalibrationRow],
    *,
    base: Calibration | None = None,
    min_rows_accelerator: int = MIN_ROWS_ACCELERATOR,
    version: str = "fitted",
    prepared: dict[int, _Prepared] | None = None,
    accelerator_prior_scale: float | None = 1.0,
) -> Calibration:
    """Fit parameters per (family, stack, precision) group, then per accelerator with enough rows.

    ``accelerator_prior_scale`` widens the per-accelerator fits' prior around their group's values
    (1.0: the group fit's own widths); ``None`` chooses it from :data:`ACCELERATOR_PRIOR_SCALES` by
    cross-validation over the models of ``rows`` (:func:`choose_accelerator_prior_scale`)."""
    rows = list(rows)
    prep = prepared if prepared is not None else {}
    for r in rows:
        if r.index not in prep:
            prep[r.index] = prepare_row(r)
    if accelerator_prior_scale is None:
        accelerator_prior_scale, _ = choose_accelerator_prior_scale(
            rows, prepared=prep, base=base, min_rows_accelerator=min_rows_accelerator
        )
    moe_rows = [r for r in rows if r.is_moe]
    rows = [r for r in rows if not r.is_moe]
    by_group: dict[str, list[CalibrationRow]] = defaultdict(list)
    for r in rows:
        by_group[_group_key(r)].append(r)
    params: dict[str, EfficiencyParams] = dict(base.params) if base else {}
    # bf16 groups first: other precisions of the same family start from them.
    order = sorted(by_group, key=lambda g: (not g.endswith("/bf16"), -len(by_group[g])))
    for g in order:
        grows = by_group[g]
        family, stack, _prec = g.split("/")
        # Another precision on one accelerator (the FP8 and FP16 rows) starts from that accelerator's bf16
        # parameters: FP8 recipes keep attention (and the output layer) in bf16, so their attention runs
        # as that accelerator's bf16 attention does, not as the family's average.
        accs = {r.accelerator for r in grows}
        own = params.get(f"{family}/{stack}/bf16/{next(iter(accs))}") if len(accs) == 1 else None
        prior = (
            own
            or params.get(f"{family}/{stack}/bf16")
            or next((v for k, v in params.items() if k.startswith(f"{family}/") and k.count("/") == 2), None)
            or PRIORS.get(family, PRIORS["nvidia"])
        )
        free = _free_for(len(grows))
        scale = 1.0
        params[g] = fit_params([prep[r.index] for r in grows], prior, free, key=g, prior_scale=scale)
        by_acc: dict[str, list[CalibrationRow]] = defaultdict(list)
        for r in grows:
            by_acc[r.accelerator].append(r)
        if len(by_acc) > 1:
            for acc, arows in by_acc.items():
                if len(arows) >= min_rows_accelerator:
                    params[f"{g}/{acc}"] = fit_params(
                        [prep[r.index] for r in arows],
                        params[g],
                        ("mm_max", "attn_ratio", "layer_overhead_s"),
                        key=f"{g}/{acc}",
                        prior_scale=accelerator_prior_scale,
                    )
    cal = Calibration(params=params, version=version)
    return _fit_moe(cal, moe_rows, prep)


def model_folds(rows: Iterable[CalibrationRow], folds: int) -> list[set[str]]:
    """The models of ``rows`` dealt into ``folds`` folds in sorted order (model ``i`` to fold ``i % folds``):
    every row of a model is in one fold, and the folds do not depend on the rows' order."""
    models = sorted({r.model_key for r in rows})
    k = max(1, min(folds, len(models)))
    return [set(models[i::k]) for i in range(k)]


def choose_accelerator_prior_scale(
    rows: Sequence[CalibrationRow],
    *,
    prepared: dict[int, _Prepared] | None = None,
    scales: Sequence[float] = ACCELERATOR_PRIOR_SCALES,
    folds: int = PRIOR_SCALE_FOLDS,
    base: Calibration | None = None,
    min_rows_accelerator: int = MIN_ROWS_ACCELERATOR,
) -> tuple[float, dict[float, float]]:
    """The per-accelerator prior width with the lowest median absolute error held out by model: for
    each fold of :func:`model_folds`, fit on the other folds' rows at every width of ``scales`` and
    predict the fold's rows. Returns (the width, the median error of each width); a tie goes to the
    narrower width, and with fewer than two models there is nothing to hold out and the first width is
    returned with no errors."""
    rows = list(rows)
    prep = prepared if prepared is not None else {r.index: prepare_row(r) for r in rows}
    parts = model_folds(rows, folds)
    if len(parts) < 2:
        return float(scales[0]), {}
    errors: dict[float, list[float]] = {float(s): [] for s in scales}
    for held in parts:
        train = [r for r in rows if r.model_key not in held]
        test = [r for r in rows if r.model_key in held]
        for s in errors:
            cal = fit_calibration(
                train,
                base=base,
                min_rows_accelerator=min_rows_accelerator,
                prepared=prep,
                accelerator_prior_scale=s,
            )
            errors[s].extend(abs(predict_row(cal, r, prep)[0] / r.measured_step_time_s - 1.0) for r in test)
    score = {s: float(np.median(e)) for s, e in errors.items()}
    best = min(score, key=lambda s: (score[s], s))
    return best, score


def predict_row(cal: Calibration, r: CalibrationRow, prep: dict[int, _Prepared]) -> tuple[float, str, str]:
    """A row's step time under ``cal`` with its published plan: (seconds, parameter key, source), the
    source ``fallback`` where the lookup fell back to a broader key."""
    acc = get_accelerator(r.accelerator)
    dtype = compute_dtype(r.spec.workload.precision)
    p, note = cal.lookup(acc.family, stack_of(acc, r.stack), dtype, acc.name)
    return prep[r.index].time(p), p.key, "fallback" if note else "exact"


MOE_EFF_SIGMA = 0.5  # log-space prior width of the MoE term around 1 (no MoE penalty)
MOE_EFF_BOUNDS = (0.2, 2.0)


def _row_params(cal: Calibration, r: CalibrationRow) -> EfficiencyParams:
    acc = get_accelerator(r.accelerator)
    dtype = compute_dtype(r.spec.workload.precision)
    return cal.lookup(acc.family, stack_of(acc, r.stack), dtype, acc.name)[0]


def _fit_moe(cal: Calibration, moe_rows: Sequence[CalibrationRow], prep: dict[int, _Prepared]) -> Calibration:
    """Fit one ``moe_eff`` per family to its MoE rows (dense parameters fixed) and set it on every key of
    the family; families without MoE rows keep ``moe_eff`` = 1."""
    by_family: dict[str, list[CalibrationRow]] = defaultdict(list)
    for r in moe_rows:
        by_family[r.family].append(r)
    params = dict(cal.params)
    for family, frows in by_family.items():
        base = [(_row_params(cal, r), prep[r.index]) for r in frows]
        meas = np.array([r.measured_s for _, r in base])

        def resid(
            x: np.ndarray,
            base: list[tuple[EfficiencyParams, _Prepared]] = base,
            meas: np.ndarray = meas,
        ) -> np.ndarray:
            eff = float(math.exp(x[0]))
            pred = np.array([pr.time(replace(p, moe_eff=eff)) for p, pr in base])
            return np.concatenate([np.log(pred / meas), x / MOE_EFF_SIGMA])

        lo, hi = (math.log(b) for b in MOE_EFF_BOUNDS)
        sol = least_squares(resid, np.zeros(1), bounds=([lo], [hi]), method="trf", max_nfev=60)
        eff = float(math.exp(sol.x[0]))
        for key, p in params.items():
            if key.startswith(f"{family}/"):
                params[key] = replace(p, moe_eff=eff, moe_rows=len(frows))
    return replace(cal, params=params)


@dataclass(frozen=True)
class HeldOut:
    row: CalibrationRow
    predicted_s: float
    key: str
    source: str
    accelerator_prior_scale: float = 1.0  # the per-accelerator prior width of the fit that scored it

    @property
    def ape(self) -> float:
        return abs(self.predicted_s / self.row.measured_step_time_s - 1.0)

    @property
    def log_ratio(self) -> float:
        return math.log(self.row.measured_step_time_s / self.predicted_s)


def leave_one_model_out(
    rows: Sequence[CalibrationRow],
    *,
    accelerator_prior_scale: float | None = None,
    scales: Sequence[float] = ACCELERATOR_PRIOR_SCALES,
    folds: int = PRIOR_SCALE_FOLDS,
    progress: Callable[[str], None] | None = None,
) -> list[HeldOut]:
    """Refit without each model and predict its rows (no row is scored by parameters tuned on it). A model
    is an architecture: rows of one model published under two names are held out together.

    With ``accelerator_prior_scale=None`` (the default) each refit chooses its per-accelerator prior
    width from ``scales`` by cross-validation over its own training models in ``folds`` folds (nested:
    the held-out model takes no part in the choice); a number fixes the width for every refit."""
    prep = {r.index: prepare_row(r) for r in rows}
    out: list[HeldOut] = []
    for model in sorted({r.model_key for r in rows}):
        train = [r for r in rows if r.model_key != model]
        scale = accelerator_prior_scale
        if scale is None:
            scale, _ = choose_accelerator_prior_scale(train, prepared=prep, scales=scales, folds=folds)
        cal = fit_calibration(train, prepared=prep, version=f"lomo-{model}", accelerator_prior_scale=scale)
        for r in rows:
            if r.model_key == model:
                predicted_s, key, source = predict_row(cal, r, prep)
                out.append(HeldOut(r, predicted_s, key, source, accelerator_prior_scale=scale))
        if progress is not None:
            progress(model)
    return out


def with_residual_bands(cal: Calibration, held: Sequence[HeldOut]) -> Calibration:
    """Set each key's p10/p90 from held-out log residuals of its group (family-wide when few), from dense
    rows; the MoE band of a family from its MoE rows' held-out residuals."""
    by_group: dict[str, list[float]] = defaultdict(list)
    by_family: dict[str, list[float]] = defaultdict(list)
    moe_family: dict[str, list[float]] = defaultdict(list)
    for h in held:
        if h.row.is_moe:
            moe_family[h.row.family].append(h.log_ratio)
            continue
        by_group[h.row.group].append(h.log_ratio)
        by_family[h.row.family].append(h.log_ratio)
    out = {}
    for key, p in cal.params.items():
        mvals = moe_family.get(key.split("/")[0], [])
        if len(mvals) >= 3:
            mlo, mhi = np.quantile(mvals, [0.1, 0.9])
            p = replace(p, moe_log_resid_p10=float(min(mlo, -0.05)), moe_log_resid_p90=float(max(mhi, 0.05)))
        group = "/".join(key.split("/")[:3])
        vals = by_group.get(group, [])
        if len(vals) < 5:
            vals = by_family.get(key.split("/")[0], vals)
        if len(vals) >= 3:
            lo, hi = np.quantile(vals, [0.1, 0.9])
            out[key] = replace(p, log_resid_p10=float(min(lo, -0.03)), log_resid_p90=float(max(hi, 0.03)))
        else:
            out[key] = replace(p, log_resid_p10=-0.3, log_resid_p90=0.3)
    return replace(cal, params=out)


def summarize(held: Sequence[HeldOut]) -> dict[str, Any]:
    def md(xs: list[float]) -> float:
        return float(np.median(xs)) if xs else float("nan")

    fam: dict[str, list[float]] = defaultdict(list)
    grp: dict[str, list[float]] = defaultdict(list)
    kind: dict[str, list[float]] = defaultdict(list)
    for h in held:
        fam[h.row.family].append(h.ape)
        grp[h.row.group].append(h.ape)
        kind["moe" if h.row.is_moe else "dense"].append(h.ape)
    dense = [h for h in held if not h.row.is_moe]
    return {
        "dense_mdape": md([h.ape for h in dense]),
        "by_kind": {k: {"rows": len(v), "mdape": md(v)} for k, v in sorted(kind.items())},
        "rows": len(held),
        "mdape": md([h.ape for h in held]),
        "mean_ape": float(np.mean([h.ape for h in held])) if held else float("nan"),
        "p90_ape": float(np.quantile([h.ape for h in held], 0.9)) if held else float("nan"),
        "by_family": {f: {"rows": len(v), "mdape": md(v)} for f, v in sorted(fam.items())},
        "by_group": {g: {"rows": len(v), "mdape": md(v)} for g, v in sorted(grp.items())},
    }


# ---- feedback -----------------------------------------------------------------------------------------

FEEDBACK_PRIOR_WEIGHT = 2.0  # pseudo-measurements at factor 1.0: one noisy step time moves the factor halfway


def ingest_measurement(
    calibration: Calibration,
    spec: JobSpec,
    accelerator: Accelerator,
    devices: int,
    measured_step_time_s: float,
    *,
    label: str = "",
    **predict_kwargs: Any,
) -> Calibration:
    """Fold a measured step time into the calibration and return the updated calibration (pure).

    Each (family, stack, precision, accelerator) key keeps a multiplicative correction: the geometric
    mean of measured/predicted ratios of all its measurements, shrunk toward 1 by a prior weight. A gang
    whose ranks share one host (CPU devices of the local pool, ``model.shares_host``) is measured under a
    key of its device count (``params.correction_key``: ``.../cpu/x2``), shrunk toward the one-device
    correction: how 2 ranks contend for a host's cores says nothing about one rank's speed, and the
    reverse.
    """
    if not (measured_step_time_s > 0 and math.isfinite(measured_step_time_s)):
        raise ValueError("measured_step_time_s must be a positive number")
    base = replace(calibration, corrections={})
    pred = predict(spec, accelerator, devices, calibration=base, search_min_devices=False, **predict_kwargs)
    if not math.isfinite(pred.step_time_s):
        raise ValueError(f"no plan for {devices} x {accelerator.name}: {pred.reason}")
    st = stack_of(accelerator, predict_kwargs.get("stack"))
    key = f"{accelerator.family}/{st}/{compute_dtype(spec.workload.precision)}/{accelerator.name}"
    prior = 0.0
    node = predict_kwargs.get("devices_per_node") or accelerator.max_devices_per_node
    if devices > 1 and shares_host(accelerator, node):
        prior = math.log(calibration.corrections.get(key, 1.0))
        key = correction_key(key, devices)
    m = Measurement(key, pred.step_time_s, measured_step_time_s, label)
    measurements = (*calibration.measurements, m)
    logs = [math.log(x.measured_step_time_s / x.predicted_step_time_s) for x in measurements if x.key == key]
    factor = math.exp((sum(logs) + FEEDBACK_PRIOR_WEIGHT * prior) / (len(logs) + FEEDBACK_PRIOR_WEIGHT))
    corrections = dict(calibration.corrections)
    corrections[key] = factor
    return replace(calibration, corrections=corrections, measurements=measurements)


# ---- local profiles (CPU) -----------------------------------------------------------------------------


def calibrate_from_profiles(
    profiles: Sequence[dict[str, Any]], base: Calibration | None = None, accelerator: str = "cpu"
) -> Calibration:
    """Fit the local device's parameters to stored profiles (documents written by ``trainyard profile``).

    The profiles' measured peak FLOP/s and memory bandwidth replace the catalog figures of ``accelerator``;
    the matmul efficiency cap and per-layer overhead are then fitted to the measured one-rank step times.
    Profiles of a gang of ranks on this host (``devices`` > 1, ``trainyard profile --ranks``) then fit
    how such gangs share the host (``gang_slowdown``, and ``gang_sync_s`` when two or more were
    measured; :func:`_fit_gang_cpu`), with the one-rank parameters fixed; a gang profile that timed one
    rank back to back with the gang (``ratio_to_one_rank``) is fitted as that ratio times the one-rank
    step the fit predicts, so load that differed between the profiles does not enter.
    """
    from trainyard.spec.loader import spec_from_dict

    gangs = [p for p in profiles if int(p.get("devices") or 1) > 1]
    profiles = [p for p in profiles if int(p.get("devices") or 1) <= 1]
    if not profiles:
        raise ValueError("no one-rank profiles to calibrate from")
    base = base or Calibration(params={})
    # the newest device measurement (a gang profile carries none)
    dev: dict[str, Any] = next(
        (p["device"] for p in reversed(profiles) if p.get("device", {}).get("matmul_flops")), {}
    )
    peaks: dict[str, float] = {}
    if dev.get("matmul_flops"):
        for dt in ("fp32", "bf16", "fp16"):
            peaks[f"{dt}_flops"] = float(dev.get(f"matmul_flops_{dt}", dev["matmul_flops"]))
    if dev.get("mem_bw_bytes_s"):
        peaks["mem_bw_bytes_s"] = float(dev["mem_bw_bytes_s"])
    if dev.get("memory_gib"):
        peaks["memory_gib"] = float(dev["memory_gib"])
    cal = replace(base, peaks_override={**base.peaks_override, accelerator: peaks})
    acc = get_accelerator(accelerator)
    by_group: dict[str, list[_Prepared]] = defaultdict(list)
    for doc in profiles:
        spec = spec_from_dict(doc["spec"])
        dtype = compute_dtype(spec.workload.precision)
        group = f"{acc.family}/{stack_of(acc)}/{dtype}"
        plan = _profiled_plan(doc)
        by_group[group].append(
            _prepare(
                spec,
                acc,
                1,
                float(doc["step_time_s"]),
                plan=plan,
                calibration=cal,
                label=str(doc.get("name", "")),
            )
        )
    updates = {}
    for group, prepared in by_group.items():
        prior = cal.params.get(f"{group}/{accelerator}") or cal.params.get(group) or PRIORS["cpu"]
        p = _fit_linear_cpu(prepared, prior)
        resid = [math.log(x.measured_s / x.time(p)) for x in prepared]
        band = max(0.05, max(abs(r) for r in resid) * 2)
        updates[f"{group}/{accelerator}"] = replace(
            p,
            log_resid_p10=-band,
            log_resid_p90=band,
            n_rows=len(prepared),
            key=f"{group}/{accelerator}/profiled",
        )
    cal = cal.with_params(updates, version=f"{base.version}+profiles")
    by_group_gang: dict[str, list[_Prepared]] = defaultdict(list)
    for doc in gangs:
        spec = spec_from_dict(doc["spec"])
        ranks = int(doc["devices"])
        measured = float(doc["step_time_s"])
        plan = _profiled_plan(doc)
        if doc.get("ratio_to_one_rank"):
            # the gang relative to one rank timed back to back, on the one-rank step fitted above: the
            # machine's load while the gang was timed cancels out (it moves both alike)
            wl = spec.workload
            solo = {**plan, "micro_batch": min(wl.micro_batch or wl.global_batch, wl.global_batch)}
            one = predict(spec, acc, 1, calibration=cal, plan=solo, search_min_devices=False)
            if math.isfinite(one.step_time_s):
                measured = float(doc["ratio_to_one_rank"]) * one.step_time_s
        group = f"{acc.family}/{stack_of(acc)}/{compute_dtype(spec.workload.precision)}"
        by_group_gang[group].append(
            _prepare(
                spec,
                acc,
                ranks,
                measured,
                plan=plan,
                calibration=cal,
                label=str(doc.get("name", "")),
                devices_per_node=max(ranks, int(doc.get("host_cores") or ranks)),
            )
        )
    gang_updates = {}
    for group, prepared in by_group_gang.items():
        key = f"{group}/{accelerator}"
        p, _ = cal.lookup(acc.family, stack_of(acc), group.split("/")[2], accelerator)
        gang_updates[key] = _fit_gang_cpu(prepared, p)
    return cal.with_params(gang_updates) if gang_updates else cal


GANG_SLOWDOWN_BOUNDS = (0.5, 20.0)
GANG_SYNC_BOUNDS_S = (0.0, 1.0)


def _fit_gang_cpu(prepared: Sequence[_Prepared], p: EfficiencyParams) -> EfficiencyParams:
    """Gangs on one host's cores (``engine.host_sharing``): the step time is linear in the per-rank
    slowdown ``k`` and the cost ``s`` of one collective: ``t = rest + k * shared + s * collectives``;
    solved by bounded linear least squares on relative errors (one gang profile: ``k`` only, ``s`` at
    its prior)."""
    from scipy.optimize import lsq_linear

    rows, rhs = [], []
    for x in prepared:
        t1 = x.time(replace(p, gang_slowdown=1.0, gang_sync_s=0.0))
        t2 = x.time(replace(p, gang_slowdown=2.0, gang_sync_s=0.0))
        n_coll = (x.time(replace(p, gang_slowdown=1.0, gang_sync_s=1e-3)) - t1) / 1e-3
        shared, rest = t2 - t1, 2 * t1 - t2
        rows.append([shared / x.measured_s, n_coll / x.measured_s])
        rhs.append(1.0 - rest / x.measured_s)
    a, b = np.array(rows), np.array(rhs)
    lo_k, hi_k = GANG_SLOWDOWN_BOUNDS
    if len(prepared) < 2:
        k = (b[0] - a[0, 1] * p.gang_sync_s) / a[0, 0] if a[0, 0] > 0 else p.gang_slowdown
        return replace(p, gang_slowdown=float(np.clip(k, lo_k, hi_k)))
    sol = lsq_linear(a, b, bounds=([lo_k, GANG_SYNC_BOUNDS_S[0]], [hi_k, GANG_SYNC_BOUNDS_S[1]]))
    k, sync = sol.x
    return replace(p, gang_slowdown=float(k), gang_sync_s=float(sync))


def _profiled_plan(doc: dict[str, Any]) -> dict[str, Any]:
    """The plan a stored profile ran: its micro-batch and activation checkpointing, data parallel only."""
    return {
        "micro_batch": doc["plan"]["micro_batch"],
        "activation_checkpointing": doc["plan"]["activation_checkpointing"],
        "tensor": 1,
        "pipeline": 1,
        "fsdp": False,
    }


def _fit_linear_cpu(prepared: Sequence[_Prepared], prior: EfficiencyParams) -> EfficiencyParams:
    """On one device the step time is linear in 1/mm_max and in the fixed per-step overhead:
    ``t = T_compute / mm_max + overhead + T_rest``; solve for both by bounded linear least squares on
    relative errors (the matmul cap is relative to the profile's own measured matmul rate, itself a sample,
    so it may exceed 1). With one profile only the cap is fitted."""
    from scipy.optimize import lsq_linear

    rows, rhs = [], []
    for x in prepared:
        t1 = x.time(replace(prior, mm_max=1.0, step_overhead_s=0.0))
        t2 = x.time(replace(prior, mm_max=0.5, step_overhead_s=0.0))
        t_c, rest = t2 - t1, 2 * t1 - t2  # compute time at mm_max = 1; everything else
        rows.append([t_c / x.measured_s, 1.0 / x.measured_s])
        rhs.append(1.0 - rest / x.measured_s)
    a, b = np.array(rows), np.array(rhs)
    if len(prepared) < 2:
        u = float(b[0] / a[0, 0]) if a[0, 0] > 0 else 1.0 / prior.mm_max
        return replace(prior, mm_max=float(np.clip(1.0 / max(u, 1e-9), 0.05, 4.0)))
    sol = lsq_linear(a, b, bounds=([0.25, 0.0], [20.0, 10.0]))
    u, v = sol.x
    return replace(prior, mm_max=float(1.0 / u), step_overhead_s=float(v))
