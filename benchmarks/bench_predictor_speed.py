"""Speed: one spec over the whole catalog (every accelerator x device counts 1, 2, 4, ..., 512).

    .venv/bin/python benchmarks/bench_predictor_speed.py [--spec examples/moe-finetune.yaml]
Writes benchmarks/results/predictor_speed.json (the dense seed example and the MoE example). Target:
<= 50 ms for the whole sweep. Wall and CPU (process) time are both recorded, with the 1-minute load.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from trainyard.catalog.accelerators import load_accelerators
from trainyard.predict import predict_many
from trainyard.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]


def sweep(path: Path) -> dict[str, Any]:
    spec = load_spec(path)
    spec = spec.model_copy(update={"measured": type(spec.measured)()})
    accs = list(load_accelerators().values())
    counts = [2**k for k in range(10)]
    predict_many(spec, accs, counts)  # warm caches (plan enumeration per topology)
    runs, cpu = [], []
    for _ in range(7):
        t0, c0 = time.perf_counter(), time.process_time()
        preds = predict_many(spec, accs, counts)
        runs.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    cold_t0 = time.perf_counter()
    from trainyard.predict import engine

    engine.enumerate_candidates.cache_clear()
    predict_many(spec, accs, counts)
    cold = time.perf_counter() - cold_t0
    med = statistics.median(runs)
    med_cpu = statistics.median(cpu)
    print(f"{path.name}: {len(preds)} predictions ({len(accs)} accelerators x {len(counts)} device counts)")
    print(
        f"  median {med * 1000:.1f} ms wall, {med_cpu * 1000:.1f} ms CPU (min {min(runs) * 1000:.1f}), "
        f"cold plan cache {cold * 1000:.1f} ms, {med / len(preds) * 1e6:.0f} us per prediction; "
        f"fits {sum(p.fits for p in preds)}"
    )
    return {
        "spec": str(path.relative_to(ROOT)),
        "predictions": len(preds),
        "median_ms": med * 1000,
        "median_cpu_ms": med_cpu * 1000,
        "min_ms": min(runs) * 1000,
        "cold_cache_ms": cold * 1000,
    }


def main() -> None:
    load_1m = os.getloadavg()[0]
    dense = sweep(ROOT / "examples/seed-example.yaml")
    moe = sweep(ROOT / "examples/moe-finetune.yaml")
    print(f"load average (1 min) {load_1m:.2f}")
    out = ROOT / "benchmarks/results/predictor_speed.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {**dense, "moe": moe, "target_ms": 50, "load_avg_1m": load_1m},
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
