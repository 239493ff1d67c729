"""Workload math: FLOPs by component, bytes moved by memory-bound work, activation and state sizes.

Everything here depends on the job spec only (never on the accelerator). Quantities are per *token* unless
the name says otherwise, so the planner can scale them by micro-batch, sequence and parallel degrees.

Conventions
- A matmul of an ``m×k`` by ``k×n`` matrix is ``2·m·k·n`` FLOPs. The backward pass of a trainable weight
  costs twice its forward (input gradient + weight gradient); a frozen weight (LoRA base) costs once.
- Causal attention computes half the score matrix (FlashAttention-style kernels skip the masked blocks).
- Model FLOPs (for MFU) exclude recomputation; hardware FLOPs include it.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainyard.spec.models import (
    ActivationCheckpointing,
    Architecture,
    FFNKind,
    JobSpec,
    Method,
    ModelSpec,
    Optimizer,
    Precision,
)


@dataclass(frozen=True)
class Shape:
    """The block structure the math needs; a custom model gets a Llama-like shape from its size."""

    n_blocks: int
    d_model: int
    n_heads: int
    q_dim: int
    kv_dim: int
    d_ff: int
    ffn_mats: int  # 2 for an MLP, 3 for a gated FFN
    experts_total: int
    experts_active: int
    vocab_size: int
    causal: bool
    derived: bool = False  # True when invented from params_b

    @property
    def is_moe(self) -> bool:
        return self.experts_total > 1

    @property
    def block_params(self) -> int:
        attn = self.d_model * (2 * self.q_dim + 2 * self.kv_dim)
        router = self.d_model * self.experts_total if self.is_moe else 0
        return (
            attn + self.experts_total * self.ffn_mats * self.d_model * self.d_ff + router + 2 * self.d_model
        )

    @property
    def block_expert_params(self) -> int:
        """Routed-expert weights of one block (0 for a dense model): what expert parallelism splits."""
        return self.experts_total * self.ffn_mats * self.d_model * self.d_ff if self.is_moe else 0


def shape_of(model: ModelSpec) -> Shape:
    if model.is_custom:
        assert model.params_b is not None
        n = model.params_b * 1e9
        # Llama-like: N ≈ 12·L·d² with L ≈ d/128; d a multiple of 1024 (128 for small models) so the
        # head count (d/128) divides by the usual tensor-parallel degrees.
        d_raw = (n * 128 / 12) ** (1 / 3)
        step = 1024 if d_raw >= 1024 else 128
        d = max(128, round(d_raw / step) * step)
        layers = max(1, round(n / (12 * d * d)))
        return Shape(
            n_blocks=layers,
            d_model=d,
            n_heads=max(1, d // 128),
            q_dim=d,
            kv_dim=d,
            d_ff=4 * d,
            ffn_mats=2,
            experts_total=1,
            experts_active=1,
            vocab_size=32000,
            causal=True,
            derived=True,
        )
    assert model.d_model is not None and model.n_heads is not None and model.vocab_size is not None
    hd = model.head_dim_eff
    return Shape(
        n_blocks=model.n_blocks,
        d_model=model.d_model,
        n_heads=model.n_heads,
        q_dim=model.n_heads * hd,
        kv_dim=model.n_kv_heads_eff * hd,
        d_ff=model.d_ff_eff,
        ffn_mats=3 if model.ffn == FFNKind.GATED else 2,
        experts_total=model.n_experts or 1,
        experts_active=model.experts_per_token or 1,
        vocab_size=model.vocab_size,
        causal=model.architecture != Architecture.ENCODER,
    )


def compute_dtype(precision: Precision) -> str:
    return {
        Precision.FP32: "fp32",
        Precision.BF16_MIXED: "bf16",
        Precision.FP16_MIXED: "fp16",
        Precision.FP8_MIXED: "fp8",
    }[precision]


@dataclass(frozen=True)
class ComponentFlops:
    """Forward FLOPs per token of the whole model, by component (sequence length already applied)."""

    qkv: float
    attn_out: float
    attn_scores: float  # QKᵀ and AV (causal-halved for decoders)
    ffn: float  # active experts only, plus the router
    logits: float
    lora: float  # adapter matmuls (0 for full fine-tuning)
    experts: float = 0.0  # the part of ``ffn`` run as routed-expert (grouped) matmuls; 0 for a dense model

    @property
    def blocks_matmul(self) -> float:
        return self.qkv + self.attn_out + self.ffn

    @property
    def total(self) -> float:
        return self.blocks_matmul + self.attn_scores + self.logits + self.lora


def forward_flops_per_token(shape: Shape, seq_len: int, lora_rank: int | None = None) -> ComponentFlops:
    L, d = shape.n_blocks, shape.d_model
    qkv = L * 2.0 * d * (shape.q_dim + 2 * shape.kv_dim)
    attn_out = L * 2.0 * shape.q_dim * d
    causal = 0.5 if shape.causal else 1.0
    # QKᵀ: 2·s·q_dim per token, AV: 2·s·q_dim per token.
    scores = L * 4.0 * seq_len * shape.q_dim * causal
    experts = L * shape.experts_active * shape.ffn_mats * 2.0 * d * shape.d_ff
    ffn = experts
    if shape.is_moe:
        ffn += L * 2.0 * d * shape.experts_total  # router
    else:
        experts = 0.0
    logits = 2.0 * d * shape.vocab_size
    lora = 0.0
    if lora_rank is not None:
        r = lora_rank
        attn = r * ((d + shape.q_dim) * 2 + (d + shape.kv_dim) * 2)
        ffn_l = r * shape.ffn_mats * (d + shape.d_ff) * shape.experts_active
        lora = L * 2.0 * (attn + ffn_l)
    return ComponentFlops(qkv, attn_out, scores, ffn, logits, lora, experts)


@dataclass(frozen=True)
class TrainingFlops:
    """Training FLOPs per token split by how they run (per token, whole model, no parallelism)."""

    matmul_model: float  # projections, FFN, logits, adapters: forward + backward
    attention_model: float  # attention scores forward + backward
    matmul_recompute: float  # extra forward matmuls from activation recomputation
    attention_recompute: float

    @property
    def model(self) -> float:
        return self.matmul_model + self.attention_model

    @property
    def hardware(self) -> float:
        return self.model + self.matmul_recompute + self.attention_recompute


def training_flops_per_token(
    fwd: ComponentFlops, method: Method, checkpointing: ActivationCheckpointing
) -> TrainingFlops:
    # Backward of a trainable weight: 2× forward; of a frozen base weight: 1× (input gradient only).
    base_factor = 3.0 if method == Method.FULL else 2.0
    matmul = base_factor * (fwd.blocks_matmul + fwd.logits) + 3.0 * fwd.lora
    attention = 3.0 * fwd.attn_scores
    mm_re = at_re = 0.0
    if checkpointing == ActivationCheckpointing.FULL:
        mm_re, at_re = fwd.blocks_matmul + fwd.lora, fwd.attn_scores
    elif checkpointing == ActivationCheckpointing.SELECTIVE:
        at_re = fwd.attn_scores
    return TrainingFlops(matmul, attention, mm_re, at_re)


def head_flops_per_token(fwd: ComponentFlops, method: Method) -> float:
    """Training FLOPs per token of the output layer (logits), included in the matmul terms; FP8 recipes
    keep it in bf16 (Transformer Engine covers the blocks' linear layers only)."""
    return fwd.logits * (3.0 if method == Method.FULL else 2.0)


def expert_flops_per_token(
    fwd: ComponentFlops, method: Method, checkpointing: ActivationCheckpointing
) -> float:
    """Training FLOPs per token of the routed-expert matmuls (included in :func:`training_flops_per_token`'s
    matmul terms; the planner times them separately, at the tokens each expert sees)."""
    base_factor = 3.0 if method == Method.FULL else 2.0
    return fwd.experts * (base_factor + (1.0 if checkpointing == ActivationCheckpointing.FULL else 0.0))


def training_flops_per_step(spec: JobSpec, checkpointing: ActivationCheckpointing | None = None) -> float:
    """Model FLOPs of one optimizer step (no recomputation unless ``checkpointing`` is given)."""
    w = workload_of(spec)
    ck = checkpointing or ActivationCheckpointing.NONE
    tf = training_flops_per_token(w.fwd, spec.workload.method, ck)
    flops = tf.model if checkpointing is None else tf.hardware
    return flops * spec.tokens_per_step


# ---- memory-bound work -------------------------------------------------------------------------------


def elementwise_bytes_per_token(shape: Shape, act_bytes: float) -> float:
    """Bytes moved forward per token by memory-bound kernels (norms, residual adds, activations, RoPE).

    Per block: two norms (read + write d), two residual adds (read 2d, write d), RoPE on Q and K, the FFN
    activation (MLP: read + write d_ff; gated: read 2·d_ff, write d_ff) — all for the active experts.
    """
    per_block = act_bytes * (
        2 * 2 * shape.d_model
        + 2 * 3 * shape.d_model
        + 2 * (shape.q_dim + shape.kv_dim)
        + shape.experts_active * (3 if shape.ffn_mats == 3 else 2) * shape.d_ff
    )
    if shape.is_moe:
        # Router logits, softmax and top-k in fp32; token permutation to the experts and back (read d, write
        # k copies; read k expert outputs, write their weighted sum).
        per_block += 3 * 4 * shape.experts_total + act_bytes * 2 * (1 + shape.experts_active) * shape.d_model
    # Final norm, logits write + softmax/cross-entropy read and write in fp32.
    head = act_bytes * 2 * shape.d_model + shape.vocab_size * (act_bytes + 2 * 4)
    return shape.n_blocks * per_block + head


def fp8_cast_bytes_per_token(shape: Shape) -> float:
    """Bytes moved per token, forward and backward, by the FP8 casts of an FP8 recipe (Transformer Engine).

    Every FP8 linear layer quantises its input in the forward pass and its output gradient in the backward
    pass with a fused cast-transpose: read the bf16 tensor (2 B), write the FP8 copy and its transpose
    (2 B). The linear layers of a block are QKV, the attention output, FC1 and FC2 (per active expert).
    """
    d, k = shape.d_model, shape.experts_active
    fwd_inputs = d + shape.q_dim + k * d + k * shape.d_ff
    bwd_grads = shape.q_dim + 2 * shape.kv_dim + d + k * (shape.ffn_mats - 1) * shape.d_ff + k * d
    return 4.0 * shape.n_blocks * (fwd_inputs + bwd_grads)


# Optimizer step traffic per trainable parameter (read + write): AdamW mixed precision reads the fp32 master,
# m, v and the gradient and writes master, m, v and the low-precision copy (~30 B); fp32 AdamW ~28 B.
def optimizer_update_bytes(precision: Precision, optimizer: Optimizer) -> float:
    mixed = precision != Precision.FP32
    return {
        Optimizer.ADAMW: 30.0 if mixed else 28.0,
        Optimizer.SGD: 18.0 if mixed else 16.0,
        Optimizer.ADAFACTOR: 14.0 if mixed else 12.0,
    }[optimizer]


# ---- states ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StateBytes:
    """Bytes of model state per parameter kind (before any sharding)."""

    weights: float  # every parameter in the working precision
    grads: float  # trainable parameters
    master: float  # fp32 master copy of trainable parameters (mixed precision)
    optimizer: float  # optimizer moments of trainable parameters

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.master + self.optimizer


def state_bytes(params: int, trainable: int, precision: Precision, optimizer: Optimizer) -> StateBytes:
    w = 4.0 if precision == Precision.FP32 else 2.0
    # fp8 training keeps bf16 weights (+ fp8 casts, counted in workspace) and bf16 gradients.
    master = 0.0 if precision == Precision.FP32 else 4.0
    # Adafactor keeps factored second moments: O(rows + cols) per matrix, about 1/d of the parameters.
    opt = {Optimizer.ADAMW: 8.0, Optimizer.SGD: 4.0, Optimizer.ADAFACTOR: 0.05}[optimizer]
    frozen = params - trainable if params > trainable else 0
    # A frozen base (LoRA) is held in the working precision only.
    return StateBytes(
        weights=(trainable + frozen) * w,
        grads=trainable * w,
        master=trainable * master,
        optimizer=trainable * opt,
    )


# ---- activations (Korthikanti et al. 2022) ---------------------------------------------------------


def korthikanti_activation_bytes_per_layer(
    s: int, b: int, h: int, a: int, t: int = 1, recompute: str = "none", sequence_parallel: bool = True
) -> float:
    """Activation memory of one transformer layer exactly as in Korthikanti et al. 2022 (fp16, dropout).

    none: ``s·b·h·(34 + 5·a·s/h)`` without parallelism; with tensor parallel ``t`` and sequence parallel
    everything divides by ``t``; without sequence parallel ``s·b·h·(10 + 24/t + 5·a·s/(h·t))``.
    selective: the ``5·a·s/h`` attention term is recomputed. full: only the layer input ``2·s·b·h``.
    """
    sbh = s * b * h
    if recompute == "full":
        return 2.0 * sbh / (t if sequence_parallel else 1)
    attn_scores = 5.0 * a * s / h if recompute == "none" else 0.0
    if sequence_parallel:
        return sbh * (34.0 + attn_scores) / t
    return sbh * (10.0 + 24.0 / t + attn_scores / t)


def activation_bytes_per_token_per_layer(
    shape: Shape,
    seq_len: int,
    act_bytes: float,
    *,
    flash: bool = True,
    dropout: bool = False,
    fp8_linear_inputs: bool = False,
) -> tuple[float, float]:
    """(bytes stored per token per block without recomputation, bytes of the attention-score term).

    The Korthikanti accounting generalised to GQA, any FFN width and gated FFNs: norm inputs, the QKV
    input, Q/K/V, the attention output, the FFN input, its hidden outputs and activation output. With
    ``dropout`` the masks are counted (1 byte each); without ``flash`` the softmax output, its dropout mask
    and dropout output (``5·a·s`` bytes per token at fp16) are stored. With ``fp8_linear_inputs`` (FP8
    recipes: Transformer Engine saves the FP8-cast input of every FP8 linear layer for its weight
    gradient) the inputs of QKV, the attention output projection, FC1 and FC2 (per active expert) are
    stored at 1 byte per element instead of ``act_bytes``.
    """
    d = shape.d_model
    norms = 2 * act_bytes * d
    attn = act_bytes * (d + shape.q_dim + 2 * shape.kv_dim + shape.q_dim)
    hidden = (2 if shape.ffn_mats == 3 else 1) * shape.d_ff + shape.d_ff
    mlp = act_bytes * (d + shape.experts_active * hidden)
    masks = 2 * d if dropout else 0  # attention-output and FFN-output dropout masks, 1 byte each
    if shape.is_moe:
        mlp += act_bytes * 2 * shape.experts_active * d  # tokens dispatched to the experts and their outputs
    if fp8_linear_inputs:
        k = shape.experts_active
        mlp -= (act_bytes - 1.0) * k * (d + shape.d_ff)  # FC1 input (dispatched copy for MoE), FC2 input
        attn -= (act_bytes - 1.0) * (d + shape.q_dim)  # QKV input, output-projection input
    scores = 0.0
    if not flash:
        scores = shape.n_heads * seq_len * (act_bytes + (1 + act_bytes if dropout else 0))
    return norms + attn + mlp + masks, scores


def matmul_output_bytes_per_token_per_layer(shape: Shape, act_bytes: float) -> float:
    """Bytes stored per token per block when only weight-matmul outputs and the block input are saved
    (MaxText ``remat_policy=minimal``, JAX ``checkpoint_dots_with_no_batch_dims``): of the matmul outputs,
    JAX keeps those the backward pass reads — Q/K/V (the attention backward), the attention output
    projection (to recompute the residual stream the second norm reads) and FC1's outputs (two when
    gated; the activation's backward), plus the block input (the scan carry). FC2's output is read only
    when a router weights it (MoE: the gradient of the routing weights), so a dense block does not keep it.
    """
    d, k = shape.d_model, shape.experts_active
    attn = shape.q_dim + 2 * shape.kv_dim + d
    ffn = k * (shape.ffn_mats - 1) * shape.d_ff + (k * d if shape.is_moe else 0)
    return act_bytes * (d + attn + ffn)


def lora_params_of(shape: Shape, rank: int) -> int:
    d = shape.d_model
    attn = rank * ((d + shape.q_dim) * 2 + (d + shape.kv_dim) * 2)
    ffn = rank * shape.ffn_mats * (d + shape.d_ff) * shape.experts_total
    return shape.n_blocks * (attn + ffn)


# ---- the per-spec bundle ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """Everything about a spec the planner needs, computed once per spec."""

    shape: Shape
    params: int
    trainable: int
    fwd: ComponentFlops
    seq_len: int
    global_batch: int
    method: Method
    precision: Precision
    optimizer: Optimizer
    act_bytes: float
    states: StateBytes
    layer_params: float  # parameters of one block (for FSDP gather buffers and TP/PP splits)
    expert_params: float  # routed-expert weights of all blocks (split by expert parallelism); 0 if dense
    embed_params: float
    elementwise_bytes_per_token: float  # forward; the backward moves about twice as much
    fp8_cast_bytes_per_token: float  # forward + backward FP8 quantisation traffic (0 unless fp8-mixed)
    optimizer_bytes_per_trainable: float
    act_per_token_layer: float
    act_scores_per_token_layer: float
    act_matmul_outputs_per_token_layer: float  # what the replay-only "minimal" policy stores

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch

    def flops(self, checkpointing: ActivationCheckpointing) -> TrainingFlops:
        return training_flops_per_token(self.fwd, self.method, checkpointing)


def _workload(spec: JobSpec) -> Workload:
    shape = shape_of(spec.model)
    wl = spec.workload
    params = spec.model.params
    lora_rank = wl.lora_rank if wl.method == Method.LORA else None
    if wl.method == Method.LORA:
        trainable = lora_params_of(shape, wl.lora_rank) if shape.derived else spec.trainable_params
    else:
        trainable = params
    total_params = params + (trainable if wl.method == Method.LORA else 0)
    act_b = 4.0 if wl.precision == Precision.FP32 else 2.0
    act, scores = activation_bytes_per_token_per_layer(
        shape, wl.seq_len_eff, act_b, fp8_linear_inputs=wl.precision == Precision.FP8_MIXED
    )
    embed = float(params - shape.n_blocks * shape.block_params) if not shape.derived else 0.0
    return Workload(
        shape=shape,
        params=total_params,
        trainable=trainable,
        fwd=forward_flops_per_token(shape, wl.seq_len_eff, lora_rank),
        seq_len=wl.seq_len_eff,
        global_batch=wl.global_batch,
        method=wl.method,
        precision=wl.precision,
        optimizer=wl.optimizer,
        act_bytes=act_b,
        states=state_bytes(total_params, trainable, wl.precision, wl.optimizer),
        layer_params=float(shape.block_params),
        expert_params=float(shape.n_blocks * shape.block_expert_params),
        embed_params=max(0.0, embed),
        elementwise_bytes_per_token=elementwise_bytes_per_token(shape, act_b),
        fp8_cast_bytes_per_token=(
            fp8_cast_bytes_per_token(shape) if wl.precision == Precision.FP8_MIXED else 0.0
        ),
        optimizer_bytes_per_trainable=optimizer_update_bytes(wl.precision, wl.optimizer),
        act_per_token_layer=act,
        act_scores_per_token_layer=scores,
        act_matmul_outputs_per_token_layer=matmul_output_bytes_per_token_per_layer(shape, act_b),
    )


_BY_ID: dict[int, tuple[JobSpec, Workload]] = {}


def workload_of(spec: JobSpec) -> Workload:
    """The workload of a spec (memoised per spec object, then on its model and workload sections)."""
    hit = _BY_ID.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    key = spec.model.model_dump_json() + spec.workload.model_dump_json()
    w = _cached_by_key(key, spec)
    if len(_BY_ID) > 4096:
        _BY_ID.clear()
    _BY_ID[id(spec)] = (spec, w)
    return w


_CACHE: dict[str, Workload] = {}


def _cached_by_key(key: str, spec: JobSpec) -> Workload:
    w = _CACHE.get(key)
    if w is None:
        if len(_CACHE) > 4096:
            _CACHE.clear()
        w = _workload(spec)
        _CACHE[key] = w
    return w
