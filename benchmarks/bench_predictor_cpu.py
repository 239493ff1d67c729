"""Local CPU: profile two small configurations, then predict unseen batch sizes and depths.

    .venv/bin/python benchmarks/bench_predictor_cpu.py

Profiles two configurations with the real profiler (one torch thread, median of timed steps), fits the
`cpu` parameters to them exactly as `trainyard profile` + `trainyard predict` do (calibrate_from_profiles),
then profiles configurations with other global batch sizes and depths that the fit never saw and compares
the predicted step time with the measured one. Writes benchmarks/results/predictor_cpu.json.
Target: every unseen configuration within 10 %.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from trainyard.catalog.accelerators import get_accelerator
from trainyard.predict import predict
from trainyard.predict.fit import calibrate_from_profiles
from trainyard.runtime.profiler import ProfileSession, measure_device
from trainyard.spec.models import JobSpec

ROOT = Path(__file__).resolve().parents[1]
STEPS, WARMUP = 15, 2
# This machine's two cores are shared: time steps by this process's CPU time (one thread), i.e. the step
# time the machine gives when nobody else is using the core.
CLOCK = "process"
# Median of the interleaved steps (the minimum proved erratic under heavy load: single outliers).
STATISTIC = "median"


def spec(layers: int, batch: int, d_model: int = 128, seq: int = 128) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": f"cpu-l{layers}-b{batch}",
            "model": {
                "n_layers": layers,
                "d_model": d_model,
                "n_heads": 4,
                "n_kv_heads": 2,
                "ffn": "gated",
                "vocab_size": 1024,
            },
            "workload": {
                "precision": "fp32",
                "seq_len": seq,
                "global_batch": batch,
                "micro_batch": batch,
                "activation_checkpointing": "none",
                "steps": 10,
            },
        }
    )


TRAIN = [spec(2, 4), spec(4, 8)]
UNSEEN = [spec(2, 16), spec(4, 2), spec(6, 8), spec(8, 4), spec(3, 12)]


def measure(specs: list[JobSpec], rounds: int) -> list[dict]:
    """Profile several configurations with their steps interleaved round-robin (one torch thread)."""
    sessions = [ProfileSession(s, device="cpu", threads=1, clock=CLOCK) for s in specs]
    for _ in range(WARMUP):
        for sess in sessions:
            sess.step()
    times: list[list[float]] = [[] for _ in sessions]
    for _ in range(rounds):
        for k, sess in enumerate(sessions):
            times[k].append(sess.step())
    return [sess.document(t, statistic=STATISTIC) for sess, t in zip(sessions, times, strict=True)]


def main() -> None:
    torch.set_num_threads(1)
    device = measure_device(torch.device("cpu"), repeats=9, clock=CLOCK)
    t0 = time.perf_counter()
    docs = measure(TRAIN + UNSEEN, STEPS)
    train_profiles = docs[: len(TRAIN)]
    for doc in train_profiles:
        doc["device"] = device
    cal = calibrate_from_profiles(train_profiles)
    acc = get_accelerator("cpu")
    rows = []
    for k, doc in enumerate(docs):
        s = JobSpec.model_validate(doc["spec"])
        p = predict(s, acc, 1, calibration=cal)
        rows.append(("profiled" if k < len(TRAIN) else "unseen", s.name, doc["step_time_s"], p.step_time_s))
    elapsed = time.perf_counter() - t0
    print(
        f"device: matmul {device['matmul_flops'] / 1e9:.1f} GFLOP/s, "
        f"copy {device['mem_bw_bytes_s'] / 1e9:.1f} GB/s (1 thread); {elapsed:.0f} s"
    )
    print(f"{'set':9} {'config':12} {'measured_ms':>12} {'predicted_ms':>13} {'error':>8}")
    for kind, name, m, p in rows:
        print(f"{kind:9} {name:12} {m * 1000:12.1f} {p * 1000:13.1f} {p / m - 1:+8.1%}")
    unseen = [abs(p / m - 1) for k, _, m, p in rows if k == "unseen"]
    print(f"unseen: max error {max(unseen):.1%}, median {statistics.median(unseen):.1%}")
    params = {k: v.to_dict() for k, v in cal.params.items()}
    out = ROOT / "benchmarks/results/predictor_cpu.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "device": device,
                "threads": 1,
                "clock": CLOCK,
                "statistic": STATISTIC,
                "step_times_s": {d["name"]: d["step_times_s"] for d in docs},
                "steps": STEPS,
                "params": params,
                "rows": [
                    {
                        "set": k,
                        "config": n,
                        "measured_step_time_s": m,
                        "predicted_step_time_s": p,
                        "error": p / m - 1,
                    }
                    for k, n, m, p in rows
                ],
                "unseen_max_error": max(unseen),
                "unseen_median_error": statistics.median(unseen),
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
