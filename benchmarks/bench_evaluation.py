"""Evaluation numbers (issue 15): the cost of the paired statistics and evaluation throughput.

1. Paired statistics on N examples (default 10,000): two metrics (per-example loss with a BCa
   bootstrap CI and a sign-flip permutation test; exact match with a BCa CI and McNemar's exact test),
   Holm correction, verdict; median wall time of several repeats.
2. Evaluation throughput: examples per second of the built-in evaluator (per-example loss and greedy
   generation for exact match) on a tiny random Llama on CPU, model and baseline both scored.

Usage:  python benchmarks/bench_evaluation.py [--n 10000] [--repeats 5] [--examples 200]
Writes: benchmarks/results/bench_evaluation.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bench_evaluation.json"


def bench_statistics(n: int, repeats: int) -> dict[str, Any]:
    from trainyard.evaluation.stats import MetricInput, compare

    rng = np.random.default_rng(0)
    base = rng.gamma(2.0, 1.0, size=n)
    model = base - 0.02 + rng.normal(0, 0.5, size=n)
    em_b = (rng.random(n) < 0.5).astype(float)
    em_m = np.where(rng.random(n) < 0.1, 1 - em_b, em_b)
    times = []
    cpu = []
    verdict = ""
    for r in range(repeats):
        t0 = time.perf_counter()
        c0 = time.process_time()
        c = compare(
            {
                "loss": MetricInput(model, base, higher_is_better=False),
                "exact_match": MetricInput(em_m, em_b, binary=True),
            },
            seed=r,
        )
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        verdict = c.verdict
    return {
        "n": n,
        "metrics": 2,
        "repeats": repeats,
        "median_s": statistics.median(times),
        "max_s": max(times),
        "median_cpu_s": statistics.median(cpu),
        "verdict": verdict,
    }


def bench_throughput(examples: int) -> dict[str, Any] | None:
    try:
        from trainyard.evaluation.evaluator import evaluate_pair
    except ImportError:
        return None
    sys.path.insert(0, str(ROOT))
    from tests.hf_models import build_tiny_llama, completion_rows

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_llama(Path(tmp) / "m", seed=1)
        base_dir = build_tiny_llama(Path(tmp) / "b", seed=2)
        rows = completion_rows(examples, seed=0)
        t0 = time.perf_counter()
        c0 = time.process_time()
        res = evaluate_pair(model_dir, base_dir, rows, fmt="completion", max_new_tokens=8)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
    return {
        "examples": examples,
        "wall_s": wall,
        "examples_per_s": examples / wall,
        "cpu_s": cpu,
        "examples_per_cpu_s": examples / cpu,
        "model_latency_s_per_token": res["model"]["latency_s_per_token"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--examples", type=int, default=200)
    args = ap.parse_args()
    load_start = os.getloadavg()[0]
    stats_doc = bench_statistics(args.n, args.repeats)
    thr = bench_throughput(args.examples)
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}",
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
        "statistics": stats_doc,
        "throughput": thr,
    }
    print(f"{'measure':44s} {'value':>12s}")
    print(f"{'paired statistics, n=' + str(args.n) + ', median s':44s} {stats_doc['median_s']:12.3f}")
    print(f"{'paired statistics, max s':44s} {stats_doc['max_s']:12.3f}")
    print(f"{'paired statistics, median CPU s':44s} {stats_doc['median_cpu_s']:12.3f}")
    if thr is not None:
        print(f"{'evaluation throughput, examples/s (wall)':44s} {thr['examples_per_s']:12.1f}")
        print(f"{'evaluation throughput, examples per CPU s':44s} {thr['examples_per_cpu_s']:12.1f}")
    print(f"load {load_start:.2f} -> {doc['load_end']:.2f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
