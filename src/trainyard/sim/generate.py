"""Synthetic workload traces: Poisson arrivals with model-size, gang-size, method and deadline mixes.

Each job's length is drawn as a target wall time on a reference allocation (``reference_accelerator`` ×
its gang) and turned into optimizer steps with the predictor, so a trace describes realistic hours of
work whatever the model size. Step counts are rounded to two significant digits and deadlines to whole
hours, as recurring jobs in a real queue are (and so that equal jobs share quotes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainyard.sim.spot import stream
from trainyard.sim.trace import TraceJob
from trainyard.spec.loader import spec_from_dict

# Llama-style decoder shapes by size in billions of parameters (n_layers, d_model, n_heads, n_kv_heads, d_ff).
MODEL_SHAPES: dict[str, tuple[int, int, int, int, int]] = {
    "0.35b": (24, 1024, 16, 16, 2816),
    "1.3b": (24, 2048, 16, 16, 5632),
    "7b": (32, 4096, 32, 32, 11008),
    "13b": (40, 5120, 40, 40, 13824),
    "70b": (80, 8192, 64, 8, 28672),
}


@dataclass(frozen=True)
class TraceMix:
    """What a generated trace looks like. Weights need not sum to one."""

    n_jobs: int = 100
    span_s: float = 2 * 86400.0  # arrivals spread over this window (Poisson, rate n_jobs / span_s)
    model_sizes: Mapping[str, float] = field(
        default_factory=lambda: {"0.35b": 0.25, "1.3b": 0.35, "7b": 0.3, "13b": 0.1}
    )
    gang_sizes: Mapping[int, float] = field(default_factory=lambda: {1: 0.45, 2: 0.2, 4: 0.2, 8: 0.15})
    lora_fraction: float = 0.4  # share of fine-tunes done with LoRA (the rest full)
    deadline_fraction: float = 0.3  # share of jobs with a deadline
    deadline_slack: tuple[float, float] = (2.0, 5.0)  # deadline = slack × reference wall time (uniform)
    job_hours: tuple[float, float] = (0.5, 12.0)  # reference wall time, log-uniform
    reference_accelerator: str = "a100-80gb"
    seq_lens: Mapping[int, float] = field(default_factory=lambda: {2048: 0.7, 4096: 0.3})
    tenants: Mapping[str, float] = field(
        default_factory=lambda: {"research": 0.5, "product": 0.3, "platform": 0.2}
    )
    time_minimize_fraction: float = 0.0  # share of jobs asking to minimise time rather than cost


def _pick(rng: Any, weights: Mapping[Any, float]) -> Any:
    items = list(weights.items())
    total = sum(w for _, w in items)
    x = rng.random() * total
    for k, w in items:
        x -= w
        if x <= 0:
            return k
    return items[-1][0]


def _round_sig(x: float, digits: int = 2) -> int:
    if x <= 0:
        return 1
    e = math.floor(math.log10(x)) - (digits - 1)
    return max(1, int(round(x / 10**e) * 10**e))


def _spec_doc(name: str, size: str, method: str, seq_len: int, gang: int, steps: int) -> dict[str, Any]:
    layers, d, heads, kv, dff = MODEL_SHAPES[size]
    return {
        "apiVersion": "trainyard/v1",
        "kind": "TrainingJob",
        "name": name,
        "model": {
            "architecture": "decoder",
            "n_layers": layers,
            "d_model": d,
            "n_heads": heads,
            "n_kv_heads": kv,
            "d_ff": dff,
            "ffn": "gated",
            "vocab_size": 32000,
        },
        "workload": {
            "method": method,
            "precision": "bf16-mixed",
            "optimizer": "adamw",
            "seq_len": seq_len,
            "global_batch": max(8, 16 * gang),
            "steps": steps,
        },
        "resources": {"min_devices": gang, "max_devices": gang},
    }


def generate_trace(mix: TraceMix, seed: int = 0) -> list[TraceJob]:
    """A reproducible trace for ``mix`` and ``seed``."""
    from trainyard.catalog.accelerators import get_accelerator
    from trainyard.predict import predict

    if mix.n_jobs < 1:
        raise ValueError("n_jobs must be at least 1")
    unknown = sorted(set(mix.model_sizes) - set(MODEL_SHAPES))
    if unknown:
        raise ValueError(f"unknown model size {unknown[0]!r}; sizes: {', '.join(MODEL_SHAPES)}")
    ref = get_accelerator(mix.reference_accelerator)
    rng = stream(seed, "trace")
    rate_per_s = mix.n_jobs / mix.span_s
    t = 0.0
    step_time_cache: dict[tuple[str, str, int, int], tuple[float, int]] = {}
    out: list[TraceJob] = []
    lo_h, hi_h = mix.job_hours
    for i in range(mix.n_jobs):
        t += rng.expovariate(rate_per_s)
        size = _pick(rng, mix.model_sizes)
        method = "lora" if rng.random() < mix.lora_fraction else "full"
        seq_len = int(_pick(rng, mix.seq_lens))
        gang = int(_pick(rng, mix.gang_sizes))
        tenant = str(_pick(rng, mix.tenants))
        hours = math.exp(rng.uniform(math.log(lo_h), math.log(hi_h)))
        with_deadline = rng.random() < mix.deadline_fraction
        slack = rng.uniform(*mix.deadline_slack)
        minimize_time = rng.random() < mix.time_minimize_fraction
        key = (size, method, seq_len, gang)
        if key not in step_time_cache:
            g = gang
            while True:  # grow the gang until the model fits on the reference accelerator
                spec = spec_from_dict(_spec_doc("probe", size, method, seq_len, g, 1))
                pred = predict(spec, ref, g)
                if pred.fits or g >= 64:
                    break
                g *= 2
            step_time_cache[key] = (pred.step_time_s, g)
        step_s, gang_fit = step_time_cache[key]
        steps = _round_sig(hours * 3600.0 / step_s)
        name = f"{size.replace('.', 'p')}-{method}-{i:05d}"
        doc = _spec_doc(name, size, method, seq_len, gang_fit, steps)
        doc["tags"] = {"size": size, "method": method}
        objective: dict[str, Any] = {}
        if with_deadline:
            ref_h = steps * step_s / 3600.0
            objective["deadline"] = f"{max(1, math.ceil(slack * ref_h + 0.5))}h"
        if minimize_time:
            objective["minimize"] = "time"
        if objective:
            doc["objective"] = objective
        out.append(
            TraceJob(job_id=f"job-{i:05d}", submit_s=round(t, 3), tenant=tenant, spec=spec_from_dict(doc))
        )
    return out
