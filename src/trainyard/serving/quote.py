"""The price of serving, from the predicted decode speed and the pool price (pure; no I/O).

Decoding one token reads every weight once, so a replica's single-stream decode speed is bounded by
memory bandwidth: ``tokens_per_s ≈ efficiency · mem_bw / weight_bytes`` (and by compute,
``peak_flops / (2 · params)``, which only binds for tiny models on slow chips). Dynamic batching
multiplies throughput by up to the batch size while the step stays memory-bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainyard.catalog.accelerators import Accelerator

BANDWIDTH_EFFICIENCY = 0.6  # achieved fraction of peak memory bandwidth in a decode step
COMPUTE_EFFICIENCY = 0.3


@dataclass(frozen=True)
class ServingQuote:
    pool: str
    accelerator: str
    weight_bytes: int
    predicted_tokens_per_s: float
    price_usd_per_hour: float
    usd_per_1k_tokens: float

    def doc(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "accelerator": self.accelerator,
            "weight_bytes": self.weight_bytes,
            "predicted_tokens_per_s": round(self.predicted_tokens_per_s, 3),
            "price_usd_per_hour": self.price_usd_per_hour,
            "usd_per_1k_tokens": self.usd_per_1k_tokens,
        }


def predicted_decode_tokens_per_s(accel: Accelerator, weight_bytes: int, *, batch: int = 1) -> float:
    params = weight_bytes / 4 if accel.name == "cpu" else weight_bytes / 2
    step_mem_s = weight_bytes / (accel.mem_bw_gbs * 1e9 * BANDWIDTH_EFFICIENCY)
    dtype = "fp32" if accel.name == "cpu" else "bf16"
    step_flop_s = 2 * params * batch / (accel.peak_flops(dtype) * COMPUTE_EFFICIENCY)
    return batch / max(step_mem_s, step_flop_s, 1e-9)


def serving_quote(
    pool: str, accel: Accelerator, weight_bytes: int, price_usd_per_hour: float, *, batch: int = 1
) -> ServingQuote:
    tps = predicted_decode_tokens_per_s(accel, max(1, weight_bytes), batch=batch)
    usd_per_1k = price_usd_per_hour / (tps * 3600.0) * 1000.0
    return ServingQuote(pool, accel.name, weight_bytes, tps, price_usd_per_hour, usd_per_1k)
