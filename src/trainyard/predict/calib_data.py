"""Published throughput measurements turned into (spec, accelerator, devices, plan, measured step time).

Source: ``predict/data/throughput_calibration.csv`` (a copy of the project's reference data; see its
SOURCES.md). A row's measured step time is ``global_batch_seqs · seq_len / tokens_per_sec_total`` unless
its notes give the step time (Table 5 iteration times, per-step log lines) or sequences per second
(Neuron). MaxText TPU rows give TFLOP/s per chip instead: their step time is MaxText's own FLOP count of
the configuration over that rate (reproducing MaxText's ``calculate_tflops_training_per_device``
accounting: learnable-weight matmuls and full, non-causal attention, times three for training).

Rows whose architecture is not in the source get the published configuration of that model (Llama 2/3/3.1
and GPT-3 model cards; the MoE models' configuration files, cited in ``MODEL_SOURCES``); a row whose step
time cannot be derived is left out. Every assumption is recorded on the row.

Leave-one-model-out holds out an *architecture*: rows of the same model published under two names
(``MODEL_ALIASES``) are held out together.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from trainyard.catalog.names import ACCELERATOR_FAMILY, normalize_accelerator_name
from trainyard.spec.models import JobSpec

# Published configurations of models whose rows leave the dimensions blank.
KNOWN_MODELS: dict[str, dict[str, Any]] = {
    "Llama-2-70B": dict(
        n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, d_ff=28672, ffn="gated", vocab_size=32000
    ),
    "Llama-3-70B": dict(
        n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, d_ff=28672, ffn="gated", vocab_size=128256
    ),
    "Llama-3.1-70B": dict(
        n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, d_ff=28672, ffn="gated", vocab_size=128256
    ),
    "Llama-3.1-405B": dict(
        n_layers=126, d_model=16384, n_heads=128, n_kv_heads=8, d_ff=53248, ffn="gated", vocab_size=128256
    ),
    "GPT3-175B": dict(n_layers=96, d_model=12288, n_heads=96, ffn="mlp", vocab_size=50257),
    "Megatron-1T": dict(
        n_layers=128, d_model=25600, n_heads=160, ffn="mlp", vocab_size=51200, tie_embeddings=True
    ),
    "Turing-NLG-530B": dict(
        n_layers=105, d_model=20480, n_heads=128, ffn="mlp", vocab_size=51200, tie_embeddings=True
    ),
    # ---- mixture-of-experts (d_ff is the width of one expert) ----
    "GPT-OSS-20B": dict(
        n_layers=24,
        d_model=2880,
        n_heads=64,
        n_kv_heads=8,
        head_dim=64,
        d_ff=2880,
        ffn="gated",
        vocab_size=201088,
        n_experts=32,
        experts_per_token=4,
    ),
    "Qwen3-30B-A3B": dict(
        n_layers=48,
        d_model=2048,
        n_heads=32,
        n_kv_heads=4,
        head_dim=128,
        d_ff=768,
        ffn="gated",
        vocab_size=151936,
        n_experts=128,
        experts_per_token=8,
    ),
    # MLA attention as its parameter-equivalent GQA (128 heads x 96, 8 KV heads: 187.2M vs MLA's 187.1M
    # per layer); the shared expert as a ninth always-active expert; the 3 dense layers (d_ff 18432 =
    # 9 x 2048, the same FLOPs as 9 experts) as MoE layers.
    "DeepSeek-V3-671B": dict(
        n_layers=61,
        d_model=7168,
        n_heads=128,
        n_kv_heads=8,
        head_dim=96,
        d_ff=2048,
        ffn="gated",
        vocab_size=129280,
        n_experts=256,
        experts_per_token=9,
    ),
}
KNOWN_MODELS["Qwen3-MoE-30B"] = KNOWN_MODELS["Qwen3-30B-A3B"]
MOE_MODELS = ("GPT-OSS-20B", "Qwen3-MoE-30B", "DeepSeek-V3-671B", "Qwen3-30B-A3B")

# Where each MoE architecture comes from, and what the spec cannot express (recorded on the row).
MODEL_SOURCES: dict[str, str] = {
    "GPT-OSS-20B": (
        "GPT-OSS-20B from openai/gpt-oss-20b config.json (24 layers, hidden 2880, 64 heads x 64, 8 KV heads, "
        "32 experts of width 2880, 4 per token, vocab 201088; 20.9B parameters per the model card); the "
        "128-token sliding window of every other layer is not modelled (attention FLOPs overstated)"
    ),
    "Qwen3-30B-A3B": (
        "Qwen3-30B-A3B from Qwen/Qwen3-30B-A3B config.json (48 layers, hidden 2048, 32 heads x 128, 4 KV "
        "heads, 128 experts of width 768, 8 per token, vocab 151936, untied; 30.5B total, 3.3B active)"
    ),
    "DeepSeek-V3-671B": (
        "DeepSeek-V3 from deepseek-ai/DeepSeek-V3 inference/configs/config_671B.json (61 layers, dim 7168, "
        "128 heads, MLA q_lora 1536 / kv_lora 512, 256 routed experts of width 2048 + 1 shared, 8 routed per "
        "token, first 3 layers dense with width 18432, vocab 129280); MLA as parameter-equivalent GQA "
        "(128 heads x 96, 8 KV heads), the shared expert as a 9th active expert, the dense layers as MoE "
        "layers (total parameters 701B modelled vs 671B), no multi-token-prediction layer"
    ),
}
MODEL_SOURCES["Qwen3-MoE-30B"] = MODEL_SOURCES["Qwen3-30B-A3B"]
# One architecture published under two names: held out together in leave-one-model-out.
MODEL_ALIASES = {"Qwen3-MoE-30B": "Qwen3-30B-A3B", "Llama-3-70B": "Llama-3.1-70B"}

# NeMo Automodel benchmark rows: what the performance table leaves out, from the benchmark configs
# (examples/benchmark/configs/*_te_deepep*.yaml in NVIDIA-NeMo/Automodel).
AUTOMODEL_CONFIG: dict[str, dict[str, Any]] = {
    "GPT-OSS-20B": dict(
        expert=8,
        activation_checkpointing="none",
        note=(
            "gptoss_20b_te_deepep.yaml: ep_size 8 (the table leaves EP blank), activation_checkpointing false"
        ),
    ),
    "Qwen3-MoE-30B": dict(
        expert=8,
        activation_checkpointing="full",
        note="qwen3_moe_30b_te_deepep.yaml: ep_size 8, activation_checkpointing true",
    ),
    "DeepSeek-V3-671B": dict(
        expert=64,
        activation_checkpointing="full",
        note=(
            "deepseek_v3_te_deepep_1024.yaml: ep_size 64, pp 4 interleaved, pp_microbatch_size 1, "
            "activation_checkpointing true; local batch 8 x GA 4: 4 pipeline schedules (fill and drain) "
            "of 8 micro-batches per step"
        ),
    ),
}


@dataclass(frozen=True)
class CalibrationRow:
    index: int
    model_name: str
    hardware: str
    accelerator: str
    family: str
    stack: str
    devices: int
    spec: JobSpec
    plan: dict[str, Any]
    measured_step_time_s: float
    fast_domain_devices: int | None = None
    inter_node_gbps: float | None = None  # per device, when the source states the network
    assumptions: tuple[str, ...] = field(default_factory=tuple)

    @property
    def model_key(self) -> str:
        """The architecture (held out as one model in leave-one-model-out)."""
        return MODEL_ALIASES.get(self.model_name, self.model_name)

    @property
    def is_moe(self) -> bool:
        return self.spec.model.n_experts is not None and self.spec.model.n_experts > 1

    @property
    def group(self) -> str:
        from trainyard.predict.workload import compute_dtype

        return f"{self.family}/{self.stack}/{compute_dtype(self.spec.workload.precision)}"


@dataclass(frozen=True)
class SkippedRow:
    index: int
    model_name: str
    hardware: str
    reason: str


def _f(v: str) -> float | None:
    v = (v or "").strip()
    return float(v) if v else None


def _i(v: str) -> int | None:
    x = _f(v)
    return int(x) if x is not None else None


def maxtext_training_flops(
    *,
    batch: int,
    seq: int,
    emb: int,
    mlp: int,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    layers: int,
    vocab: int,
    gated: bool = True,
    causal_halved: bool = False,
) -> float:
    """Total training FLOPs of one step in MaxText's accounting (all devices)."""
    bs = batch * seq
    ffn1 = 2 * bs * mlp * emb * (2 if gated else 1)
    ffn2 = 2 * bs * mlp * emb
    qkv = 2 * bs * emb * (q_heads + 2 * kv_heads) * head_dim
    proj = 2 * bs * q_heads * head_dim * emb
    attn = 4 * bs * seq * q_heads * head_dim * (0.5 if causal_halved else 1.0)
    embed = 2 * bs * emb * vocab
    return ((ffn1 + ffn2 + qkv + proj) * layers + embed) * 3 + attn * layers * 3


def _precision(p: str) -> str:
    p = p.lower()
    if "fp8" in p:
        return "fp8-mixed"
    if p.startswith("fp16"):
        return "fp16-mixed"
    return "bf16-mixed"


def _stack(hardware: str, parallelism: str) -> str:
    if "TPU" in hardware or "MaxText" in parallelism:
        return "xla"
    if "Trainium" in hardware:
        return "neuron"
    return "cuda"


def _spec(name: str, model: dict[str, Any], *, seq: int, batch: int, precision: str) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": re.sub(r"[^A-Za-z0-9._-]", "-", name),
            "model": model,
            "workload": {"precision": precision, "seq_len": seq, "global_batch": batch, "steps": 1},
        }
    )


def parse_rows(text: str) -> tuple[list[CalibrationRow], list[SkippedRow]]:
    rows: list[CalibrationRow] = []
    skipped: list[SkippedRow] = []
    for idx, r in enumerate(csv.DictReader(text.splitlines())):
        name, hw, notes, par = r["model"], r["hardware"], r["notes"], r["parallelism"]
        try:
            row = _row(idx, r)
        except _Skip as s:
            skipped.append(SkippedRow(idx, name, hw, str(s)))
            continue
        del notes, par
        rows.append(row)
    return rows, skipped


class _Skip(Exception):
    pass


def _row(idx: int, r: dict[str, str]) -> CalibrationRow:
    name, hw, notes, par = r["model"], r["hardware"], r["notes"], r["parallelism"]
    hw_key = hw.split("(")[0].strip()
    acc = normalize_accelerator_name(hw_key.replace("Trainium1", "trn1"))
    if acc is None:
        raise _Skip(f"hardware {hw!r} is not in the catalog")
    family = ACCELERATOR_FAMILY[acc]
    stack = _stack(hw, par)
    devices = _i(r["num_devices"]) or 0
    seq, batch, mb = _i(r["seq_len"]), _i(r["global_batch_seqs"]), _i(r["micro_batch"])
    precision = _precision(r["precision"])
    assumptions: list[str] = []
    plan: dict[str, Any] = {}
    fast_domain: int | None = None
    # ---- architecture ----
    if r["n_layers"]:
        layers, d, heads = int(r["n_layers"]), int(r["d_model"]), int(r["n_heads"])
        if name.startswith("MPT"):
            model = dict(
                n_layers=layers, d_model=d, n_heads=heads, ffn="mlp", vocab_size=50368, tie_embeddings=True
            )
        elif name.startswith("MaxText"):
            m = re.search(r"mlp_dim=(\d+)", notes)
            if not m:
                raise _Skip("MaxText row without mlp_dim")
            hd = re.search(r"head_dim=(\d+)", notes)
            model = dict(
                n_layers=layers, d_model=d, n_heads=heads, d_ff=int(m.group(1)), ffn="gated", vocab_size=32000
            )
            # MaxText's base.yml sets head_dim 128 unless the config overrides it (the 128B and 1024B
            # configs reach their published sizes only with it).
            model["head_dim"] = int(hd.group(1)) if hd else 128
            if not hd:
                assumptions.append("head_dim 128 (MaxText base.yml default)")
        else:
            model = dict(KNOWN_MODELS.get(name, {})) or dict(
                n_layers=layers, d_model=d, n_heads=heads, ffn="mlp", vocab_size=51200
            )
    elif name in KNOWN_MODELS:
        model = dict(KNOWN_MODELS[name])
        default = f"architecture of {name} from its published configuration"
        assumptions.append(MODEL_SOURCES.get(name, default))
    elif r["params_b"]:
        model = dict(architecture="custom", params_b=float(r["params_b"]))
        assumptions.append(f"{name}: only the size is published; Llama-like shape derived from params_b")
    else:
        raise _Skip("no architecture")
    # ---- batch and sequence ----
    if seq is None:
        m = re.search(r"total_weights (\d+) tokens/step", notes)
        if m and name in KNOWN_MODELS:
            seq = 8192
            batch = int(m.group(1)) // seq
            assumptions.append("seq_len 8192 assumed (Llama 3.1 default); batch = tokens per step / 8192")
        else:
            raise _Skip("no sequence length")
    if batch is None:
        if ("TPU" in hw and "tokens/sec/device" in notes.lower()) or "Approx tokens/sec/device" in notes:
            batch = devices
            assumptions.append("global batch not published; 1 sequence per chip assumed")
        else:
            raise _Skip("no global batch")
    spec = _spec(name, model, seq=seq, batch=batch, precision=precision)
    # ---- parallelism plan ----
    ck = "none"
    if "act_ckpt=True" in notes or "remat=full" in notes:
        ck = "full"
    elif "remat=qkv_proj_offloaded" in notes:
        # MaxText qkv_proj_offloaded saves nothing on the device (names_which_can_be_saved=[]) and
        # offloads the Q/K/V projections to host memory: device memory as full recomputation, and the
        # backward recomputes everything but those projections.
        ck = "full"
        assumptions.append("remat=qkv_proj_offloaded: Q/K/V in host memory, the rest recomputed (as full)")
    elif "remat=minimal" in notes:
        # MaxText minimal (checkpoint_dots_with_no_batch_dims): matmul outputs saved, the rest recomputed.
        ck = "minimal"
    elif "selective" in par:
        ck = "selective"
    if "Automodel" in par:
        # NeMo Automodel: FSDP2 over all data-parallel ranks, expert parallel inside it, optional pipeline.
        cfg = AUTOMODEL_CONFIG.get(name, {})
        tp_m, pp_m, vp_m = re.search(r"TP(\d+)", par), re.search(r"PP(\d+)", par), re.search(r"VP(\d+)", par)
        ep_m = re.search(r"EP(\d+)", par)
        plan = {
            "fsdp": True,
            "fsdp_scope": "full",
            "tensor": int(tp_m.group(1)) if tp_m else 1,
            "pipeline": int(pp_m.group(1)) if pp_m else 1,
            "virtual_stages": int(vp_m.group(1)) if vp_m else 1,
            "micro_batch": mb or 1,
            "activation_checkpointing": cfg.get("activation_checkpointing", ck),
        }
        ga_m = re.search(r"GA(\d+)", par)
        if plan["pipeline"] > 1 and ga_m:
            # Automodel runs one pipeline schedule per gradient-accumulation step: GA fills and drains.
            plan["pipeline_flushes"] = int(ga_m.group(1))
        if ep_m or "expert" in cfg:
            plan["expert"] = int(ep_m.group(1)) if ep_m else int(cfg["expert"])
        if "note" in cfg:
            assumptions.append(f"Automodel benchmark config {cfg['note']}")
        if cfg:
            # The benchmark models are cast to bf16 (initialize_weights(dtype=torch.bfloat16)) and trained
            # with torch.optim.Adam: weights, gradients and both moments in bf16, no fp32 master copy.
            plan["bf16_states"] = True
            assumptions.append(
                "model states in bf16 (Automodel casts the benchmark model to bf16; torch.optim.Adam keeps "
                "its moments in the parameters' dtype): 8 bytes per parameter"
            )
            # fake_balanced_gate: true in every benchmark config: token t goes to experts t*k ... t*k+k-1.
            plan["routing"] = "contiguous"
            assumptions.append(
                "fake_balanced_gate: token t routed to the adjacent experts t*k..t*k+k-1 "
                "(all-to-all replayed with contiguous routing)"
            )
    elif stack == "cuda" and "FSDP" in par and "TP" not in par and "FSDP=0" not in par:
        plan = {
            "fsdp": True,
            "fsdp_scope": "full",
            "tensor": 1,
            "pipeline": 1,
            "micro_batch": mb or 1,
            "activation_checkpointing": ck,
        }
    elif "Megatron" in par or "FSDP=0" in par:
        tp = int(re.search(r"TP=?(\d+)", par).group(1))  # type: ignore[union-attr]
        pp = int(re.search(r"PP=?(\d+)", par).group(1))  # type: ignore[union-attr]
        vp_m = re.search(r"(?:VP|interleave=)(\d+)", par)
        cp_m = re.search(r"CP(\d+)", par)
        if ck == "none" and "selective" not in par:
            assumptions.append("activation recomputation not published; none assumed")
        plan = {
            "fsdp": False,
            "tensor": tp,
            "pipeline": pp,
            "micro_batch": mb or 1,
            "activation_checkpointing": ck,
            "virtual_stages": int(vp_m.group(1)) if vp_m else 1,
            "context": int(cp_m.group(1)) if cp_m else 1,
        }
        ep_m = re.search(r"EP(\d+)", par)
        if ep_m:
            plan["expert"] = int(ep_m.group(1))
        if "Megatron-Bridge" in r["source"]:
            # Performance configs: use_distributed_optimizer, grad_reduce_in_fp32 False (bf16 gradients,
            # set_llama31_common_configs / set_qwen3_common_configs), FP8 recipes with fp8_param_gather.
            plan["distributed_optimizer"] = True
            note = "distributed optimizer (fp32 master and Adam moments sharded over data parallel)"
            note += ", bf16 grads"
            if precision == "fp8-mixed":
                plan["fp8_params"] = True
                note += ", FP8 weights (fp8_param_gather)"
            assumptions.append(f"Megatron-Bridge performance config: {note}")
        if "Megatron-Bridge" in r["source"] and tp > 1:
            plan["tp_overlap"] = True
            assumptions.append(
                "tensor-parallel communication overlapped with the GEMMs (userbuffers), as the "
                "Megatron-Bridge performance configs set (scripts/performance/configs/llama/"
                "llama3_llm_pretrain.py, H100: userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192)"
            )
    elif "Trainium" in hw:
        # Degrees are in NeuronCores (2 per chip): tensor parallel over NCs of whole chips.
        tp_nc = int(re.search(r"TP=(\d+)", par).group(1))  # type: ignore[union-attr]
        pp = int(re.search(r"PP=(\d+)", par).group(1))  # type: ignore[union-attr]
        plan = {
            "fsdp": False,
            "tensor": max(1, tp_nc // 2),
            "pipeline": pp,
            "micro_batch": mb or 1,
            "activation_checkpointing": "selective",
        }
        assumptions.append("Neuron tensor degree in NeuronCores halved to chips; selective recompute assumed")
        # Neuron's data parallelism runs the ZeRO-1 optimizer (master weights and moments sharded over the
        # replicas; ``params.STACK_PLAN_SPACE``). The precision column says how the states are held:
        # "BF16+FP32Optimizer" keeps an fp32 master copy and fp32 moments; "BF16+SR" trains the model in
        # bf16 with stochastic rounding (XLA_USE_BF16: weights, gradients and moments in bf16, no master).
        plan["distributed_optimizer"] = True
        if "+SR" in r["precision"]:
            plan["bf16_states"] = True
            assumptions.append("BF16+SR: weights, gradients and Adam moments in bf16, no fp32 master copy")
        assumptions.append("ZeRO-1 optimizer (NeuronX Distributed / neuronx-nemo-megatron data parallel)")
    elif stack == "xla" and not par.strip():
        # Parallelism, micro-batch and rematerialisation not published (MaxText tiering table): the
        # planner chooses, as it would for a user's spec.
        plan = {}
        assumptions.append("parallelism not published: the planner's choice is replayed")
    elif stack == "xla":
        tp_m = re.search(r"ici_tensor=(\d+)", par)
        tp = int(tp_m.group(1)) if tp_m else 1
        slices = re.search(r"(\d+)x v\w+-(\d+) slices", par)
        n_slices = int(slices.group(1)) if slices else 1
        dp = devices // tp
        if "remat" not in notes and "TPU" not in hw:
            ck = "full"
            assumptions.append("MaxText GPU recipe: full rematerialisation assumed")
        elif "remat" not in notes:
            ck = "full"
            assumptions.append("rematerialisation not published; full assumed")
        plan = {
            "fsdp": True,
            "fsdp_scope": "hybrid" if n_slices > 1 else "full",
            "tensor": tp,
            "pipeline": 1,
            "micro_batch": max(1, batch // dp),
            "activation_checkpointing": ck,
        }
        if n_slices > 1:
            fast_domain = devices // n_slices
    else:
        raise _Skip(f"parallelism {par!r} not understood")
    inter: float | None = None
    m_net = re.search(r"(\d+) Gbps (?:RoCE )?node-node", notes)
    if m_net:
        inter = float(m_net.group(1)) / 8.0  # per node -> per GPU (8 per node)
    # ---- measured step time ----
    step = _measured_step(r, spec, model, seq, batch, devices, notes, assumptions)
    return CalibrationRow(
        index=idx,
        model_name=name,
        hardware=hw,
        accelerator=acc,
        family=family,
        stack=stack,
        devices=devices,
        spec=spec,
        plan=plan,
        measured_step_time_s=step,
        fast_domain_devices=fast_domain,
        inter_node_gbps=inter,
        assumptions=tuple(assumptions),
    )


def _measured_step(
    r: dict[str, str],
    spec: JobSpec,
    model: dict[str, Any],
    seq: int,
    batch: int,
    devices: int,
    notes: str,
    assumptions: list[str],
) -> float:
    m = re.search(r"measured (?:iteration time|time per global step) ([\d.]+) s", notes)
    if m:
        return float(m.group(1))
    m = re.search(r"([\d.]+) s/step", notes)
    if m:
        return float(m.group(1))
    m = re.search(r"reported ([\d.]+) seq/sec", notes)
    if m:
        return batch / float(m.group(1))
    tok = _f(r["tokens_per_sec_total"])
    if tok:
        return batch * seq / tok
    m = re.search(r"(\d+) TFLOP/s/chip", notes)
    if m and "mlp_dim" in notes:
        heads = int(model["n_heads"])
        hd = int(model.get("head_dim") or model["d_model"] // heads)
        flops = maxtext_training_flops(
            batch=batch,
            seq=seq,
            emb=int(model["d_model"]),
            mlp=int(model["d_ff"]),
            q_heads=heads,
            kv_heads=heads,
            head_dim=hd,
            layers=int(model["n_layers"]),
            vocab=int(model["vocab_size"]),
        )
        assumptions.append("step time = MaxText FLOPs / (reported TFLOP/s per chip x chips)")
        return flops / (float(m.group(1)) * 1e12 * devices)
    raise _Skip("step time cannot be derived")


@cache
def packaged_rows() -> tuple[tuple[CalibrationRow, ...], tuple[SkippedRow, ...]]:
    text = resources.files("trainyard.predict").joinpath("data/throughput_calibration.csv").read_text("utf-8")
    rows, skipped = parse_rows(text)
    return tuple(rows), tuple(skipped)
