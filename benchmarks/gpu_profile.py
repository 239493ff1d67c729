"""Profile 3-4 configurations on a CUDA GPU and compare measured step times with the predictor.

    .venv/bin/python benchmarks/gpu_profile.py --accelerator h100        # on a GPU machine
    .venv/bin/python benchmarks/gpu_profile.py --cpu-test                # tiny models on CPU (smoke test)
Writes benchmarks/results/gpu_profile.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from trainyard.catalog.accelerators import get_accelerator
from trainyard.predict import predict
from trainyard.runtime.profiler import profile_spec
from trainyard.spec.models import JobSpec

ROOT = Path(__file__).resolve().parents[1]
GPU_CONFIGS = [
    dict(n_layers=12, d_model=768, n_heads=12, seq=1024, batch=16),
    dict(n_layers=24, d_model=1024, n_heads=16, seq=2048, batch=8),
    dict(n_layers=16, d_model=2048, n_heads=16, seq=2048, batch=8),
    dict(n_layers=24, d_model=2048, n_heads=16, seq=4096, batch=4),
]
CPU_CONFIGS = [
    dict(n_layers=2, d_model=64, n_heads=4, seq=32, batch=2),
    dict(n_layers=3, d_model=64, n_heads=4, seq=32, batch=4),
]


def spec_for(c: dict, precision: str) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": f"gpu-l{c['n_layers']}-d{c['d_model']}",
            "model": {
                "n_layers": c["n_layers"],
                "d_model": c["d_model"],
                "n_heads": c["n_heads"],
                "ffn": "gated",
                "vocab_size": 32000 if precision != "fp32" else 512,
            },
            "workload": {
                "precision": precision,
                "seq_len": c["seq"],
                "global_batch": c["batch"],
                "micro_batch": c["batch"],
                "activation_checkpointing": "none",
                "steps": 10,
            },
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--accelerator", default="h100", help="catalog name of the GPU the script runs on")
    ap.add_argument("--cpu-test", action="store_true", help="tiny models on CPU to test the script")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    device, precision, configs = (
        ("cpu", "fp32", CPU_CONFIGS) if args.cpu_test else ("cuda", "bf16-mixed", GPU_CONFIGS)
    )
    acc = get_accelerator("cpu" if args.cpu_test else args.accelerator)
    rows = []
    for c in configs:
        spec = spec_for(c, precision)
        prof = profile_spec(
            spec,
            steps=2 if args.cpu_test else args.steps,
            warmup=1 if args.cpu_test else 3,
            device=device,
            threads=1 if args.cpu_test else None,
            measure=False,
        )
        pred = predict(spec, acc, 1, plan={"micro_batch": c["batch"], "activation_checkpointing": "none"})
        err = pred.step_time_s / prof["step_time_s"] - 1
        rows.append(
            {
                "config": c,
                "measured_step_time_s": prof["step_time_s"],
                "predicted_step_time_s": pred.step_time_s,
                "error": err,
                "peak_memory_gib": prof["peak_memory_gib"],
                "predicted_memory_gib": pred.memory_per_device_gib,
                "fits": pred.fits,
            }
        )
        print(
            f"{spec.name:16} measured {prof['step_time_s'] * 1000:9.1f} ms  "
            f"predicted {pred.step_time_s * 1000:9.1f} ms ({err:+.1%})  "
            f"memory {prof['peak_memory_gib']:.2f} GiB (predicted {pred.memory_per_device_gib:.2f})"
        )
    out = ROOT / "benchmarks/results" / ("gpu_profile_cpu_test.json" if args.cpu_test else "gpu_profile.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"accelerator": acc.name, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
