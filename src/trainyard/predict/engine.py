"""Parallelism planner, memory model and step-time model, evaluated over all candidate plans at once.

A candidate plan is (tensor, pipeline, data, expert, FSDP scope, activation checkpointing, micro-batch[,
virtual pipeline stages, context parallel]). Candidates are enumerated once per (device count, topology,
pins) and evaluated as numpy arrays, so a prediction costs a few hundred microseconds.

Device layout (Megatron order): tensor parallel innermost (inside a node's fast interconnect), then context
and data parallel, pipeline outermost. A collective whose group spans more than the fast domain runs at the
inter-node bandwidth.

Mixture-of-experts: expert parallelism (EP) splits the routed experts over ``ep`` data-parallel ranks (the
expert layers keep the tensor-parallel degree). Each rank holds ``n_experts / ep`` experts; FSDP shards them
further over ``shard / ep`` ranks when the shard group is larger. Every MoE layer exchanges the routed tokens
in four all-to-alls per micro-batch (dispatch and combine, forward and backward; two more when the forward is
recomputed), over NVLink for the peers inside the node and the network for the rest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from trainyard.predict.params import HOST_RESERVED_CORES, EfficiencyParams, PlanSpace
from trainyard.predict.workload import Workload, expert_flops_per_token, head_flops_per_token
from trainyard.spec.models import ActivationCheckpointing, Method

GIB = 1024.0**3
# Recompute policies. "minimal" (replays only; the planner never enumerates it and a spec cannot pin it)
# is MaxText's remat_policy=minimal (jax checkpoint_dots_with_no_batch_dims): the outputs of the weight
# matmuls and the layer input are saved, norms, activation functions and the attention core recomputed.
CK_NAMES = ("none", "selective", "full", "minimal")
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
    # The devices of a node are cores of one host that its ranks share (the local CPU pool: one device per
    # core, one process per rank): ranks beyond the host's free cores time-share them (``host_sharing``).
    shared_host: bool = False


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
    expert: int | None = None  # expert-parallel degree (MoE only)
    # How tokens pick experts: "uniform" (balanced routing of a trained router, experts of a token spread
    # at random) or "contiguous" (a token's k experts are adjacent, as benchmark gates that force balance
    # assign them: t·k ... t·k + k - 1); only replays of published runs set it.
    routing: str = "uniform"
    tp_overlap: bool = False  # tensor-parallel communication overlapped with the GEMMs (replays only)
    # Pipeline schedules run per optimizer step, each filling and draining the pipeline once (replays only:
    # NeMo Automodel runs one schedule per gradient-accumulation step).
    pipeline_flushes: int = 1
    # How a replayed run holds its model states (replays of published runs only; see ``memory_terms``):
    # Megatron's distributed optimizer (fp32 master weights and optimizer moments sharded over the
    # data-parallel ranks, ZeRO-1), FP8 working weights (Transformer Engine fp8 parameters), or the whole
    # model cast to bf16 (weights, gradients and Adam moments in bf16, no fp32 master copy).
    distributed_optimizer: bool = False
    fp8_params: bool = False
    bf16_states: bool = False


@dataclass(frozen=True)
class Hardware:
    peak_flops: float  # dense matmul peak at the compute precision
    attn_peak_flops: float  # what fp8 recipes keep in bf16 (attention kernels, the output layer); else peak
    mem_bw_bytes_s: float
    memory_bytes: float  # usable (after headroom and workspace)


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


# Every parallelism (the CUDA stacks' space); ``params.STACK_PLAN_SPACE`` narrows it per software stack.
FULL_SPACE = PlanSpace("any")


def enumerate_candidates(
    topo: Topology,
    global_batch: int,
    n_layers: int,
    n_heads: int,
    pins: Pins,
    n_experts: int = 1,
    space: PlanSpace = FULL_SPACE,
) -> dict[str, np.ndarray]:
    """All plans for this topology and pins inside the software stack's plan ``space``, as parallel
    integer arrays (possibly empty; shared between callers: never modify them). A stack without FSDP
    has only unsharded data parallelism, one without pipelines only pipeline degree 1, one without
    tensor sharding only tensor degree 1; a pin outside the space leaves no plan.

    ``n_experts`` > 1 (MoE) adds the expert-parallel degree: powers of two dividing both the data-parallel
    degree and the expert count (or the pinned degree, when it does).

    Memoised on what the enumeration reads of the model: without a pipeline pin only ``min(n_layers,
    16)`` (pipeline degrees are powers of two up to 16 and the layer count), and without a tensor pin only
    the largest power of two up to 64 that divides ``n_heads`` (tensor degrees are powers of two dividing
    the heads), so models of different depth or width share their plans; and on only the topology's device
    count, fast domain and tensor-parallel limit (what the enumeration reads of it), so topologies that
    differ in bandwidths or node size share them too."""
    topo = Topology(topo.devices, 0, topo.fast_domain, 0.0, 0.0, topo.tp_limit)
    if pins.pipeline is None:
        n_layers = min(n_layers, 16)
    if pins.tensor is None:
        n_heads = min(n_heads & -n_heads, 64) if n_heads > 0 else n_heads
    return _enumerate_candidates(topo, global_batch, n_layers, n_heads, pins, n_experts, space)


@lru_cache(maxsize=16384)
def _enumerate_candidates(
    topo: Topology,
    global_batch: int,
    n_layers: int,
    n_heads: int,
    pins: Pins,
    n_experts: int,
    space: PlanSpace = FULL_SPACE,
) -> dict[str, np.ndarray]:
    n = topo.devices
    rows: list[tuple[int, ...]] = []
    cp = pins.context
    if pins.tensor is not None:
        tps = [pins.tensor] if space.tensor or pins.tensor == 1 else []
    elif not space.tensor:
        tps = [1]
    else:
        tps = [t for t in _pow2_upto(min(topo.tp_limit, 64)) if n_heads % t == 0]
    for tp in tps:
        if n % (tp * cp) or tp > topo.tp_limit:
            continue
        rest = n // (tp * cp)
        if pins.pipeline is not None:
            pps = [pins.pipeline] if space.pipeline or pins.pipeline == 1 else []
        elif not space.pipeline:
            pps = [1]
        else:
            pps = [p for p in _pow2_upto(min(rest, n_layers, 16))]
        for pp in pps:
            if rest % pp or pp > n_layers:
                continue
            dp = rest // pp
            if dp > global_batch:
                continue
            b_local = -(-global_batch // dp)
            if n_experts > 1:
                if pins.expert is not None:
                    eps = [pins.expert] if dp % pins.expert == 0 and n_experts % pins.expert == 0 else []
                else:
                    eps = [e for e in _pow2_upto(dp) if dp % e == 0 and n_experts % e == 0]
            else:
                eps = [1]
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
            if not space.fsdp:
                # the stack cannot shard the model states: unsharded data parallelism only
                scopes = [s for s in scopes if s == FSDP_NONE]
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
                for ep in eps:
                    for ck in cks:
                        for mb in mbs:
                            rows.append((tp, pp, dp, scope, shard, ck, mb, b_local, ep))
    if not rows:
        return {}
    rows = [(*r, n) for r in rows]
    arr = np.array(rows, dtype=np.int64)
    names = ("tp", "pp", "dp", "scope", "shard", "ck", "mb", "b_local", "ep", "n")
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
    all_to_all_s: np.ndarray  # expert all-to-all time per step (MoE with expert parallelism; else 0)
    # memory per device by term (bytes; MEMORY_TERMS order), summing to memory_bytes
    mem_states: np.ndarray
    mem_fsdp_buffers: np.ndarray
    mem_activations: np.ndarray
    mem_logits: np.ndarray
    mem_loss_chunk: np.ndarray


_FLOPS_CACHE: dict[int, tuple[Workload, np.ndarray, np.ndarray, np.ndarray]] = {}


def _flops_by_policy(w: Workload) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Dense matmul, attention and routed-expert matmul FLOPs per token for each checkpointing policy
    (memoised per workload; the expert FLOPs are not in the dense matmul FLOPs)."""
    hit = _FLOPS_CACHE.get(id(w))
    if hit is not None and hit[0] is w:
        return hit[1], hit[2], hit[3]
    mm_tok = np.empty(4)
    at_tok = np.empty(4)
    ex_tok = np.empty(4)
    # "minimal" recomputes what "selective" does among the FLOPs (the attention core; no matmuls).
    for i, pol in enumerate((*CK_ENUM, ActivationCheckpointing.SELECTIVE)):
        f = w.flops(pol)
        ex_tok[i] = expert_flops_per_token(w.fwd, w.method, pol)
        mm_tok[i] = f.matmul_model + f.matmul_recompute - ex_tok[i]
        at_tok[i] = f.attention_model + f.attention_recompute
    if len(_FLOPS_CACHE) > 4096:
        _FLOPS_CACHE.clear()
    _FLOPS_CACHE[id(w)] = (w, mm_tok, at_tok, ex_tok)
    return mm_tok, at_tok, ex_tok


@lru_cache(maxsize=65536)
def _hit_one(groups: float, n_experts: int, k: int) -> float:
    local = n_experts / max(groups, 1.0)
    miss = 1.0
    for i in range(min(k, n_experts)):
        miss *= max(0.0, n_experts - local - i) / (n_experts - i)
    return 1.0 - miss


@lru_cache(maxsize=1024)
def _hit_table(n_experts: int, k: int, top: int) -> np.ndarray:
    return np.array([_hit_one(float(g), n_experts, k) for g in range(top + 1)])


def _hit(groups: np.ndarray, n_experts: int, k: int) -> np.ndarray:
    """Probability that one of ``groups`` equal groups of experts receives a given token routed to ``k``
    distinct experts chosen uniformly: ``1 - C(E - E/groups, k) / C(E, k)``."""
    whole = groups.astype(np.int64)
    top = int(whole.max()) if whole.size else 0
    if top <= 4096 and bool((whole == groups).all()):
        table: np.ndarray = _hit_table(n_experts, k, max(top, 64))[whole]
        return table
    values, inverse = np.unique(groups, return_inverse=True)
    table = np.array([_hit_one(float(g), n_experts, k) for g in values])
    out: np.ndarray = table[inverse.reshape(groups.shape)]
    return out


def _a2a_copies(
    ep: np.ndarray, n_in: np.ndarray, n_experts: int, k: int, routing: str
) -> tuple[np.ndarray, np.ndarray]:
    """Copies of a token one all-to-all sends (over the intra-node links, over the network).

    Dispatchers send a token once to each rank inside the node that holds one of its experts, and once to
    each other node holding one (forwarded inside that node over NVLink, DeepEP-style)."""
    nodes = ep / n_in
    if routing == "contiguous":
        ranks = np.minimum(ep, np.ceil(k * ep / n_experts))  # adjacent ranks holding the k experts
        local = np.minimum(1.0, n_in / ep)  # chance that they sit in the sender's node
        intra = local * ranks * (1.0 - 1.0 / n_in)
        inter = (1.0 - local) * np.ceil(ranks / n_in)
        return intra, inter
    intra = (n_in - 1.0) * _hit(ep, n_experts, k)
    inter = (nodes - 1.0) * _hit(nodes, n_experts, k)
    return intra, inter


@dataclass(frozen=True)
class ShapeRows:
    """The block structure of several dense models, one value per candidate row (:class:`WorkloadRows`)."""

    n_blocks: np.ndarray
    d_model: np.ndarray
    vocab_size: np.ndarray
    is_moe: bool = False


@dataclass(frozen=True)
class WorkloadRows:
    """Several workloads evaluated in one pass: each field holds one value per candidate row (the row's
    workload's), so :func:`evaluate` prices the plans of many models at once, row for row the numbers it
    gives each model alone. Only what such a batch keeps equal is a scalar: dense models (no experts), one
    method, one precision (activation and weight bytes) and no context parallel or FP8 recipe; callers
    group workloads accordingly (``predict.model.predict_grouped``)."""

    shape: ShapeRows
    params: np.ndarray
    trainable: np.ndarray
    seq_len: np.ndarray
    method: Method
    act_bytes: float
    weight_bytes: float  # 4 without a master copy (fp32 training), else 2
    states: Any  # weights, grads, master, optimizer: arrays
    layer_params: np.ndarray
    expert_params: float  # 0.0: dense models only
    embed_params: np.ndarray
    elementwise_bytes_per_token: np.ndarray
    fp8_cast_bytes_per_token: np.ndarray
    optimizer_bytes_per_trainable: np.ndarray
    act_per_token_layer: np.ndarray
    act_scores_per_token_layer: np.ndarray
    act_matmul_outputs_per_token_layer: np.ndarray
    flops_by_policy: tuple[np.ndarray, np.ndarray, np.ndarray]  # (rows x 4) each: matmul, attention, experts


@dataclass(frozen=True)
class _StateRows:
    weights: np.ndarray
    grads: np.ndarray
    master: np.ndarray
    optimizer: np.ndarray


def batch_key(w: Workload) -> tuple[Any, ...] | None:
    """Workloads with equal keys can share one :class:`WorkloadRows` pass (None: this one cannot)."""
    if w.shape.is_moe or w.expert_params or w.fp8_cast_bytes_per_token:
        return None
    return (w.method, w.act_bytes, 4.0 if w.states.master == 0 else 2.0)


def workload_rows(workloads: list[Workload], rows: list[int]) -> WorkloadRows:
    """The :class:`WorkloadRows` of ``workloads`` (equal :func:`batch_key`), ``rows[i]`` rows each."""
    reps = np.asarray(rows, dtype=np.int64)

    def col(values: list[Any]) -> np.ndarray:
        return np.repeat(np.asarray(values), reps)

    w0 = workloads[0]
    flops = [_flops_by_policy(w) for w in workloads]
    return WorkloadRows(
        shape=ShapeRows(
            n_blocks=col([w.shape.n_blocks for w in workloads]),
            d_model=col([w.shape.d_model for w in workloads]),
            vocab_size=col([w.shape.vocab_size for w in workloads]),
        ),
        params=col([w.params for w in workloads]),
        trainable=col([w.trainable for w in workloads]),
        seq_len=col([w.seq_len for w in workloads]),
        method=w0.method,
        act_bytes=w0.act_bytes,
        weight_bytes=4.0 if w0.states.master == 0 else 2.0,
        states=_StateRows(
            weights=col([w.states.weights for w in workloads]),
            grads=col([w.states.grads for w in workloads]),
            master=col([w.states.master for w in workloads]),
            optimizer=col([w.states.optimizer for w in workloads]),
        ),
        layer_params=col([w.layer_params for w in workloads]),
        expert_params=0.0,
        embed_params=col([w.embed_params for w in workloads]),
        elementwise_bytes_per_token=col([w.elementwise_bytes_per_token for w in workloads]),
        fp8_cast_bytes_per_token=col([w.fp8_cast_bytes_per_token for w in workloads]),
        optimizer_bytes_per_trainable=col([w.optimizer_bytes_per_trainable for w in workloads]),
        act_per_token_layer=col([w.act_per_token_layer for w in workloads]),
        act_scores_per_token_layer=col([w.act_scores_per_token_layer for w in workloads]),
        act_matmul_outputs_per_token_layer=col([w.act_matmul_outputs_per_token_layer for w in workloads]),
        flops_by_policy=(
            np.repeat(np.stack([f[0] for f in flops]), reps, axis=0),
            np.repeat(np.stack([f[1] for f in flops]), reps, axis=0),
            np.repeat(np.stack([f[2] for f in flops]), reps, axis=0),
        ),
    )


def _as_float(x: Any) -> Any:
    return x.astype(float) if isinstance(x, np.ndarray) else float(x)


def _at_least_1(x: Any) -> Any:
    return np.maximum(x, 1) if isinstance(x, np.ndarray) else max(x, 1)


def _weight_bytes(w: Any) -> float:
    if isinstance(w, WorkloadRows):
        return w.weight_bytes
    return 4.0 if w.states.master == 0 else 2.0


def _policy_flops(w: Any, ck: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Matmul, attention and expert FLOPs per token of every row's checkpointing policy."""
    if isinstance(w, WorkloadRows):
        rows = np.arange(ck.shape[0])
        mm, at, ex = w.flops_by_policy
        return mm[rows, ck], at[rows, ck], ex[rows, ck]
    mm_tok, at_tok, ex_tok = _flops_by_policy(w)
    return mm_tok[ck], at_tok[ck], ex_tok[ck]


def _by_policy(values: list[Any], ck: np.ndarray) -> np.ndarray:
    table = np.array(values)
    if table.ndim == 1:
        return table[ck]
    return table[ck, np.arange(ck.shape[0])]


# The loss is computed in chunks of this many tokens in fp32 (see ``memory_terms``).
LOSS_CHUNK_TOKENS = 1024
MEMORY_TERMS = ("states", "fsdp_buffers", "activations", "logits", "loss_chunk")


def memory_terms(w: Workload, cand: dict[str, np.ndarray], pins: Pins) -> dict[str, np.ndarray]:
    """Memory per device of every candidate plan, by term (bytes; the sum is :func:`memory_bytes`).

    - ``states``: weights, gradients, fp32 master weights and optimizer moments, divided by tensor ×
      pipeline × the FSDP shard degree (routed experts by max(expert parallel, shard)). Replays may hold
      them as the published run did (``Pins.distributed_optimizer``, ``fp8_params``, ``bf16_states``).
    - ``fsdp_buffers``: all-gathered working weights of two layers (the one computing, the one prefetched).
    - ``activations``: Korthikanti et al. 2022 per recompute policy, ``min(pipeline, micro-batches)``
      micro-batches in flight (1F1B), plus one re-materialised layer with full recomputation.
    - ``logits``: the output layer's logits of one micro-batch in the working precision. Production
      stacks never materialise a full fp32 ``[tokens × vocab]`` copy: Megatron's fused vocab-parallel
      cross entropy and Transformer Engine's parallel cross entropy write the gradient into the logits
      in place, flash-attn's and Liger's kernels compute the fp32 softmax block by block, MaxText tiles
      the vocabulary (``num_vocab_tiling``).
    - ``loss_chunk``: the fp32 working block of that chunked loss, ``LOSS_CHUNK_TOKENS`` tokens at a time.
    """
    tp = cand["tp_f"]
    pp = cand["pp_f"]
    dp = cand["dp_f"]
    shard = cand["shard_f"]
    ep = cand["ep_f"]
    ck = cand["ck"]
    mb = cand["mb_f"]
    n_micro = np.ceil(cand["b_local_f"] / mb)
    tokens_mb = mb * w.seq_len / float(pins.context)
    sh = w.shape
    L = _as_float(sh.n_blocks)
    ab = w.act_bytes
    full = (ck == 2).astype(float)
    wb = _weight_bytes(w)
    st = w.states
    weights, grads, master, moments = st.weights, st.grads, st.master, st.optimizer
    if pins.bf16_states and master:
        master, moments = 0.0, moments / 2.0  # everything in bf16: no fp32 master, bf16 Adam moments
    per_w = weights / _at_least_1(w.params)
    if pins.fp8_params:
        # FP8 working weights for the blocks' linear layers; embeddings and output layer stay bf16.
        weights = (w.params - w.embed_params) * 1.0 + w.embed_params * per_w
        per_w = weights / _at_least_1(w.params)
    per_t = 1.0 / _at_least_1(w.trainable)
    trained_exp = w.expert_params if w.method == Method.FULL else 0.0
    # Routed experts' share: their weights, and their gradients/master/moments when trained.
    exp_wg = w.expert_params * per_w + trained_exp * grads * per_t
    exp_mo = trained_exp * (master + moments) * per_t
    dense_wg = weights + grads - exp_wg
    dense_mo = master + moments - exp_mo
    ep_div = np.maximum(ep, shard)
    if pins.distributed_optimizer:
        # ZeRO-1 without FSDP: master weights and moments over the data-parallel ranks (routed experts'
        # over the ranks holding the same experts, i.e. all data-parallel ranks together).
        ddp = cand["scope"] == FSDP_NONE
        mo_dense_div = np.where(ddp, dp, shard)
        mo_exp_div = np.where(ddp, np.maximum(ep, dp), ep_div)
        state = dense_wg / shard + dense_mo / mo_dense_div + exp_wg / ep_div + exp_mo / mo_exp_div
        state = state / (tp * pp)
    else:
        state = ((dense_wg + dense_mo) / shard + (exp_wg + exp_mo) / ep_div) / (tp * pp)
    layer_exp = w.expert_params / L
    gather = np.where(
        cand["scope"] != FSDP_NONE, 2.0 * (w.layer_params - layer_exp + layer_exp / ep) * wb / tp, 0.0
    )
    held = np.minimum(pp, n_micro)
    by_policy = [
        w.act_per_token_layer + w.act_scores_per_token_layer,  # none
        w.act_per_token_layer,  # selective (flash attention: no score matrix either way)
        sh.d_model * ab,  # full: the layer input
        w.act_matmul_outputs_per_token_layer,  # minimal (replays)
    ]
    per_tok_layer = _by_policy(by_policy, ck) / tp
    act = tokens_mb * per_tok_layer * (L / pp) * held
    act = act + full * tokens_mb * w.act_per_token_layer / tp  # one layer re-materialised in backward
    logits = tokens_mb * sh.vocab_size / tp * ab
    loss_chunk = np.minimum(tokens_mb, float(LOSS_CHUNK_TOKENS)) * sh.vocab_size / tp * 4.0
    return {
        "states": state,
        "fsdp_buffers": gather,
        "activations": act,
        "logits": logits,
        "loss_chunk": loss_chunk,
    }


def memory_bytes(w: Workload, cand: dict[str, np.ndarray], pins: Pins) -> np.ndarray:
    """Memory per device of every candidate plan (the sum of :func:`memory_terms`)."""
    return _sum_terms(memory_terms(w, cand, pins))


def _sum_terms(t: dict[str, np.ndarray]) -> np.ndarray:
    result: np.ndarray = t["states"] + t["fsdp_buffers"] + t["activations"] + t["logits"] + t["loss_chunk"]
    return result


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
    L = _as_float(sh.n_blocks)
    d = _as_float(sh.d_model)
    ab = w.act_bytes

    n_micro = np.ceil(b_local / mb)
    tokens_mb = mb * w.seq_len / cp

    # --- FLOPs per token by checkpointing policy ---
    mm_ck, at_ck, ex_ck = _policy_flops(w, ck)
    mm_flops = tokens_mb * mm_ck / (tp * pp)
    at_flops = tokens_mb * at_ck / (tp * pp)

    width = d / tp
    e_mm = p.mm_max / (1.0 + p.dim_knee / width + p.token_knee / tokens_mb)
    e_at = p.mm_max * p.attn_ratio / (1.0 + p.token_knee / tokens_mb)
    if hw.attn_peak_flops != hw.peak_flops:
        # FP8 recipe: the output layer runs at the bf16 rate.
        hd_flops = tokens_mb * head_flops_per_token(w.fwd, w.method) / (tp * pp)
        t_comp = (mm_flops - hd_flops) / (hw.peak_flops * e_mm) + hd_flops / (hw.attn_peak_flops * e_mm)
    else:
        t_comp = mm_flops / (hw.peak_flops * e_mm)
    t_comp = t_comp + at_flops / (hw.attn_peak_flops * e_at)
    moe = sh.is_moe
    ep = cand["ep_f"]
    if moe:
        # Routed experts run as grouped matmuls over the tokens each local expert receives (balanced
        # routing: tokens x k x ep / n_experts), as narrow as the smaller of d_model and the expert width.
        ex_flops = tokens_mb * ex_ck / (tp * pp)
        tok_e = np.maximum(1.0, tokens_mb * sh.experts_active * ep / sh.experts_total)
        width_e = min(d, float(sh.d_ff)) / tp
        e_ex = p.moe_eff * p.mm_max / (1.0 + p.dim_knee / width_e + p.token_knee / tok_e)
        t_comp = t_comp + ex_flops / (hw.peak_flops * e_ex)
        mm_flops = mm_flops + ex_flops
    full = (ck == 2).astype(float)
    # Full and minimal recomputation both re-run the memory-bound kernels (norms, activations) forward.
    elem_re = (ck >= 2).astype(float)
    elem_tok = w.elementwise_bytes_per_token * (3.0 + elem_re) + w.fp8_cast_bytes_per_token
    elem = tokens_mb * elem_tok / (tp * pp)
    t_mem = elem / (hw.mem_bw_bytes_s * p.mem_eff)
    t_ovh = p.layer_overhead_s * (L / pp) * (1.0 + 0.5 * full)
    t_mb = t_comp + t_mem + t_ovh

    intra = topo.intra_gbs * 1e9 * p.comm_eff
    inter = topo.inter_gbs * 1e9 * p.comm_eff
    # Tensor parallel: 2 all-reduces (or all-gather + reduce-scatter with sequence parallel) forward, 2
    # backward, 2 more when the forward is recomputed, of tokens·d activations, inside the node.
    tp_vol = np.where(tp > 1, (4.0 + 2.0 * full) * 2.0 * (tp - 1) / tp * tokens_mb * d * ab * (L / pp), 0.0)
    t_tp = tp_vol / intra
    if pins.tp_overlap:
        # Tensor-parallel communication pipelined with the GEMMs (Transformer Engine userbuffers): only the
        # share ``overlap`` cannot hide, or what the compute is too short to cover, stays exposed.
        t_tp = np.maximum((1.0 - p.overlap) * t_tp, t_tp - t_mb)
    # Context parallel: all-gather K and V per layer forward, reduce-scatter their gradients backward.
    t_cp = 0.0
    if cp > 1:
        kv = tokens_mb * 2 * sh.kv_dim * ab / tp
        t_cp = (L / pp) * 2.0 * (cp - 1) * kv / (intra if tp * cp <= topo.fast_domain else inter)
    span_all = cand["n_f"] > topo.fast_domain
    t_p2p = np.where(pp > 1, 2.0 * tokens_mb * d * ab / tp / np.where(span_all, inter, intra), 0.0)
    t_mb_total = t_mb + t_tp + t_cp + t_p2p
    t_a2a: Any = 0.0
    if moe:
        # Expert all-to-all of the routed tokens (``_a2a_copies``), not overlapped with compute.
        n_in = np.minimum(ep, np.maximum(1.0, np.floor(topo.fast_domain / (tp * cp))))
        c_in, c_out = _a2a_copies(ep, n_in, sh.experts_total, sh.experts_active, pins.routing)
        t_one = tokens_mb * d * ab / tp * (c_in / intra + c_out / inter)
        t_a2a = np.where(ep > 1, (4.0 + 2.0 * full) * (L / pp) * t_one, 0.0)
        t_mb_total = t_mb_total + t_a2a
    bubble = float(pins.pipeline_flushes) * (pp - 1.0) / vp * t_mb_total
    t_pipe = n_micro * t_mb_total + bubble

    # Data-parallel traffic. Routed-expert weights (MoE) are split by expert parallelism: a rank holds
    # 1/ep of them and shards or all-reduces them only with the ranks holding the same experts.
    wb = _weight_bytes(w)
    exp_w = w.expert_params * wb / (tp * pp)
    exp_g = exp_w if w.method == Method.FULL else 0.0
    weights_b = w.params * wb / (tp * pp) - exp_w
    grads_b = w.trainable * wb / (tp * pp) - exp_g
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
    ep_div = np.maximum(ep, shard)  # ranks sharing one copy of the experts' states
    if w.expert_params:
        eshard = ep_div / ep
        per_node_e = np.maximum(1.0, np.floor(topo.fast_domain / (tp * cp * ep)))
        eshard_bw = np.where(
            tp * cp * ep_div > topo.fast_domain,
            np.minimum(intra, np.minimum(per_node_e, eshard) * inter),
            intra,
        )
        fs_vol_e = (2.0 * exp_w + exp_g) / ep * (eshard - 1.0) / eshard
        t_fs = t_fs + fs_vol_e / eshard_bw
    fs_exposed = np.where(scope != FSDP_NONE, n_micro * np.maximum((1 - p.overlap) * t_fs, t_fs - t_mb), 0.0)
    # Gradient all-reduce across replicas once per step (DDP; or across hybrid-shard groups).
    replicas = np.where(scope == FSDP_NONE, dp, np.where(scope == FSDP_HYBRID, dp / shard, 1.0))
    ar_bytes = grads_b / np.where(scope == FSDP_NONE, 1.0, shard)
    ar_bw = np.where(scope == FSDP_NONE, dp_bw, inter)
    t_ar = np.where(replicas > 1, 2.0 * (replicas - 1) / replicas * ar_bytes / ar_bw, 0.0)
    if w.expert_params:
        replicas_e = np.maximum(1.0, dp / ep_div)
        t_ar = t_ar + np.where(
            replicas_e > 1, 2.0 * (replicas_e - 1) / replicas_e * exp_g / ep_div / ar_bw, 0.0
        )
    ar_exposed = np.maximum((1 - p.overlap) * t_ar, t_ar - t_bwd_mb)
    # Optimizer update, memory bound, on the local shard.
    exp_t = w.expert_params if w.method == Method.FULL else 0.0
    opt_div, opt_div_e = shard, ep_div
    if pins.distributed_optimizer:
        # Each rank updates its own shard of the master weights (ZeRO-1).
        opt_div = np.where(scope == FSDP_NONE, dp, shard)
        opt_div_e = np.where(scope == FSDP_NONE, np.maximum(ep, dp), ep_div)
    t_opt = (
        ((w.trainable - exp_t) / opt_div + exp_t / opt_div_e)
        / (tp * pp)
        * w.optimizer_bytes_per_trainable
        / (hw.mem_bw_bytes_s * p.mem_eff)
    )

    step = t_pipe + fs_exposed + ar_exposed + t_opt + p.step_overhead_s
    t_sync: Any = 0.0
    if topo.shared_host:
        # Ranks on one host's cores: each computes ``slow`` times slower than a rank alone, and the gang
        # synchronises once per step (the all-reduce above is its volume over loopback).
        # Collectives per step: DDP's one all-reduce of the flattened gradients; FSDP's all-gather forward,
        # all-gather backward and reduce-scatter of every block and of the root per micro-batch, then
        # the side-channel all-reduce (``runtime.trainer``).
        n_coll = np.where(scope != FSDP_NONE, n_micro * 3.0 * (L / pp + 1.0) + 1.0, 1.0)
        slow, sync = host_sharing(cand["n_f"], topo.devices_per_node, p)
        t_sync = sync * n_coll
        step = step + (slow - 1.0) * (t_pipe + t_opt + p.step_overhead_s) + t_sync

    terms = memory_terms(w, cand, pins)
    mem = _sum_terms(terms)
    hw_flops = n_micro * (mm_flops + at_flops)
    comm = fs_exposed + ar_exposed + t_sync + n_micro * (t_tp + t_cp + t_p2p + t_a2a)
    a2a_step = n_micro * t_a2a + np.zeros_like(step)
    return Evaluation(
        step,
        mem,
        n_micro * t_comp,
        comm,
        bubble,
        hw_flops,
        n_micro,
        a2a_step,
        *(terms[k] for k in MEMORY_TERMS),
    )


def host_sharing(devices: Any, devices_per_node: int, p: EfficiencyParams) -> tuple[np.ndarray, np.ndarray]:
    """Per-rank slowdown and per-step synchronisation time of gangs of ``devices`` ranks whose devices
    are cores of hosts of ``devices_per_node`` cores (``Topology.shared_host``).

    ``r`` ranks on one host run concurrently on at most ``c - HOST_RESERVED_CORES`` cores (at least one):
    each computes ``r / min(r, free)`` times slower than one rank alone (so 2 ranks on a 2-core host take
    as long per rank as one rank doing both halves), times ``p.gang_slowdown`` (measured: ranks that wait
    on one another at each collective on a busy host lose more than their share); a gang of more than
    one rank pays ``p.gang_sync_s`` per collective (the second array). One rank: factor 1, no sync."""
    r = np.minimum(np.asarray(devices, dtype=float), float(max(1, devices_per_node)))
    free = max(1.0, devices_per_node - HOST_RESERVED_CORES)
    gang = r > 1.0
    slow = np.where(gang, r / np.minimum(r, free) * p.gang_slowdown, 1.0)
    return slow, np.where(gang, p.gang_sync_s, 0.0)


def chosen_plans(
    step_s: np.ndarray, memory_bytes: np.ndarray, capacity_bytes: float, starts: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """The plan each segment of an evaluation reports, for segments that tile the rows one after the other
    (segment ``k`` is rows ``starts[k]`` up to the next start, each non-empty): the fastest plan that fits
    (``memory_bytes <= capacity_bytes``), else the leanest, as ``np.argmin`` picks them one segment at a
    time (the first on ties). Returns the rows' global indices and whether each segment has a fitting plan.
    """
    n = len(step_s)
    at = np.asarray(starts, dtype=np.int64)
    if at.size == 0:
        return at, np.zeros(0, dtype=bool)
    lengths = np.diff(np.append(at, n))
    seg = np.repeat(np.arange(at.size), lengths)
    rows = np.arange(n)
    fit = memory_bytes <= capacity_bytes
    fits = np.logical_or.reduceat(fit, at)
    times = np.where(fit, step_s, np.inf)
    fast = np.minimum.reduceat(np.where(times == np.minimum.reduceat(times, at)[seg], rows, n), at)
    lean = np.minimum.reduceat(
        np.where(memory_bytes == np.minimum.reduceat(memory_bytes, at)[seg], rows, n), at
    )
    idx = np.where(fits, fast, lean)
    for k in np.flatnonzero(idx == n).tolist():  # a NaN: np.argmin's own answer
        a, b = int(at[k]), int(at[k] + lengths[k])
        idx[k] = a + int(np.argmin(times[a:b] if fits[k] else memory_bytes[a:b]))
    return idx, fits


# concat_candidates of recent part lists, by the parts' identities (the parts are kept with the result, so
# an id is never reused while its entry lives)
_CONCAT_CACHE: dict[tuple[int, ...], tuple[list[dict[str, np.ndarray]], dict[str, np.ndarray]]] = {}


def concat_candidates(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Candidate sets of several device counts as one set (same topology otherwise; shared between callers
    of the same parts, like :func:`enumerate_candidates`'s: never modify it)."""
    key = tuple(id(c) for c in parts)
    hit = _CONCAT_CACHE.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], parts, strict=True)):
        return hit[1]
    out = concat_columns(parts)
    if len(_CONCAT_CACHE) >= 4096:
        _CONCAT_CACHE.clear()
    _CONCAT_CACHE[key] = (list(parts), out)
    return out


def concat_columns(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The candidate sets' columns one after the other (not memoised): the integer columns concatenated,
    each ``<name>_f`` float column converted from its integer one, as :func:`enumerate_candidates` makes
    them (the conversion is exact)."""
    out: dict[str, np.ndarray] = {}
    for k in parts[0]:
        if k.endswith("_f") and k[:-2] in out:
            out[k] = out[k[:-2]].astype(float)
        else:
            out[k] = np.concatenate([c[k] for c in parts])
    return out


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
        "expert": int(cand["ep"][i]),
        "micro_batch": int(cand["mb"][i]),
        "grad_accum": int(ev.n_micro[i]),
        "activation_checkpointing": CK_NAMES[int(cand["ck"][i])],
    }


def min_memory_plan(
    w: Workload, cand: dict[str, np.ndarray], topo: Topology, hw: Hardware, p: EfficiencyParams, pins: Pins
) -> float:
    if not cand:
        return math.inf
    return float(memory_bytes(w, cand, pins).min())


__all__ = [
    "CK_NAMES",
    "FSDP_NAMES",
    "Evaluation",
    "Hardware",
    "Method",
    "Pins",
    "Topology",
    "chosen_plans",
    "enumerate_candidates",
    "evaluate",
    "memory_terms",
    "min_memory_plan",
    "plan_dict",
]
