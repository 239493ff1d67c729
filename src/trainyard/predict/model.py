"""Predictor interface and a first analytic model.

``predict(spec, accelerator, devices)`` is the one entry point the cost model, the scheduler and the CLI
use. This first version is a constant-efficiency roofline (training FLOPs over peak x efficiency) with a
memory-fit check; the calibrated, plan-aware model replaces the internals behind the same interface.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from trainyard.catalog.accelerators import Accelerator
from trainyard.spec.models import JobSpec, Method, Optimizer, Precision

GIB = 1024**3


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
    source: str = "analytic"  # "analytic", "calibrated", "family-fallback", "measured"
    notes: list[str] = field(default_factory=list)

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


def _compute_dtype(spec: JobSpec) -> str:
    return {
        Precision.FP32: "fp32",
        Precision.BF16_MIXED: "bf16",
        Precision.FP16_MIXED: "fp16",
        Precision.FP8_MIXED: "fp8",
    }[spec.workload.precision]


def training_flops_per_step(spec: JobSpec) -> float:
    """6·N_active per token (2 forward + 4 backward), LoRA ≈ 4·N, plus causal attention."""
    n_active = spec.model.active_params
    per_token = (4.0 if spec.workload.method == Method.LORA else 6.0) * n_active
    if not spec.model.is_custom:
        assert spec.model.n_blocks and spec.model.d_model
        per_token += 6.0 * spec.model.n_blocks * spec.model.d_model * spec.workload.seq_len
    return per_token * spec.tokens_per_step


def _state_bytes_per_param(spec: JobSpec) -> tuple[float, float]:
    """(bytes for every weight, extra bytes per trainable weight: grads + master + optimizer)."""
    p = spec.workload.precision
    weight = 4.0 if p == Precision.FP32 else 2.0
    grad = weight
    master = 0.0 if p == Precision.FP32 else 4.0
    opt = {Optimizer.ADAMW: 8.0, Optimizer.SGD: 4.0, Optimizer.ADAFACTOR: 0.1}[spec.workload.optimizer]
    return weight, grad + master + opt


def predict(spec: JobSpec, accelerator: Accelerator, devices: int) -> Prediction:
    if devices < 1:
        raise ValueError("devices must be >= 1")
    dtype = _compute_dtype(spec)
    peak = accelerator.peak_flops(dtype)
    efficiency = 0.40
    flops = training_flops_per_step(spec)
    step_time_s = flops / (peak * efficiency * devices)
    weight_b, trainable_b = _state_bytes_per_param(spec)
    state_bytes = spec.params * weight_b + spec.trainable_params * trainable_b
    per_device_state = state_bytes / devices  # fully sharded
    act_bytes = 0.0
    if not spec.model.is_custom:
        assert spec.model.d_model is not None
        micro = max(1, math.ceil(spec.workload.global_batch / devices))
        act_bytes = 2.0 * spec.model.n_blocks * spec.workload.seq_len * micro * spec.model.d_model * 2
    mem_gib = (per_device_state + act_bytes) / GIB + 1.0
    fits = mem_gib <= accelerator.memory_gib * 0.9
    min_fit = None
    reason = ""
    if not fits:
        need = math.ceil(state_bytes / GIB / max(accelerator.memory_gib * 0.9 - 1.0 - act_bytes / GIB, 1e-9))
        min_fit = max(need, devices + 1)
        reason = (
            f"needs {mem_gib:.1f} GiB per device on {devices} x {accelerator.name} "
            f"({accelerator.memory_gib:.0f} GiB each); at least {min_fit} devices fit"
        )
    tokens_per_s = spec.tokens_per_step / step_time_s
    return Prediction(
        accelerator=accelerator.name,
        devices=devices,
        step_time_s=step_time_s,
        tokens_per_s=tokens_per_s,
        mfu=efficiency,
        memory_per_device_gib=mem_gib,
        fits=fits,
        plan={"data": devices, "fsdp": devices > 1, "tensor": 1, "pipeline": 1, "micro_batch": None},
        reason=reason,
        step_time_p10_s=step_time_s * 0.8,
        step_time_p90_s=step_time_s * 1.25,
        compile_time_s=accelerator.first_compile_s,
        min_devices_to_fit=min_fit,
    )
