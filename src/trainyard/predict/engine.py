"""Parallelism planner, memory model and step-time model, evaluated over all candidate plans at once.

A candidate plan is (tensor, pipeline, data, FSDP scope, activation checkpointing, micro-batch[, virtual
pipeline stages, context parallel]). Candidates are enumerated once per (device count, topology, pins) and
evaluated as numpy arrays, so a prediction costs a few hundred microseconds.

Device layout (Megatron order): tensor parallel innermost (inside a node's fast interconnect), then context
and data parallel, pipeline outermost. A collective whose group spans more than the fast domain runs at the
inter-node bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from trainyard.predict.params import EfficiencyParams
from trainyard.predict.workload import Workload
from trainyard.spec.models import ActivationCheckpointing, Method

GIB = 1024.0**3
CK_NAMES = ("none", "selective", "full")
CK_ENUM = (ActivationCheckpointing.NONE, ActivationCheckpointing.SELECTIVE, ActivationCheckpointing.FULL)
FSDP_NONE, FSDP_GLOBAL, FSDP_HYBRID = 0, 1, 2
FSDP_NAMES = ("none", "full", "hybrid")


@dataclass(frozen=True)
class Topology:
    devices: int
    devices_per_node: int  # devices sharing a host (tensor parallel stays inside it on GPUs)
    fast_domain: int  # devices on the fast interconnect (node for GPUs; the ICI slice for TPUs)
    intra_gbs: float  # per-device, one direction, GB/s
    inter_gbs: float  # per-device share of the inter-node network, one direction, GB/s
    tp_limit: int  # largest tensor-parallel degree allowed


@dataclass(frozen=True)
class Pins:
    tensor: int | None = None
    pipeline: int | None = None
    fsdp: bool | None = None
    micro_batch: int | None = None
    checkpointing: int | None = None  # index into CK_NAMES
    virtual_stages: int = 1
    context: int = 1
    fsdp_scope: int | None = None  # FSDP_GLOBAL / FSDP_HYBRID when fixed


@dataclass(frozen=True)
class Hardware:
    peak_flops: float  # dense matmul peak at the compute precision
    attn_peak_flops: float  # attention kernels (fp8 recipes keep attention in bf16)
    mem_bw_bytes_s: float
    memory_bytes: float  # usable (after headroom and workspace)


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


@lru_cache(maxsize=4096)
def enumerate_candidates(
    topo: Topology, global_batch: int, n_layers: int, n_heads: int, pins: Pins
) -> dict[str, np.ndarray]:
    """All plans for this topology and pins, as parallel integer arrays (possibly empty)."""
    n = topo.devices
    rows: list[tuple[int, ...]] = []
    cp = pins.context
    if pins.tensor is not None:
        tps = [pins.tensor]
    else:
        tps = [t for t in _pow2_upto(min(topo.tp_limit, 64)) if n_heads % t == 0]
    for tp in tps:
        if n % (tp * cp) or tp > topo.tp_limit:
            continue
        rest = n // (tp * cp)
        if pins.pipeline is not None:
            pps = [pins.pipeline]
        else:
            pps = [p for p in _pow2_upto(min(rest, n_layers, 16))]
        for pp in pps:
            if rest % pp or pp > n_layers:
                continue
            dp = rest // pp
            if dp > global_batch:
                continue
            b_local = -(-global_batch // dp)
            if pins.fsdp is True:
                scopes = [FSDP_GLOBAL] if dp > 1 else [FSDP_NONE]
                if dp > 1 and tp * cp * dp > topo.fast_domain:
                    scopes.append(FSDP_HYBRID)
            elif pins.fsdp is False:
                scopes = [FSDP_NONE]
            else:
                scopes = [FSDP_NONE]
                if dp > 1:
                    scopes.append(FSDP_GLOBAL)
                    if tp * cp * dp > topo.fast_domain:
                        scopes.append(FSDP_HYBRID)
            if pins.fsdp_scope is not None and dp > 1:
                scopes = [pins.fsdp_scope]
            for scope in scopes:
                if scope == FSDP_HYBRID:
                    shard = max(1, min(dp, topo.fast_domain // (tp * cp)))
                    if shard <= 1 or shard >= dp:
                        continue
                elif scope == FSDP_GLOBAL:
                    shard = dp
                else:
                    shard = 1
                cks = [pins.checkpointing] if pins.checkpointing is not None else [0, 2]
                if pins.micro_batch is not None:
                    mbs = [min(pins.micro_batch, b_local)]
                else:
                    mbs = sorted({*(_pow2_upto(b_local)), b_local})
                for ck in cks:
                    for mb in mbs:
                        rows.append((tp, pp, dp, scope, shard, ck, mb, b_local))
    if not rows:
        return {}
    rows = [(*r, n) for r in rows]
    arr = np.array(rows, dtype=np.int64)
    names = ("tp", "pp", "dp", "scope", "shard", "ck", "mb", "b_local", "n")
    out = {k: arr[:, i] for i, k in enumerate(names)}
    out.update({f"{k}_f": arr[:, i].astype(float) for i, k in enumerate(names)})
    return out


@dataclass
class Evaluation:
    step_time_s: np.ndarray
    memory_bytes: np.ndarray
    compute_s: np.ndarray
    comm_exposed_s: np.ndarray
    bubble_s: np.ndarray
    hw_flops_per_step: np.ndarray  # per device
    n_micro: np.ndarray


_FLOPS_CACHE: dict[int, tuple[Workload, np.ndarray, np.ndarray]] = {}


def _flops_by_policy(w: Workload) -> tuple[np.ndarray, np.ndarray]:
    """Matmul and attention FLOPs per token for each checkpointing policy (memoised per workload)."""
    hit = _FLOPS_CACHE.get(id(w))
    if hit is not None and hit[0] is w:
        return hit[1], hit[2]
    mm_tok = np.empty(3)
    at_tok = np.empty(3)
    for i, pol in enumerate(CK_ENUM):
        f = w.flops(pol)
        mm_tok[i] = f.matmul_model + f.matmul_recompute
        at_tok[i] = f.attention_model + f.attention_recompute
    if len(_FLOPS_CACHE) > 4096:
        _FLOPS_CACHE.clear()
    _FLOPS_CACHE[id(w)] = (w, mm_tok, at_tok)
    return mm_tok, at_tok


def evaluate(
    w: Workload,
    cand: dict[str, np.ndarray],
    topo: Topology,
    hw: Hardware,
    p: EfficiencyParams,
    pins: Pins,
) -> Evaluation:
    """Step time and per-device memory of every candidate plan."""
    tp = cand["tp_f"]
    pp = cand["pp_f"]
    dp = cand["dp_f"]
    shard = cand["shard_f"]
    scope = cand["scope"]
    ck = cand["ck"]
    mb = cand["mb_f"]
    b_local = cand["b_local_f"]
    cp = float(pins.context)
    vp = float(pins.virtual_stages)
    sh = w.shape
    L = float(sh.n_blocks)
    d = float(sh.d_model)
    ab = w.act_bytes

    n_micro = np.ceil(b_local / mb)
    tokens_mb = mb * w.seq_len / cp

    # --- FLOPs per token by checkpointing policy ---
    mm_tok, at_tok = _flops_by_policy(w)
    mm_flops = tokens_mb * mm_tok[ck] / (tp * pp)
    at_flops = tokens_mb * at_tok[ck] / (tp * pp)

    width = d / tp
    e_mm = p.mm_max / (1.0 + p.dim_knee / width + p.token_knee / tokens_mb)
    e_at = p.mm_max * p.attn_ratio / (1.0 + p.token_knee / tokens_mb)
    t_comp = mm_flops / (hw.peak_flops * e_mm) + at_flops / (hw.attn_peak_flops * e_at)
    full = (ck == 2).astype(float)
    elem = tokens_mb * w.elementwise_bytes_per_token * (3.0 + full) / (tp * pp)
    t_mem = elem / (hw.mem_bw_bytes_s * p.mem_eff)
    t_ovh = p.layer_overhead_s * (L / pp) * (1.0 + 0.5 * full)
    t_mb = t_comp + t_mem + t_ovh

    intra = topo.intra_gbs * 1e9 * p.comm_eff
    inter = topo.inter_gbs * 1e9 * p.comm_eff
    # Tensor parallel: 2 all-reduces (or all-gather + reduce-scatter with sequence parallel) forward, 2
    # backward, 2 more when the forward is recomputed, of tokens·d activations, inside the node.
    tp_vol = np.where(tp > 1, (4.0 + 2.0 * full) * 2.0 * (tp - 1) / tp * tokens_mb * d * ab * (L / pp), 0.0)
    t_tp = tp_vol / intra
    # Context parallel: all-gather K and V per layer forward, reduce-scatter their gradients backward.
    t_cp = 0.0
    if cp > 1:
        kv = tokens_mb * 2 * sh.kv_dim * ab / tp
        t_cp = (L / pp) * 2.0 * (cp - 1) * kv / (intra if tp * cp <= topo.fast_domain else inter)
    span_all = cand["n_f"] > topo.fast_domain
    t_p2p = np.where(pp > 1, 2.0 * tokens_mb * d * ab / tp / np.where(span_all, inter, intra), 0.0)
    t_mb_total = t_mb + t_tp + t_cp + t_p2p
    bubble = (pp - 1.0) / vp * t_mb_total
    t_pipe = n_micro * t_mb_total + bubble

    # Data-parallel traffic.
    wb = 4.0 if w.states.master == 0 else 2.0
    weights_b = w.params * wb / (tp * pp)
    grads_b = w.trainable * wb / (tp * pp)
    # A group spanning nodes runs at the node's aggregate network bandwidth shared by the groups running
    # concurrently: k members per node give k x the per-device share (NCCL-style multi-ring), capped by
    # the intra-node links.
    per_node = np.maximum(1.0, np.floor(topo.fast_domain / (tp * cp)))
    dp_bw = np.where(
        tp * cp * dp > topo.fast_domain, np.minimum(intra, np.minimum(per_node, dp) * inter), intra
    )
    shard_bw = np.where(
        tp * cp * shard > topo.fast_domain, np.minimum(intra, np.minimum(per_node, shard) * inter), intra
    )
    t_bwd_mb = t_mb * (2.0 / 3.0)
    # FSDP (per micro-batch: all-gather forward, all-gather backward, reduce-scatter of gradients).
    fs_vol = (2.0 * weights_b + grads_b) * (shard - 1.0) / np.maximum(shard, 1.0)
    t_fs = fs_vol / shard_bw
    fs_exposed = np.where(scope != FSDP_NONE, n_micro * np.maximum((1 - p.overlap) * t_fs, t_fs - t_mb), 0.0)
    # Gradient all-reduce across replicas once per step (DDP; or across hybrid-shard groups).
    replicas = np.where(scope == FSDP_NONE, dp, np.where(scope == FSDP_HYBRID, dp / shard, 1.0))
    ar_bytes = grads_b / np.where(scope == FSDP_NONE, 1.0, shard)
    ar_bw = np.where(scope == FSDP_NONE, dp_bw, inter)
    t_ar = np.where(replicas > 1, 2.0 * (replicas - 1) / replicas * ar_bytes / ar_bw, 0.0)
    ar_exposed = np.maximum((1 - p.overlap) * t_ar, t_ar - t_bwd_mb)
    # Optimizer update, memory bound, on the local shard.
    t_opt = (
        w.trainable / (tp * pp * shard) * w.optimizer_bytes_per_trainable / (hw.mem_bw_bytes_s * p.mem_eff)
    )

    step = t_pipe + fs_exposed + ar_exposed + t_opt + p.step_overhead_s

    # --- memory per device ---
    st = w.states
    state = (st.weights + st.grads + st.master + st.optimizer) / (tp * pp * shard)
    gather = np.where(scope != FSDP_NONE, 2.0 * w.layer_params * wb / tp, 0.0)
    held = np.minimum(pp, n_micro)
    per_tok_layer = np.where(
        ck == 0,
        (w.act_per_token_layer + w.act_scores_per_token_layer) / tp,
        np.where(ck == 1, w.act_per_token_layer / tp, d * ab / tp),
    )
    act = tokens_mb * per_tok_layer * (L / pp) * held
    act = act + full * tokens_mb * w.act_per_token_layer / tp  # one layer re-materialised in backward
    logits = tokens_mb * sh.vocab_size / tp * (ab + 4.0)  # logits + fp32 loss/gradient chunk
    mem = state + gather + act + logits
    hw_flops = n_micro * (mm_flops + at_flops)
    comm = fs_exposed + ar_exposed + n_micro * (t_tp + t_cp + t_p2p)
    return Evaluation(step, mem, n_micro * t_comp, comm, bubble, hw_flops, n_micro)


def concat_candidates(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Candidate sets of several device counts as one set (same topology otherwise)."""
    return {k: np.concatenate([c[k] for c in parts]) for k in parts[0]}


def slice_evaluation(ev: Evaluation, a: int, b: int) -> Evaluation:
    return Evaluation(*(getattr(ev, f)[a:b] for f in Evaluation.__dataclass_fields__))


def slice_candidates(cand: dict[str, np.ndarray], a: int, b: int) -> dict[str, np.ndarray]:
    return {k: v[a:b] for k, v in cand.items()}


def plan_dict(cand: dict[str, np.ndarray], i: int, pins: Pins, ev: Evaluation) -> dict[str, Any]:
    scope = int(cand["scope"][i])
    return {
        "data": int(cand["dp"][i]),
        "fsdp": scope != FSDP_NONE,
        "fsdp_scope": FSDP_NAMES[scope],
        "shard_degree": int(cand["shard"][i]),
        "tensor": int(cand["tp"][i]),
        "pipeline": int(cand["pp"][i]),
        "virtual_stages": pins.virtual_stages,
        "context": pins.context,
        "micro_batch": int(cand["mb"][i]),
        "grad_accum": int(ev.n_micro[i]),
        "activation_checkpointing": CK_NAMES[int(cand["ck"][i])],
    }


def min_memory_plan(
    w: Workload, cand: dict[str, np.ndarray], topo: Topology, hw: Hardware, p: EfficiencyParams, pins: Pins
) -> float:
    if not cand:
        return math.inf
    return float(evaluate(w, cand, topo, hw, p, pins).memory_bytes.min())


__all__ = [
    "CK_NAMES",
    "FSDP_NAMES",
    "Evaluation",
    "Hardware",
    "Method",
    "Pins",
    "Topology",
    "enumerate_candidates",
    "evaluate",
    "min_memory_plan",
    "plan_dict",
]
