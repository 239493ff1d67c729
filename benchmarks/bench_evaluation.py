"""Evaluation numbers (issue 15): the cost of the paired statistics and evaluation throughput.

1. Paired statistics on N examples (default 10,000): two metrics (per-example loss with a BCa
   bootstrap CI and a sign-flip permutation test; exact match with a BCa CI and McNemar's exact test),
   Holm correction, verdict; median wall time of several repeats.
2. Evaluation throughput: examples per second of the built-in evaluator (per-example loss and greedy
   generation for exact match) on a tiny random Llama on CPU, model and baseline both scored.
3. Batching: one model scoring the same rows one at a time and in batches, side by side in one run
   (the batch sizes alternate within each repeat, so load drifts hit both alike); wall and CPU time,
   the speed-up of each batch size over batch size 1, and whether the scores agree.

Usage:  python benchmarks/bench_evaluation.py [--n 10000] [--repeats 5] [--examples 200]
                                              [--batch-sizes 1,8,32] [--batch-examples 200]
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


def bench_batching(examples: int, sizes: list[int], repeats: int) -> dict[str, Any] | None:
    try:
        from trainyard.evaluation.evaluator import score_model
    except ImportError:
        return None
    sys.path.insert(0, str(ROOT))
    from tests.hf_models import build_tiny_llama, completion_rows

    wall: dict[int, list[float]] = {b: [] for b in sizes}
    cpu: dict[int, list[float]] = {b: [] for b in sizes}
    docs: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_llama(Path(tmp) / "m", seed=1)
        rows = completion_rows(examples, seed=0)
        score_model(model_dir, rows[:8], "completion", max_new_tokens=8, batch_size=8)  # warm caches
        for r in range(repeats):
            for b in sizes if r % 2 == 0 else list(reversed(sizes)):
                t0 = time.perf_counter()
                c0 = time.process_time()
                docs[b] = score_model(model_dir, rows, "completion", max_new_tokens=8, batch_size=b)
                wall[b].append(time.perf_counter() - t0)
                cpu[b].append(time.process_time() - c0)
    ref = docs[sizes[0]]
    out: dict[str, Any] = {"examples": examples, "repeats": repeats, "max_new_tokens": 8, "sizes": {}}
    for b in sizes:
        w, c = statistics.median(wall[b]), statistics.median(cpu[b])
        out["sizes"][str(b)] = {
            "median_wall_s": w,
            "median_cpu_s": c,
            "examples_per_s": examples / w,
            "speedup_wall": statistics.median(wall[sizes[0]]) / w,
            "speedup_cpu": statistics.median(cpu[sizes[0]]) / c,
            "latency_s_per_token": docs[b]["latency_s_per_token"],
            "outputs_equal": docs[b]["outputs"] == ref["outputs"],
            "max_abs_loss_diff": max(abs(x - y) for x, y in zip(docs[b]["loss"], ref["loss"], strict=True)),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--batch-sizes", default="1,8,32", help="comma-separated; the first is the reference")
    ap.add_argument("--batch-examples", type=int, default=200)
    ap.add_argument("--only-batching", action="store_true", help="skip the statistics and throughput parts")
    args = ap.parse_args()
    load_start = os.getloadavg()[0]
    sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
    stats_doc = None if args.only_batching else bench_statistics(args.n, args.repeats)
    thr = None if args.only_batching else bench_throughput(args.examples)
    batching = bench_batching(args.batch_examples, sizes, args.repeats)
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}",
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
        "statistics": stats_doc,
        "throughput": thr,
        "batching": batching,
    }
    print(f"{'measure':44s} {'value':>12s}")
    if stats_doc is not None:
        print(f"{'paired statistics, n=' + str(args.n) + ', median s':44s} {stats_doc['median_s']:12.3f}")
        print(f"{'paired statistics, max s':44s} {stats_doc['max_s']:12.3f}")
        print(f"{'paired statistics, median CPU s':44s} {stats_doc['median_cpu_s']:12.3f}")
    if thr is not None:
        print(f"{'evaluation throughput, examples/s (wall)':44s} {thr['examples_per_s']:12.1f}")
        print(f"{'evaluation throughput, examples per CPU s':44s} {thr['examples_per_cpu_s']:12.1f}")
    if batching is not None:
        for b, m in batching["sizes"].items():
            print(
                f"{'batch ' + b + ': examples/s, speed-up wall / CPU':44s} {m['examples_per_s']:12.1f} "
                f"{m['speedup_wall']:6.2f}x {m['speedup_cpu']:6.2f}x  outputs equal {m['outputs_equal']}, "
                f"max |loss diff| {m['max_abs_loss_diff']:.1e}"
            )
    print(f"load {load_start:.2f} -> {doc['load_end']:.2f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    if args.only_batching and RESULTS.is_file():  # keep the other parts of the last full run
        doc = {
            **json.loads(RESULTS.read_text()),
            "batching": batching,
            "batching_date": doc["date"],
            "batching_load": [load_start, doc["load_end"]],
        }
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
