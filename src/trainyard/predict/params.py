"""Efficiency parameters of the time model and the calibration that holds them.

A :class:`Calibration` maps keys ``family/stack/precision`` (and, where one accelerator has enough
measurements of its own, ``family/stack/precision/accelerator``) to :class:`EfficiencyParams`. Lookup
falls back from the accelerator key to the group key, to the family with another precision, to generic
priors, and the prediction says which one it used. The packaged calibration lives in
``predict/data/calibration.json`` (written by ``benchmarks/bench_predictor_accuracy.py --write-params``).
Everything here is pure data: loading the packaged JSON reads package data only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from importlib import resources
from typing import Any

from trainyard.catalog.accelerators import Accelerator

CALIBRATION_FORMAT = 1

# Software stack an accelerator family trains with by default.
DEFAULT_STACK = {
    "nvidia": "cuda",
    "amd": "rocm",
    "google-tpu": "xla",
    "aws-trainium": "neuron",
    "intel-gaudi": "synapse",
    "cpu": "torch-cpu",
}


@dataclass(frozen=True)
class PlanSpace:
    """The parallelisms a software stack can run: the planner enumerates only these, and a pin outside
    them has no plan (the prediction says why).

    ``fsdp``: sharding the model states over the data-parallel ranks (full or hybrid); ``pipeline``:
    pipeline stages; ``tensor``: tensor (model) sharding of the layers; ``zero1``: data parallelism
    shards the fp32 master weights and optimizer moments over the replicas (ZeRO-1), as the stack's
    trainer does by default.
    """

    name: str
    fsdp: bool = True
    pipeline: bool = True
    tensor: bool = True
    zero1: bool = False

    def describe(self) -> str:
        kinds = [
            k for k, on in (("FSDP", self.fsdp), ("tensor", self.tensor), ("pipeline", self.pipeline)) if on
        ]
        dp = "data parallel with ZeRO-1" if self.zero1 else "data parallel"
        return f"{self.name}: {', '.join([*kinds, dp])}"


# What each software stack runs (the plan space of the planner and of calibration):
# - CUDA/ROCm/Synapse PyTorch stacks (PyTorch FSDP/FSDP2, Megatron-Core, DeepSpeed): FSDP, tensor, pipeline
#   and data parallelism.
# - XLA (MaxText / JAX on TPU, PyTorch-XLA): FSDP and tensor sharding inside a slice (ici_fsdp,
#   ici_tensor), data parallelism across slices over the data-centre network; no pipeline stages.
# - Neuron (NeuronX Distributed, neuronx-nemo-megatron on Trainium): tensor, pipeline and data parallelism
#   with the ZeRO-1 optimizer (master weights and moments sharded over data parallel); no FSDP. The
#   published Neuron runs are all of this kind (throughput_calibration.csv: TP/PP/DP degrees).
STACK_PLAN_SPACE: dict[str, PlanSpace] = {
    "cuda": PlanSpace("cuda"),
    "rocm": PlanSpace("rocm"),
    "synapse": PlanSpace("synapse"),
    "torch-cpu": PlanSpace("torch-cpu"),
    "xla": PlanSpace("xla", pipeline=False),
    "neuron": PlanSpace("neuron", fsdp=False, zero1=True),
}


def plan_space_of(stack: str) -> PlanSpace:
    """The plan space of a software stack (a stack the table does not name runs everything)."""
    return STACK_PLAN_SPACE.get(stack) or PlanSpace(stack)


# Size of the fast-interconnect domain (devices that reach each other over NVLink/ICI/NeuronLink rather
# than the data-centre network). TPU slices are ICI-connected across hosts up to the pod size
# (v4 4096 chips, v5e 256, v5p 8960, v6e 256; cloud.google.com/tpu docs); trn1 instances hold 16 chips on
# NeuronLink; GPUs use the node's NVLink/xGMI/RoCE-in-box (the node size).
FAST_DOMAIN_DEVICES = {
    "tpu-v4": 4096,
    "tpu-v5e": 256,
    "tpu-v5p": 8960,
    "tpu-v6e": 256,
    "trn1": 16,
    "trn2": 16,
}

# Memory the framework needs besides tensors (context, library workspaces, collective buffers), GiB, and
# the share of device memory kept free against fragmentation.
WORKSPACE_GIB = {
    "nvidia": 1.5,
    "amd": 1.5,
    "intel-gaudi": 1.5,
    "google-tpu": 0.5,
    "aws-trainium": 1.0,
    "cpu": 1.0,
}
HEADROOM_FRACTION = 0.05
# Cores of a host whose CPU "devices" a gang shares (the local pool: one device per core) that its ranks
# cannot count on: the control plane (API server, scheduler, worker fork server) and the OS run there too.
# Ranks beyond the rest time-share the cores: n ranks on c cores compute n / min(n, c - 1) times slower
# each than one rank alone (at least one core is always there).
HOST_RESERVED_CORES = 1.0


@dataclass(frozen=True)
class EfficiencyParams:
    """Achieved-efficiency parameters of one (family, stack, precision[, accelerator]).

    Matmul efficiency = ``mm_max / (1 + dim_knee/width + token_knee/tokens)`` where ``width`` is the
    per-device model width (d_model / tensor parallel) and ``tokens`` the tokens per micro-batch per device.
    """

    mm_max: float = 0.6
    dim_knee: float = 256.0
    token_knee: float = 128.0
    attn_ratio: float = 0.7  # attention kernels relative to dense matmuls
    layer_overhead_s: float = 1.0e-4  # fixed cost per block per micro-batch (launches, framework)
    mem_eff: float = 0.8  # achieved fraction of memory bandwidth for memory-bound kernels
    comm_eff: float = 0.7  # achieved fraction of link bandwidth for collectives
    overlap: float = 0.8  # share of overlappable communication hidden behind compute
    step_overhead_s: float = 0.0  # fixed cost per optimizer step (launches of the update, host work)
    # Ranks of a gang that share one host's cores (local CPU "devices", ``Topology.shared_host``): how
    # much slower each rank computes than its share of the host's free cores alone predicts (waiting on
    # the slowest rank at every collective when the cores are also busy with other work), and the fixed
    # cost of each collective of the gang (gloo over loopback: the ranks' rendezvous, beyond its bytes).
    # Fitted by ``fit.calibrate_from_profiles`` to a measured multi-rank step (``trainyard profile
    # --ranks``, the first-start measurement); the priors assume no extra slowdown and 1 ms.
    gang_slowdown: float = 1.0
    gang_sync_s: float = 1.0e-3
    moe_eff: float = 1.0  # routed-expert (grouped) matmuls relative to dense matmuls of the same shape
    moe_rows: int = 0  # MoE measurements ``moe_eff`` was fitted to (0: not fitted)
    moe_log_resid_p10: float = -0.35  # quantiles of log(measured / predicted) for MoE models
    moe_log_resid_p90: float = 0.35
    log_resid_p10: float = -0.2  # quantiles of log(measured / predicted) in calibration
    log_resid_p90: float = 0.2
    n_rows: int = 0
    key: str = "prior"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Generic priors per family when nothing was measured (from public MFU ranges: NVIDIA/AMD PyTorch ~40-55 %,
# TPU/XLA ~50-60 %, Trainium ~35-45 %, Gaudi ~40 %, CPU oneDNN ~50 % of vector peak on large GEMMs).
PRIORS: dict[str, EfficiencyParams] = {
    "nvidia": EfficiencyParams(mm_max=0.62, key="prior/nvidia"),
    "amd": EfficiencyParams(mm_max=0.45, layer_overhead_s=1.5e-4, key="prior/amd"),
    "google-tpu": EfficiencyParams(mm_max=0.62, layer_overhead_s=3e-5, key="prior/google-tpu"),
    "aws-trainium": EfficiencyParams(mm_max=0.45, layer_overhead_s=1e-4, key="prior/aws-trainium"),
    "intel-gaudi": EfficiencyParams(mm_max=0.45, layer_overhead_s=1.5e-4, key="prior/intel-gaudi"),
    # CPU: peaks are replaced by the profiled machine's measured matmul rate and copy bandwidth, so the caps
    # are relative to what this machine achieves on a 1024^3 GEMM and a large copy.
    "cpu": EfficiencyParams(
        mm_max=0.5,
        dim_knee=8.0,
        token_knee=8.0,
        attn_ratio=0.6,
        layer_overhead_s=5e-4,
        mem_eff=1.0,
        key="prior/cpu",
    ),
}
# Predictions from priors or another family carry wider bands.
PRIOR_LOG_BAND = 0.35


@dataclass(frozen=True)
class Measurement:
    """A measured step time fed back for calibration (from profiles or finished jobs)."""

    key: str  # family/stack/precision/accelerator
    predicted_step_time_s: float  # what the calibration predicted before this measurement
    measured_step_time_s: float
    label: str = ""


@dataclass(frozen=True)
class Calibration:
    """Fitted parameters by key, plus per-key multiplicative corrections learned from feedback."""

    params: dict[str, EfficiencyParams]
    corrections: dict[str, float] = field(default_factory=dict)  # key -> factor on step time
    measurements: tuple[Measurement, ...] = ()
    version: str = "uncalibrated"
    peaks_override: dict[str, dict[str, float]] = field(default_factory=dict)  # accelerator -> peaks/bw

    def lookup(
        self, family: str, stack: str, precision: str, accelerator: str
    ) -> tuple[EfficiencyParams, str]:
        """Parameters for a key, and a note when a fallback was used ("" for an exact match)."""
        group = f"{family}/{stack}/{precision}"
        acc_key = f"{group}/{accelerator}"
        if acc_key in self.params:
            return self.params[acc_key], ""
        if group in self.params:
            p = self.params[group]
            return p, f"{accelerator}: no measurements of its own; using {group} parameters"
        for other in ("bf16", "fp16", "fp32", "fp8"):
            alt = f"{family}/{stack}/{other}"
            if alt in self.params:
                p = self.params[alt]
                return (
                    replace(p, log_resid_p10=p.log_resid_p10 - 0.1, log_resid_p90=p.log_resid_p90 + 0.1),
                    f"{accelerator}: no {precision} measurements for {family}/{stack}; "
                    f"using {alt} parameters",
                )
        for key, p in self.params.items():
            if key.startswith(f"{family}/") and key.count("/") == 2:
                return (
                    replace(p, log_resid_p10=p.log_resid_p10 - 0.15, log_resid_p90=p.log_resid_p90 + 0.15),
                    f"{accelerator}: no {stack} measurements; using family parameters {key}",
                )
        prior = PRIORS.get(family, PRIORS["nvidia"])
        return (
            replace(prior, log_resid_p10=-PRIOR_LOG_BAND, log_resid_p90=PRIOR_LOG_BAND),
            f"{accelerator}: no measurements for family {family}; using generic {family} priors",
        )

    def correction(
        self, family: str, stack: str, precision: str, accelerator: str, devices: int = 1
    ) -> float:
        """The feedback factor on predicted step times of ``devices`` × ``accelerator``: the device
        count's own (``correction_key``: gangs whose ranks share a host are measured per count) when
        there is one, else the accelerator's."""
        key = f"{family}/{stack}/{precision}/{accelerator}"
        if devices > 1:
            own = self.corrections.get(correction_key(key, devices))
            if own is not None:
                return own
        return self.corrections.get(key, 1.0)

    # ---- serialisation ----------------------------------------------------------------------------
    def to_document(self) -> dict[str, Any]:
        return {
            "format": CALIBRATION_FORMAT,
            "version": self.version,
            "params": {k: v.to_dict() for k, v in sorted(self.params.items())},
            "corrections": dict(sorted(self.corrections.items())),
            "measurements": [asdict(m) for m in self.measurements],
            "peaks_override": self.peaks_override,
        }

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> Calibration:
        if doc.get("format") != CALIBRATION_FORMAT:
            raise ValueError(f"calibration format {doc.get('format')!r} is not {CALIBRATION_FORMAT}")
        return cls(
            params={k: EfficiencyParams(**v) for k, v in doc.get("params", {}).items()},
            corrections={k: float(v) for k, v in doc.get("corrections", {}).items()},
            measurements=tuple(Measurement(**m) for m in doc.get("measurements", [])),
            version=str(doc.get("version", "")),
            peaks_override={k: dict(v) for k, v in doc.get("peaks_override", {}).items()},
        )

    def with_params(self, updates: dict[str, EfficiencyParams], version: str | None = None) -> Calibration:
        merged = dict(self.params)
        merged.update(updates)
        return replace(self, params=merged, version=version or self.version)


def correction_key(key: str, devices: int) -> str:
    """The correction key of ``devices`` ranks of an accelerator key (``family/stack/precision/acc``):
    the key itself for one device, ``key/xN`` for N (used where the gang's ranks share one host, whose
    step times do not scale like one device's)."""
    return key if devices <= 1 else f"{key}/x{devices}"


@cache
def default_calibration() -> Calibration:
    """The packaged calibration (fitted to the published measurements)."""
    try:
        text = resources.files("trainyard.predict").joinpath("data/calibration.json").read_text("utf-8")
    except FileNotFoundError:
        return Calibration(params={}, version="priors-only")
    return Calibration.from_document(json.loads(text))


def stack_of(accelerator: Accelerator, stack: str | None = None) -> str:
    return stack or DEFAULT_STACK.get(accelerator.family, "cuda")
