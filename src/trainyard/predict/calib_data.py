"""Published throughput measurements turned into (spec, accelerator, devices, plan, measured step time).

Source: ``predict/data/throughput_calibration.csv`` (a copy of the project's reference data; see its
SOURCES.md). A row's measured step time is ``global_batch_seqs · seq_len / tokens_per_sec_total`` unless
its notes give the step time (Table 5 iteration times, per-step log lines) or sequences per second
(Neuron). MaxText TPU rows give TFLOP/s per chip instead: their step time is MaxText's own FLOP count of
the configuration over that rate (reproducing MaxText's ``calculate_tflops_training_per_device``
accounting: learnable-weight matmuls and full, non-causal attention, times three for training).

Rows whose architecture is not in the source get the published configuration of that model (Llama 2/3/3.1
and GPT-3 model cards); MoE rows are left out (expert-parallel all-to-all traffic is not modelled), as is
any row whose step time cannot be derived. Every assumption is recorded on the row.
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
}
MOE_MODELS = ("GPT-OSS-20B", "Qwen3-MoE-30B", "DeepSeek-V3-671B", "Qwen3-30B-A3B")


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
    if name in MOE_MODELS:
        raise _Skip("MoE with expert parallelism: all-to-all traffic and dimensions not modelled")
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
            if hd:
                model["head_dim"] = int(hd.group(1))
        else:
            model = dict(KNOWN_MODELS.get(name, {})) or dict(
                n_layers=layers, d_model=d, n_heads=heads, ffn="mlp", vocab_size=51200
            )
    elif name in KNOWN_MODELS:
        model = dict(KNOWN_MODELS[name])
        assumptions.append(f"architecture of {name} from its published configuration")
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
    elif "remat=minimal" in notes or "remat=qkv_proj_offloaded" in notes or "selective" in par:
        ck = "selective"
    if stack == "cuda" and "FSDP" in par and "TP" not in par and "FSDP=0" not in par:
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
