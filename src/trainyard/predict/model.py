"""The predictor's entry point: step time, memory, plan and uncertainty per accelerator and device count.

``predict(spec, accelerator, devices)`` is what the cost model, the scheduler and the CLI call. It
1. turns the spec into per-token workload math (:mod:`trainyard.predict.workload`),
2. enumerates the parallelism plans the device count and topology allow, honouring the spec's pins,
3. evaluates memory and step time of every plan (:mod:`trainyard.predict.engine`) with the efficiency
   parameters calibrated for the accelerator's (family, stack, precision) (:mod:`trainyard.predict.params`),
4. returns the fastest plan that fits, or ``fits: false`` with the reason and the smallest device count
   that fits.
Pure: no I/O besides the packaged calibration data.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from trainyard.catalog.accelerators import Accelerator
from trainyard.predict import engine
from trainyard.predict.engine import GIB, Hardware, Pins, Topology
from trainyard.predict.params import (
    FAST_DOMAIN_DEVICES,
    HEADROOM_FRACTION,
    WORKSPACE_GIB,
    Calibration,
    EfficiencyParams,
    PlanSpace,
    default_calibration,
    plan_space_of,
    stack_of,
)
from trainyard.predict.workload import Workload, compute_dtype, training_flops_per_step, workload_of
from trainyard.spec.models import ActivationCheckpointing, JobSpec, ParallelismPin

__all__ = ["Prediction", "predict", "predict_grouped", "predict_many", "training_flops_per_step"]

MAX_SEARCH_DEVICES = 1 << 20


@dataclass(frozen=True)
class Prediction:
    accelerator: str
    devices: int
    step_time_s: float
    tokens_per_s: float
    mfu: float
    memory_per_device_gib: float
    fits: bool
    plan: dict[str, Any]
    reason: str = ""
    step_time_p10_s: float = 0.0
    step_time_p90_s: float = 0.0
    compile_time_s: float = 0.0
    min_devices_to_fit: int | None = None
    source: str = "analytic"  # "calibrated", "family-fallback", "prior", "measured"
    notes: list[str] = field(default_factory=list)
    hfu: float = 0.0  # hardware FLOPs utilisation (includes recomputation)
    model_flops_per_step: float = 0.0
    memory_capacity_gib: float = 0.0  # usable memory per device (after workspace and headroom)
    # compute_s, comm_exposed_s (includes all_to_all_s), bubble_s, all_to_all_s (MoE expert parallelism);
    # memory per device by term: memory_states_gib, memory_fsdp_buffers_gib, memory_activations_gib,
    # memory_logits_gib, memory_loss_chunk_gib (the fp32 block of the chunked loss); they sum to
    # memory_per_device_gib
    breakdown: dict[str, float] = field(default_factory=dict)
    calibration_key: str = ""

    def to_contract(self) -> dict[str, Any]:
        """The DESIGN §3.3 `predict --json` document."""
        return {
            "accelerator": self.accelerator,
            "devices": self.devices,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "memory_per_device_gib": self.memory_per_device_gib,
            "fits": self.fits,
            "plan": self.plan,
            "reason": self.reason,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Context:
    w: Workload
    acc: Accelerator
    params: EfficiencyParams
    hw: Hardware
    node: int
    fast_domain: int
    intra_gbs: float
    inter_gbs: float
    tp_cap: int
    pins: Pins
    space: PlanSpace  # what the software stack runs (``params.STACK_PLAN_SPACE``)
    # Device counts already checked for a fitting plan (the smallest-fitting search of every device count
    # of a sweep revisits the same counts); never part of equality.
    fits_memo: dict[int, bool] = field(default_factory=dict, compare=False, repr=False)


def _pins_from_spec(spec: JobSpec, override: dict[str, Any] | None) -> Pins:
    wl = spec.workload
    tensor = pipeline = expert = None
    fsdp: bool | None = None
    if isinstance(wl.parallelism, ParallelismPin):
        tensor, pipeline, fsdp = wl.parallelism.tensor, wl.parallelism.pipeline, wl.parallelism.fsdp
        expert = wl.parallelism.expert
    ck = None
    if wl.activation_checkpointing != ActivationCheckpointing.AUTO:
        ck = engine.CK_NAMES.index(wl.activation_checkpointing.value)
    pins = Pins(
        tensor=tensor,
        pipeline=pipeline,
        fsdp=fsdp,
        micro_batch=wl.micro_batch,
        checkpointing=ck,
        expert=expert,
    )
    if override:
        scope = override.get("fsdp_scope")
        pins = Pins(
            tensor=override.get("tensor", pins.tensor),
            pipeline=override.get("pipeline", pins.pipeline),
            fsdp=override.get("fsdp", pins.fsdp),
            micro_batch=override.get("micro_batch", pins.micro_batch),
            checkpointing=(
                engine.CK_NAMES.index(override["activation_checkpointing"])
                if "activation_checkpointing" in override
                else pins.checkpointing
            ),
            virtual_stages=int(override.get("virtual_stages", 1)),
            context=int(override.get("context", 1)),
            fsdp_scope=engine.FSDP_NAMES.index(scope) if scope else None,
            expert=override.get("expert", pins.expert),
            routing=str(override.get("routing", "uniform")),
            tp_overlap=bool(override.get("tp_overlap", False)),
            pipeline_flushes=int(override.get("pipeline_flushes", 1)),
            distributed_optimizer=bool(override.get("distributed_optimizer", False)),
            fp8_params=bool(override.get("fp8_params", False)),
            bf16_states=bool(override.get("bf16_states", False)),
        )
    return pins


def _hardware(acc: Accelerator, dtype: str, calibration: Calibration, params: EfficiencyParams) -> Hardware:
    over = calibration.peaks_override.get(acc.name, {})
    peak = over.get(f"{dtype}_flops") or over.get("fp32_flops") if over else None
    peak_flops = float(peak) if peak else acc.peak_flops(dtype)
    bw = float(over.get("mem_bw_bytes_s", acc.mem_bw_gbs * 1e9)) if over else acc.mem_bw_gbs * 1e9
    mem_gib = float(over.get("memory_gib", acc.memory_gib)) if over else acc.memory_gib
    usable = mem_gib * (1 - HEADROOM_FRACTION) - WORKSPACE_GIB.get(acc.family, 1.5)
    attn_peak = peak_flops
    if dtype == "fp8":
        attn_peak = float(over.get("bf16_flops", 0.0)) if over else 0.0
        attn_peak = attn_peak or acc.peak_flops("bf16")
    return Hardware(
        peak_flops=peak_flops,
        attn_peak_flops=attn_peak,
        mem_bw_bytes_s=bw,
        memory_bytes=max(0.0, usable) * GIB,
    )


def _topology(ctx: _Context, devices: int) -> Topology:
    return Topology(
        devices=devices,
        devices_per_node=ctx.node,
        fast_domain=ctx.fast_domain,
        intra_gbs=ctx.intra_gbs,
        inter_gbs=ctx.inter_gbs,
        tp_limit=max(1, min(ctx.tp_cap, devices)),
        shared_host=shares_host(ctx.acc, ctx.node),
    )


def shares_host(accelerator: Accelerator, devices_per_node: int) -> bool:
    """Whether the devices of one node are cores of one host that a gang's ranks share: CPU "devices"
    several to a node (the local pool offers one per core; the catalog's ``cpu`` is a whole host)."""
    return accelerator.family == "cpu" and devices_per_node > 1


def _candidates(ctx: _Context, devices: int) -> tuple[Topology, dict[str, np.ndarray]]:
    topo = _topology(ctx, devices)
    sh = ctx.w.shape
    return topo, engine.enumerate_candidates(
        topo, ctx.w.global_batch, sh.n_blocks, sh.n_heads, ctx.pins, sh.experts_total, ctx.space
    )


# ``_candidates`` of recent contexts by what it reads of one (``_parts_key``; interned to a small integer
# so a lookup per device count hashes no plan pins) and the device count
_PART_KEYS: dict[tuple[Any, ...], int] = {}
_PARTS: dict[tuple[int, int], tuple[Topology, dict[str, np.ndarray]]] = {}


def _parts_of(ctx: _Context, counts: Sequence[int]) -> list[tuple[int, Topology, dict[str, np.ndarray]]]:
    """``[(n, *_candidates(ctx, n)) for n in counts]``, memoised on everything ``_candidates`` reads of the
    context (the topology's fields, the batch, layers, heads and experts, the pins and the plan space), so
    specs of one such shape on one topology share their plans."""
    sh = ctx.w.shape
    pins = ctx.pins
    # what ``engine.enumerate_candidates`` reads of the depth and the width (it narrows them the same way)
    layers = min(sh.n_blocks, 16) if pins.pipeline is None else sh.n_blocks
    heads = sh.n_heads
    if pins.tensor is None and heads > 0:
        heads = min(heads & -heads, 64)
    k0 = (
        ctx.node, ctx.fast_domain, ctx.intra_gbs, ctx.inter_gbs, ctx.tp_cap, ctx.w.global_batch, layers,
        heads, sh.experts_total, pins, ctx.space, shares_host(ctx.acc, ctx.node),
    )  # fmt: skip
    if len(_PARTS) >= 65536:
        _PART_KEYS.clear()
        _PARTS.clear()
    tok = _PART_KEYS.get(k0)
    if tok is None:
        tok = _PART_KEYS[k0] = len(_PART_KEYS)
    out = []
    for n in counts:
        hit = _PARTS.get((tok, n))
        if hit is None:
            hit = _PARTS[(tok, n)] = _candidates(ctx, n)
        out.append((n, *hit))
    return out


def _fits_at(ctx: _Context, devices: int) -> bool:
    hit = ctx.fits_memo.get(devices)
    if hit is not None:
        return hit
    _topo, cand = _candidates(ctx, devices)
    fits = bool(cand) and bool((engine.memory_bytes(ctx.w, cand, ctx.pins) <= ctx.hw.memory_bytes).any())
    ctx.fits_memo[devices] = fits
    return fits


def _min_devices(ctx: _Context, start: int) -> int | None:
    """Smallest device count above ``start`` found to fit (powers of two, then bisection), or None."""
    lo, n = start, start + 1
    while n <= MAX_SEARCH_DEVICES and not _fits_at(ctx, n):
        # Up through the powers of two (searches from different starts then share their probes).
        lo, n = n, 1 << n.bit_length()
    if n > MAX_SEARCH_DEVICES:
        return None
    hi = n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _fits_at(ctx, mid):
            hi = mid
        else:
            lo = mid
    # Device counts that divide poorly can fail where a slightly larger one fits; the answer is verified.
    return hi


def prefill_min_devices(requests: Sequence[tuple[_Context, int, Any]]) -> None:
    """Run :func:`_min_devices` of every ``(context, start, batch key)`` at once, so that the searches the
    predictions then make find every probe in their context's ``fits_memo``.

    The searches advance in lockstep, each through the probes :func:`_min_devices` makes (powers of two
    upwards, then bisection); at each step the device counts not yet memoised are checked together, one
    vectorised memory evaluation per batch key (``predict_grouped``'s groups: contexts of one key share
    their pins, hardware and efficiency parameters and have workloads ``engine.workload_rows`` can stack;
    a key ``("alone", ...)`` is evaluated context by context), instead of one evaluation per probe."""
    # per search: [context, key, phase (0: up, 1: bisect, 2: done), lo, n or hi]
    states = [[ctx, key, 0, start, start + 1] for ctx, start, key in requests]
    while True:
        probes: dict[tuple[int, int], tuple[_Context, int, Any]] = {}
        for st in states:
            ctx, key = st[0], st[1]
            memo = ctx.fits_memo
            while st[2] != 2:
                if st[2] == 0:
                    n = st[4]
                    if n > MAX_SEARCH_DEVICES:
                        st[2] = 2
                        break
                    hit = memo.get(n)
                    if hit is None:
                        probes[(id(ctx), n)] = (ctx, n, key)
                        break
                    if hit:
                        st[2] = 1
                    else:
                        st[3], st[4] = n, 1 << n.bit_length()
                else:
                    lo, hi = st[3], st[4]
                    if hi - lo <= 1:
                        st[2] = 2
                        break
                    mid = (lo + hi) // 2
                    hit = memo.get(mid)
                    if hit is None:
                        probes[(id(ctx), mid)] = (ctx, mid, key)
                        break
                    if hit:
                        st[4] = mid
                    else:
                        st[3] = mid
        if not probes:
            return
        _fits_many(list(probes.values()))


def _fits_many(probes: list[tuple[_Context, int, Any]]) -> None:
    """:func:`_fits_at` of every ``(context, device count, batch key)``, into the contexts' memos, with one
    memory evaluation per batch key."""
    by_key: dict[Any, list[tuple[_Context, int, dict[str, np.ndarray]]]] = {}
    for ctx, n, key in probes:
        _topo, cand = _candidates(ctx, n)
        if not cand:
            ctx.fits_memo[n] = False
        elif key is None or key[0] == "alone":
            mem = engine.memory_bytes(ctx.w, cand, ctx.pins)
            ctx.fits_memo[n] = bool((mem <= ctx.hw.memory_bytes).any())
        else:
            by_key.setdefault(key, []).append((ctx, n, cand))
    for members in by_key.values():
        rows = [len(c["tp"]) for _, _, c in members]
        cand_all = engine.concat_columns([c for _, _, c in members])
        w: Any = engine.workload_rows([ctx.w for ctx, _, _ in members], rows)
        ctx0 = members[0][0]
        mem = engine.memory_bytes(w, cand_all, ctx0.pins)
        starts = np.cumsum([0, *rows[:-1]])
        fits = np.logical_or.reduceat(mem <= ctx0.hw.memory_bytes, starts).tolist()
        for (ctx, n, _c), ok in zip(members, fits, strict=True):
            ctx.fits_memo[n] = bool(ok)


# ``_accelerator_part`` and ``_spec_pins`` by the identities of what they read (each entry keeps those
# objects, so an id is never reused while its entry lives)
_ACC_PARTS: dict[tuple[Any, ...], tuple[Accelerator, Calibration, Any]] = {}
_SPEC_PINS: dict[tuple[int, bool], tuple[JobSpec, Pins]] = {}


def _accelerator_part(
    accelerator: Accelerator, dtype: str, calibration: Calibration, stack: str | None
) -> tuple[tuple[str, ...], str, EfficiencyParams, str, Hardware, PlanSpace]:
    """What a context takes from the accelerator, precision, calibration and stack alone: its first notes,
    the stack, the efficiency parameters and their source, the hardware and the plan space (memoised on
    those objects: specs of one precision on one accelerator share them)."""
    key = (id(accelerator), id(calibration), dtype, stack)
    hit = _ACC_PARTS.get(key)
    if hit is not None and hit[0] is accelerator and hit[1] is calibration:
        out: tuple[tuple[str, ...], str, EfficiencyParams, str, Hardware, PlanSpace] = hit[2]
        return out
    notes: list[str] = []
    if not accelerator.supports_dtype(dtype):
        notes.append(f"{accelerator.name} has no {dtype} speed-up; timed at its fallback precision peak")
    st = stack_of(accelerator, stack)
    params, note = calibration.lookup(accelerator.family, st, dtype, accelerator.name)
    if note:
        notes.append(note)
    source = "calibrated" if not note else ("prior" if params.key.startswith("prior") else "family-fallback")
    hw = _hardware(accelerator, dtype, calibration, params)
    out = (tuple(notes), st, params, source, hw, plan_space_of(st))
    if len(_ACC_PARTS) >= 4096:
        _ACC_PARTS.clear()
    _ACC_PARTS[key] = (accelerator, calibration, out)
    return out


def _spec_pins(spec: JobSpec, plan: dict[str, Any] | None, space: PlanSpace) -> Pins:
    """The context's pins: the spec's (and ``plan``'s), with ZeRO-1 where the stack's data parallelism
    shards the optimizer states (memoised per spec object without ``plan``)."""
    key = (id(spec), space.zero1)
    if plan is None:
        hit = _SPEC_PINS.get(key)
        if hit is not None and hit[0] is spec:
            return hit[1]
    pins = _pins_from_spec(spec, plan)
    if space.zero1 and "distributed_optimizer" not in (plan or {}):
        # the stack's data parallelism shards master weights and optimizer moments (ZeRO-1)
        pins = dataclasses.replace(pins, distributed_optimizer=True)
    if plan is None:
        if len(_SPEC_PINS) >= 65536:
            _SPEC_PINS.clear()
        _SPEC_PINS[key] = (spec, pins)
    return pins


def _context(
    spec: JobSpec,
    accelerator: Accelerator,
    *,
    devices_per_node: int | None,
    inter_node_gbps: float | None,
    calibration: Calibration,
    stack: str | None,
    plan: dict[str, Any] | None,
    fast_domain_devices: int | None = None,
) -> tuple[_Context, list[str], str, str]:
    w = workload_of(spec)
    dtype = compute_dtype(spec.workload.precision)
    first_notes, st, params, source, hw, space = _accelerator_part(accelerator, dtype, calibration, stack)
    notes = list(first_notes)
    node = devices_per_node or accelerator.max_devices_per_node
    fast = fast_domain_devices or max(node, FAST_DOMAIN_DEVICES.get(accelerator.name, node))
    tp_cap = 16 if accelerator.family == "google-tpu" else node
    if accelerator.family == "aws-trainium":
        tp_cap = min(node, 16)
    pins = _spec_pins(spec, plan, space)
    ctx = _Context(
        w=w,
        acc=accelerator,
        params=params,
        hw=hw,
        node=node,
        fast_domain=fast,
        intra_gbs=accelerator.intra_node_gbs / 2.0,
        inter_gbs=(inter_node_gbps if inter_node_gbps is not None else accelerator.inter_node_gbps) / 8.0,
        tp_cap=max(tp_cap, (plan or {}).get("tensor", 1)),
        pins=pins,
        space=space,
    )
    return ctx, notes, source, st


def _infeasible_reason(ctx: _Context, devices: int) -> str:
    pins = ctx.pins
    space = ctx.space
    if pins.pipeline is not None and pins.pipeline > 1 and not space.pipeline:
        return (
            f"pipeline parallel {pins.pipeline} is not in the {space.name} stack's plan space "
            f"({space.describe()}): no pipeline stages"
        )
    if pins.tensor is not None and pins.tensor > 1 and not space.tensor:
        return (
            f"tensor parallel {pins.tensor} is not in the {space.name} stack's plan space "
            f"({space.describe()})"
        )
    fsdp_pinned = pins.fsdp is True or pins.fsdp_scope in (engine.FSDP_GLOBAL, engine.FSDP_HYBRID)
    if fsdp_pinned and not space.fsdp:
        return (
            f"FSDP is not in the {space.name} stack's plan space ({space.describe()}): it shards only "
            "the optimizer states over data parallel"
        )
    if pins.tensor is not None and pins.tensor > ctx.tp_cap:
        return (
            f"tensor parallel {pins.tensor} exceeds the {ctx.tp_cap} devices of one {ctx.acc.name} node "
            "(tensor parallel stays inside a node's fast interconnect)"
        )
    if pins.tensor is not None and ctx.w.shape.n_heads % pins.tensor:
        return f"tensor parallel {pins.tensor} does not divide the {ctx.w.shape.n_heads} attention heads"
    tp, pp = pins.tensor or 1, pins.pipeline or 1
    if devices % (tp * pp * pins.context):
        return f"{devices} devices are not a multiple of tensor {tp} x pipeline {pp}"
    if pins.pipeline is not None and pins.pipeline > ctx.w.shape.n_blocks:
        return f"pipeline {pins.pipeline} exceeds the {ctx.w.shape.n_blocks} layers"
    if pins.expert is not None and pins.expert > 1:
        if ctx.w.shape.experts_total % pins.expert:
            return f"expert parallel {pins.expert} does not divide the {ctx.w.shape.experts_total} experts"
        dp = devices // (tp * pp * pins.context)
        if dp % pins.expert:
            return (
                f"expert parallel {pins.expert} does not divide the data-parallel degree {dp} "
                f"({devices} devices / tensor {tp} x pipeline {pp}); experts are split over "
                "data-parallel ranks"
            )
    return (
        f"global_batch {ctx.w.global_batch} cannot keep {devices} devices busy with the allowed "
        "tensor/pipeline degrees (data parallel degree would exceed the batch)"
    )


PLAN_NOT_EXECUTABLE = "plan not executable by the built-in trainer; user code required"


def builtin_trainer_gap(spec: JobSpec, plan: dict[str, Any]) -> str:
    """Why the built-in trainer cannot run ``plan`` (it executes data parallel, FSDP, micro-batching
    and activation checkpointing; tensor and pipeline parallel are prediction only), or "" when it can
    or when the job brings its own code (``entrypoint``)."""
    if spec.entrypoint is not None:
        return ""
    tp, pp = int(plan.get("tensor") or 1), int(plan.get("pipeline") or 1)
    if tp <= 1 and pp <= 1:
        return ""
    return f"{PLAN_NOT_EXECUTABLE} (tensor {tp}, pipeline {pp})"


def mark_executability(spec: JobSpec, options: Sequence[Any]) -> list[Any]:
    """Feasible options whose plan the built-in trainer cannot run (tensor/pipeline parallel, no
    entrypoint) say so in their reason: "plan not executable by the built-in trainer; user code
    required"; they stay feasible (a job with its own entrypoint runs them)."""
    import dataclasses

    out = []
    for opt in options:
        pred = getattr(opt, "prediction", None)
        gap = builtin_trainer_gap(spec, pred.plan) if opt.feasible and pred is not None else ""
        out.append(dataclasses.replace(opt, reason=gap) if gap and not opt.reason else opt)
    return out


def predict(
    spec: JobSpec,
    accelerator: Accelerator,
    devices: int,
    *,
    devices_per_node: int | None = None,
    inter_node_gbps: float | None = None,
    calibration: Calibration | None = None,
    stack: str | None = None,
    plan: dict[str, Any] | None = None,
    fast_domain_devices: int | None = None,
    search_min_devices: bool = True,
) -> Prediction:
    """Predict step time, memory and the parallelism plan of ``spec`` on ``devices`` × ``accelerator``.

    ``devices_per_node`` / ``inter_node_gbps`` describe the pool's topology (defaults from the catalog);
    ``calibration`` replaces the packaged one (e.g. after feedback or local profiles); ``stack`` names a
    non-default software stack (e.g. ``xla`` on NVIDIA); ``plan`` fixes plan fields beyond the spec's pins
    (``tensor``, ``pipeline``, ``expert``, ``fsdp``, ``fsdp_scope``, ``micro_batch``,
    ``activation_checkpointing``, ``virtual_stages``, ``context``, ``pipeline_flushes``) — used to replay
    published configurations;
    ``fast_domain_devices`` sets how many devices share the fast interconnect (e.g. one TPU slice).
    """
    if devices < 1:
        raise ValueError("devices must be >= 1")
    cal = calibration if calibration is not None else default_calibration()
    ctx, notes, source, st = _context(
        spec,
        accelerator,
        devices_per_node=devices_per_node,
        inter_node_gbps=inter_node_gbps,
        calibration=cal,
        stack=stack,
        plan=plan,
        fast_domain_devices=fast_domain_devices,
    )
    topo, cand = _candidates(ctx, devices)
    ev = engine.evaluate(ctx.w, cand, topo, ctx.hw, ctx.params, ctx.pins) if cand else None
    return _finalize(
        spec,
        accelerator,
        devices,
        ctx,
        cal,
        notes,
        source,
        st,
        cand,
        ev,
        dict(
            devices_per_node=devices_per_node,
            inter_node_gbps=inter_node_gbps,
            stack=stack,
            plan=plan,
            fast_domain_devices=fast_domain_devices,
        ),
        search_min_devices,
    )


def _finalize(
    spec: JobSpec,
    accelerator: Accelerator,
    devices: int,
    ctx: _Context,
    cal: Calibration,
    notes: list[str],
    source: str,
    st: str,
    cand: dict[str, np.ndarray],
    ev: engine.Evaluation | None,
    kwargs: dict[str, Any],
    search_min_devices: bool,
    ref_step_s: float | None = None,
    chosen: tuple[int, bool, float] | None = None,
    model_flops: float | None = None,
    dtype: str | None = None,
) -> Prediction:
    """Pick the fastest fitting plan of an evaluated candidate set and build the prediction.

    ``ref_step_s``: the step time the predictor gives the spec's measured reference device count on this
    accelerator and topology (what a measured step time is scaled from), when the caller has it already;
    otherwise it is predicted here. ``chosen``: :func:`_chosen_plan`'s answer, when the caller has it
    (``engine.chosen_plans`` over many candidate sets); ``model_flops``: ``training_flops_per_step(spec)``;
    ``dtype``: ``compute_dtype(spec.workload.precision)``."""
    w = ctx.w
    if dtype is None:
        dtype = compute_dtype(spec.workload.precision)
    if model_flops is None:
        model_flops = training_flops_per_step(spec)
    capacity_gib = ctx.hw.memory_bytes / GIB
    compile_s = accelerator.first_compile_s
    if compile_s:
        notes.append(f"one-off {st.upper()} compile of about {compile_s:.0f} s, not included in step time")
    key = ctx.params.key
    if not cand:
        min_fit = _min_devices(ctx, devices) if search_min_devices else None
        if min_fit is not None and min_fit <= devices:
            min_fit = None
        return Prediction(
            accelerator=accelerator.name,
            devices=devices,
            step_time_s=math.inf,
            tokens_per_s=0.0,
            mfu=0.0,
            memory_per_device_gib=math.inf,
            fits=False,
            plan={},
            reason=_infeasible_reason(ctx, devices),
            compile_time_s=compile_s,
            min_devices_to_fit=min_fit,
            source=source,
            notes=notes,
            model_flops_per_step=model_flops,
            memory_capacity_gib=capacity_gib,
            calibration_key=key,
        )
    assert ev is not None
    i, fits, step = (
        chosen if chosen is not None else _chosen_plan(ctx, cal, accelerator, st, dtype, ev, devices)
    )
    lo_f, hi_f = math.exp(ctx.params.log_resid_p10), math.exp(ctx.params.log_resid_p90)
    if w.shape.is_moe:
        # MoE: the wider of the dense band and the held-out MoE residuals' band.
        lo_f = min(lo_f, math.exp(ctx.params.moe_log_resid_p10))
        hi_f = max(hi_f, math.exp(ctx.params.moe_log_resid_p90))
        if not ctx.params.moe_rows:
            notes.append(
                f"{accelerator.name}: no MoE measurements for this family; expert matmuls uncalibrated"
            )
    measured = spec.measured.step_time_s.get(accelerator.name)
    if measured is not None:
        ref = spec.resources.min_devices or 1
        if ref == devices:
            scale = 1.0
        else:
            if ref_step_s is None:
                ref_step_s = predict(
                    spec.model_copy(update={"measured": type(spec.measured)()}),
                    accelerator,
                    ref,
                    calibration=cal,
                    search_min_devices=False,
                    **kwargs,
                ).step_time_s
            scale = step / ref_step_s if math.isfinite(ref_step_s) else 1.0
        step = measured * scale
        lo_f, hi_f = 0.95, 1.05
        source = "measured"
        notes.append(f"step time from spec.measured ({measured} s on {ref} x {accelerator.name})")
    mem_gib = float(ev.memory_bytes[i]) / GIB
    if ctx.pins.micro_batch is not None and int(cand["mb"][i]) < ctx.pins.micro_batch:
        notes.append(
            f"micro_batch {ctx.pins.micro_batch} exceeds a replica's {int(cand['b_local'][i])} sequences; "
            f"clamped to {int(cand['mb'][i])}"
        )
    peak = ctx.hw.peak_flops
    plan_doc = engine.plan_dict(cand, i, ctx.pins, ev)
    reason = ""
    min_fit = None
    if not fits:
        min_fit = _min_devices(ctx, devices) if search_min_devices else None
        where = f"at least {min_fit} devices fit" if min_fit else "no device count up to 2^20 fits"
        reason = (
            f"needs {mem_gib:.1f} GiB per device with the leanest plan on {devices} x {accelerator.name} "
            f"({capacity_gib:.1f} GiB usable of {accelerator.memory_gib:.0f} GiB); {where}"
        )
    gap = builtin_trainer_gap(spec, plan_doc) if fits else ""
    if gap:
        notes.append(gap)
        reason = gap
    return Prediction(
        accelerator=accelerator.name,
        devices=devices,
        step_time_s=step,
        tokens_per_s=w.tokens_per_step / step,
        mfu=model_flops / (step * devices * peak),
        memory_per_device_gib=mem_gib,
        fits=fits,
        plan=plan_doc,
        reason=reason,
        step_time_p10_s=step * lo_f,
        step_time_p90_s=step * hi_f,
        compile_time_s=compile_s,
        min_devices_to_fit=min_fit,
        source=source,
        notes=notes,
        hfu=float(ev.hw_flops_per_step[i]) / (step * peak),
        model_flops_per_step=model_flops,
        memory_capacity_gib=capacity_gib,
        breakdown={
            "compute_s": float(ev.compute_s[i]),
            "comm_exposed_s": float(ev.comm_exposed_s[i]),
            "bubble_s": float(ev.bubble_s[i]),
            "all_to_all_s": float(ev.all_to_all_s[i]),
            **{f"memory_{k}_gib": float(getattr(ev, f"mem_{k}")[i]) / GIB for k in engine.MEMORY_TERMS},
        },
        calibration_key=key,
    )


def _chosen_plan(
    ctx: _Context,
    cal: Calibration,
    accelerator: Accelerator,
    st: str,
    dtype: str,
    ev: engine.Evaluation,
    devices: int = 1,
) -> tuple[int, bool, float]:
    """The plan a prediction reports (the fastest that fits, else the leanest), whether it fits, and its
    calibrated step time before any measured step time replaces it."""
    fit_mask = ev.memory_bytes <= ctx.hw.memory_bytes
    fits = bool(fit_mask.any())
    if fits:
        times = np.where(fit_mask, ev.step_time_s, np.inf)
        i = int(np.argmin(times))
    else:
        i = int(np.argmin(ev.memory_bytes))
    step = float(ev.step_time_s[i])
    step *= cal.correction(accelerator.family, st, dtype, accelerator.name, devices)
    return i, fits, step


def predict_many(
    spec: JobSpec,
    accelerators: list[Accelerator],
    device_counts: list[int],
    **kwargs: Any,
) -> list[Prediction]:
    """Predictions for every accelerator × device count (same keyword arguments as :func:`predict`).

    Evaluates all device counts of one accelerator in a single vectorised pass; results equal
    :func:`predict` called one by one. Where the spec has a measured step time on an accelerator and its
    reference device count (``resources.min_devices``) is among ``device_counts``, the other counts scale
    from that count's step time in the same pass instead of predicting it again.
    """
    search, cal, opts = _many_options(kwargs, device_counts)
    out: list[Prediction] = []
    dtype = compute_dtype(spec.workload.precision)
    for acc in accelerators:
        ctx, notes, source, st = _context(spec, acc, calibration=cal, **opts)
        parts = [(n, *_candidates(ctx, n)) for n in device_counts]
        live = [c for _, _, c in parts if c]
        ev_all = None
        if live:
            cand_all = engine.concat_candidates(live)
            ev_all = engine.evaluate(ctx.w, cand_all, parts[0][1], ctx.hw, ctx.params, ctx.pins)
        out.extend(
            _predictions(spec, acc, ctx, notes, source, st, dtype, parts, ev_all, 0, cal, opts, search)
        )
    return out


def _many_options(
    kwargs: dict[str, Any], device_counts: Sequence[int]
) -> tuple[bool, Calibration, dict[str, Any]]:
    search = kwargs.pop("search_min_devices", True)
    cal = kwargs.pop("calibration", None)
    cal = cal if cal is not None else default_calibration()
    opts = {
        k: kwargs.get(k)
        for k in ("devices_per_node", "inter_node_gbps", "stack", "plan", "fast_domain_devices")
    }
    unknown = set(kwargs) - set(opts)
    if unknown:
        raise TypeError(f"unexpected keyword arguments {sorted(unknown)}")
    if any(n < 1 for n in device_counts):
        raise ValueError("devices must be >= 1")
    return search, cal, opts


def _predictions(
    spec: JobSpec,
    acc: Accelerator,
    ctx: _Context,
    notes: list[str],
    source: str,
    st: str,
    dtype: str,
    parts: list[tuple[int, Topology, dict[str, np.ndarray]]],
    ev_all: engine.Evaluation | None,
    start: int,
    cal: Calibration,
    opts: dict[str, Any],
    search: bool,
    choice: tuple[np.ndarray, np.ndarray, int] | None = None,
    lazy: engine.Evaluation | None = None,
    corrections: dict[tuple[str, str, int], float] | None = None,
    choice_lists: tuple[list[int], list[float], list[bool]] | None = None,
) -> list[Prediction]:
    """The predictions of ``parts`` (device count, topology, plans) from their evaluation: rows ``start``
    onwards of ``ev_all``, the parts' plans one after the other. ``choice``: ``engine.chosen_plans`` of
    ``ev_all`` (global row indices and fits, one per non-empty part of every caller in row order) and the
    position of this call's first non-empty part in it; computed here when None. ``lazy``: the rows of
    ``ev_all`` at ``choice``'s indices (in their order), given when a part whose chosen plan fits is to
    get a :class:`_LazyPrediction` (see :func:`predict_grouped`). ``choice_lists``: the whole pass's chosen
    row indices, their step times and fits as lists (``choice``'s, sliced here), when the caller has them."""
    live_starts: list[int] = []
    bounds: list[tuple[int, int] | None] = []  # each part's rows in ``ev_all``
    for _n, _topo, cand in parts:
        if cand:
            end = start + len(cand["tp"])
            assert ev_all is not None
            live_starts.append(start)
            bounds.append((start, end))
            start = end
        else:
            bounds.append(None)
    if choice is None:
        if live_starts:
            assert ev_all is not None
            choice = (
                *engine.chosen_plans(
                    ev_all.step_time_s, ev_all.memory_bytes, ctx.hw.memory_bytes, live_starts
                ),
                0,
            )
        else:
            choice = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool), 0)
    idx_all, fits_all, k = choice
    # feedback corrections by device count (``Calibration.correction``; ``corrections``: those already
    # looked up in this call's calibration, by stack, precision and device count)
    if corrections is None:
        corr = {n: cal.correction(acc.family, st, dtype, acc.name, n) for n, _t, c in parts if c}
    else:
        corr = {}
        for n, _t, c in parts:
            if c:
                ck = (st, dtype, n)
                f = corrections.get(ck)
                if f is None:
                    f = corrections[ck] = cal.correction(acc.family, st, dtype, acc.name, n)
                corr[n] = f
    chosen: list[tuple[int, bool, float] | None] = []
    if live_starts:
        assert ev_all is not None
        m = len(live_starts)
        if choice_lists is not None:
            # the whole pass's chosen rows, step times and fits as lists, sliced to this call's parts
            glob = choice_lists[0][k : k + m]
            steps = choice_lists[1][k : k + m]
            fl = choice_lists[2][k : k + m]
        else:
            glob = idx_all[k : k + m].tolist()
            steps = ev_all.step_time_s[glob].tolist()
            fl = fits_all[k : k + m].tolist()
        j = 0
        for n, _topo, cand in parts:
            if cand:
                # ``_chosen_plan``: the row within the part, whether it fits, the corrected step time
                step = steps[j]
                step *= corr[n]
                chosen.append((glob[j] - live_starts[j], bool(fl[j]), step))
                j += 1
            else:
                chosen.append(None)
    else:
        chosen = [None] * len(parts)
    ref_step_s: float | None = None
    measured = acc.name in spec.measured.step_time_s
    if measured:
        ref = spec.resources.min_devices or 1
        for (n, _topo, cand), bd, ch in zip(parts, bounds, chosen, strict=True):
            if n == ref:
                # the step time ``predict`` gives the reference count without the measurement (no plan:
                # inf, as there)
                ref_step_s = ch[2] if cand and bd is not None and ch is not None else math.inf
                break
    flops = training_flops_per_step(spec)
    out: list[Prediction] = []
    pos = k  # the part's row in ``choice`` and ``lazy``
    tail = (opts, search, ref_step_s)
    hi_f = _p90_factor(ctx)
    for (n, _topo, cand), bd, ch in zip(parts, bounds, chosen, strict=True):
        lean = ch is not None and ch[1] and bd is not None and (not measured or ref_step_s is not None)
        if bd is not None:
            pos += 1
        if lazy is not None and lean:
            assert ch is not None
            # the notes are shared until the prediction is built in full (``_materialise`` copies them)
            head = (spec, acc, n, ctx, cal, notes, source, st, cand)
            out.append(_LazyPrediction.of(*head, lazy, pos - 1, *tail, ch, flops, dtype, hi_f))
            continue
        head = (spec, acc, n, ctx, cal, list(notes), source, st, cand)
        ev = engine.slice_evaluation(ev_all, *bd) if bd is not None and ev_all is not None else None
        out.append(_finalize(*head, ev, *tail, ch, flops, dtype))
    return out


def _p90_factor(ctx: _Context) -> float:
    """The factor from a calibrated step time to its p90 (``_finalize``'s ``hi_f`` before any measured
    step time replaces it)."""
    params = ctx.params
    hi_f = math.exp(params.log_resid_p90)
    if ctx.w.shape.is_moe:
        hi_f = max(hi_f, math.exp(params.moe_log_resid_p90))
    return hi_f


class _LazyPrediction(Prediction):
    """A :class:`Prediction` of a batch pass whose chosen plan fits, holding at first only what pricing
    reads (accelerator, devices, step time and its p90, fits, reason, source, compile time): the rest
    (plan, memory, breakdown, notes, ...) is built by ``_finalize`` from the kept evaluation the first
    time any of it is read, and is then the same as the eager prediction's. It compares equal to the eager
    :class:`Prediction` of the same inputs."""

    # the fields :meth:`of` sets; any other field is built on first read
    _EAGER = ("accelerator", "devices", "step_time_s", "step_time_p90_s", "fits", "reason", "source",
              "compile_time_s")  # fmt: skip

    @classmethod
    def of(
        cls,
        spec: JobSpec,
        accelerator: Accelerator,
        devices: int,
        ctx: _Context,
        cal: Calibration,
        notes: list[str],
        source: str,
        st: str,
        cand: dict[str, np.ndarray],
        chosen_rows: engine.Evaluation,
        row: int,
        opts: dict[str, Any],
        search: bool,
        ref_step_s: float | None,
        chosen: tuple[int, bool, float],
        model_flops: float,
        dtype: str,
        hi_f: float | None = None,
    ) -> _LazyPrediction:
        """``_finalize``'s fields for a fitting chosen plan, in its arithmetic (``chosen[1]`` is True;
        with a measured step time on ``accelerator``, ``ref_step_s`` is given or ``devices`` is the
        reference count). ``notes`` may be shared with other predictions (copied when built in full);
        ``hi_f``: :func:`_p90_factor` of ``ctx``, when the caller has it."""
        i, _fits, step = chosen
        make = (
            spec, accelerator, devices, ctx, cal, notes, source, st, cand, chosen_rows, row, opts, search,
            ref_step_s, chosen, model_flops, dtype,
        )  # fmt: skip
        if hi_f is None:
            hi_f = _p90_factor(ctx)
        measured = spec.measured.step_time_s.get(accelerator.name)
        if measured is not None:
            if (spec.resources.min_devices or 1) == devices:
                scale = 1.0
            else:
                assert ref_step_s is not None
                scale = step / ref_step_s if math.isfinite(ref_step_s) else 1.0
            step = measured * scale
            hi_f = 1.05
            source = "measured"
        # ``builtin_trainer_gap`` of the plan (its tensor and pipeline degrees are all it reads)
        if spec.entrypoint is not None:
            gap = ""
        else:
            tp, pp = int(cand["tp"][i]) or 1, int(cand["pp"][i]) or 1
            gap = "" if tp <= 1 and pp <= 1 else f"{PLAN_NOT_EXECUTABLE} (tensor {tp}, pipeline {pp})"
        self = object.__new__(cls)
        d = self.__dict__
        d["accelerator"] = accelerator.name
        d["devices"] = devices
        d["step_time_s"] = step
        d["step_time_p90_s"] = step * hi_f
        d["fits"] = True
        d["reason"] = gap
        d["source"] = source
        d["compile_time_s"] = accelerator.first_compile_s
        d["_make"] = make
        return self

    def _materialise(self) -> None:
        d = self.__dict__
        make = d.pop("_make", None)
        if make is None:
            return
        spec, acc, n, ctx, cal, notes, source, st, cand, rows, row, opts, search, ref, ch, flops, dtype = make
        # the chosen plan alone: row ``ch[0]`` of the part's plans, row ``row`` of the chosen rows
        i, fits, step = ch
        full = _finalize(
            spec, acc, n, ctx, cal, list(notes), source, st, engine.slice_candidates(cand, i, i + 1),
            engine.slice_evaluation(rows, row, row + 1), opts, search, ref, (0, fits, step), flops, dtype,
        )  # fmt: skip
        d.update(full.__dict__)

    def __getattr__(self, name: str) -> Any:
        # only reached for an attribute not set yet: a field built on first read
        if name.startswith("__") or "_make" not in self.__dict__:
            raise AttributeError(name)
        self._materialise()
        return self.__dict__[name] if name in self.__dict__ else object.__getattribute__(self, name)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Prediction):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in Prediction.__dataclass_fields__)

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> Any:
        self._materialise()
        return (_plain_prediction, (dict(self.__dict__),))


def _plain_prediction(fields: dict[str, Any]) -> Prediction:
    return Prediction(**fields)


def predict_grouped(
    items: Sequence[tuple[JobSpec, Sequence[int]]],
    accelerator: Accelerator,
    **kwargs: Any,
) -> list[list[Prediction]]:
    """``predict_many(spec, [accelerator], counts, **kwargs)`` of every ``(spec, counts)``, with the plans
    of many specs evaluated in one vectorised pass: dense models of one method and precision without
    context parallel or replay pins share a pass (``engine.WorkloadRows``); the rest are evaluated one spec
    at a time. Results equal ``predict_many``'s (and so :func:`predict`'s one by one).

    ``lazy=True``: a prediction whose chosen plan fits holds at first only what pricing reads (step time
    and its p90, fits, reason, source, compile time; see :class:`_LazyPrediction`) and builds the rest
    (plan, memory, breakdown, notes) when first read: a scheduling round reads it for few of them. It is
    equal to the eager prediction."""
    lazy = bool(kwargs.pop("lazy", False))
    search, cal, opts = _many_options(kwargs, [n for _, counts in items for n in counts])
    prepared = []
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, (spec, counts) in enumerate(items):
        ctx, notes, source, st = _context(spec, accelerator, calibration=cal, **opts)
        parts = _parts_of(ctx, counts)
        prepared.append((spec, ctx, notes, source, st, compute_dtype(spec.workload.precision), parts))
        key = engine.batch_key(ctx.w)
        pins = ctx.pins
        if key is None or pins.context != 1 or pins.fp8_params or pins.bf16_states:
            key = ("alone", i)
        else:
            key = (*key, pins, ctx.hw, ctx.params)
        groups.setdefault(key, []).append(i)
    out: list[list[Prediction]] = [[] for _ in items]
    passes = []
    requests: list[tuple[_Context, int, Any]] = []
    for key, members in groups.items():
        lives = [[c for _, _, c in prepared[i][6] if c] for i in members]
        flat = [c for live in lives for c in live]
        ev_all = None
        if flat:
            ctx0 = prepared[members[0]][1]
            topo0 = next(p[1] for i in members for p in prepared[i][6])
            cand_all = engine.concat_candidates(flat)
            if key[0] == "alone":
                w: Any = ctx0.w
            else:
                rows = [sum(len(c["tp"]) for c in live) for live in lives]
                w = engine.workload_rows([prepared[i][1].w for i in members], rows)
            ev_all = engine.evaluate(w, cand_all, topo0, ctx0.hw, ctx0.params, ctx0.pins)
        starts, at = [], 0
        for c in flat:
            starts.append(at)
            at += len(c["tp"])
        # the group's members share their usable memory (the key holds ``ctx.hw``)
        idx, fits = (
            engine.chosen_plans(
                ev_all.step_time_s, ev_all.memory_bytes, prepared[members[0]][1].hw.memory_bytes, starts
            )
            if ev_all is not None
            else (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool))
        )
        if search:
            # the device counts without a fitting plan, whose predictions search for the smallest count
            # that fits
            fit_list = fits.tolist()
            seg = 0
            for i in members:
                ctx = prepared[i][1]
                for n, _topo, cand in prepared[i][6]:
                    if cand:
                        seg += 1
                        if fit_list[seg - 1]:
                            continue
                    requests.append((ctx, n, key))
        # the chosen plans' rows alone, for the lazy predictions to build from (not the whole evaluation)
        chosen_rows = (
            engine.Evaluation(*(getattr(ev_all, f)[idx] for f in engine.Evaluation.__dataclass_fields__))
            if lazy and ev_all is not None
            else None
        )
        passes.append((members, lives, ev_all, idx, fits, chosen_rows))
    if requests:
        # all of those searches at once (``_finalize`` then finds every probe memoised)
        prefill_min_devices(requests)
    corrections: dict[tuple[str, str, int], float] = {}  # one accelerator and calibration here
    for members, lives, ev_all, idx, fits, chosen_rows in passes:
        lists = None
        if ev_all is not None:
            lists = (idx.tolist(), ev_all.step_time_s[idx].tolist(), fits.tolist())
        start, k = 0, 0
        for i, live in zip(members, lives, strict=True):
            spec, ctx, notes, source, st, dtype, parts = prepared[i]
            out[i] = _predictions(
                spec,
                accelerator,
                ctx,
                notes,
                source,
                st,
                dtype,
                parts,
                ev_all,
                start,
                cal,
                opts,
                search,
                (idx, fits, k),
                chosen_rows,
                corrections,
                lists,
            )
            start += sum(len(c["tp"]) for c in live)
            k += len(live)
    return out
