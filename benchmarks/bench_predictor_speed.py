"""Speed: one spec over the whole catalog (every accelerator x device counts 1, 2, 4, ..., 512).

    .venv/bin/python benchmarks/bench_predictor_speed.py
Writes benchmarks/results/predictor_speed.json. Target: <= 50 ms for the whole sweep.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from trainyard.catalog.accelerators import load_accelerators
from trainyard.predict import predict_many
from trainyard.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    spec = load_spec(ROOT / "examples/seed-example.yaml")
    spec = spec.model_copy(update={"measured": type(spec.measured)()})
    accs = list(load_accelerators().values())
    counts = [2**k for k in range(10)]
    predict_many(spec, accs, counts)  # warm caches (plan enumeration per topology)
    runs = []
    for _ in range(7):
        t0 = time.perf_counter()
        preds = predict_many(spec, accs, counts)
        runs.append(time.perf_counter() - t0)
    cold_t0 = time.perf_counter()
    from trainyard.predict import engine

    engine.enumerate_candidates.cache_clear()
    predict_many(spec, accs, counts)
    cold = time.perf_counter() - cold_t0
    med = statistics.median(runs)
    print(f"{len(preds)} predictions ({len(accs)} accelerators x {len(counts)} device counts)")
    print(
        f"median {med * 1000:.1f} ms (min {min(runs) * 1000:.1f}), cold plan cache {cold * 1000:.1f} ms, "
        f"{med / len(preds) * 1e6:.0f} us per prediction; fits {sum(p.fits for p in preds)}"
    )
    out = ROOT / "benchmarks/results/predictor_speed.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "predictions": len(preds),
                "median_ms": med * 1000,
                "min_ms": min(runs) * 1000,
                "cold_cache_ms": cold * 1000,
                "target_ms": 50,
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
