"""Scheduler benchmark: one round of N queued jobs × 100 pools.

Measures candidate generation (cold and warm cache), the round's wall time and solver time at the default
time limit, and the objective against the same model solved with a long limit (optimality gap).

What the numbers include, as a control plane sees them (it imports the scheduler at start-up):

* ``import_s``: importing the scheduler (with SciPy and OR-Tools) at the top of this script, once per
  process, before any round;
* ``round_cold_cache_s``: the first round with an empty ``CandidateCache`` (every option priced, every
  prediction computed, the LP and the explanations); in the first row it is also the process's first round,
  so any first-call cost left inside a round is in it (``first_round_in_process``);
* ``round_cold_again_*``: ``--cold-repeats`` more rounds, each with a new empty cache (min and median);
* ``round_warm_cache_s``: the next round with the first round's cache (the service's loop between changes).

    .venv/bin/python benchmarks/bench_scheduler.py                 # 100 / 1,000 / 5,000 jobs
    .venv/bin/python benchmarks/bench_scheduler.py --jobs 1000 --optimal-limit-s 60

Writes benchmarks/results/scheduler.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

_IMPORT_T0, _IMPORT_C0 = time.perf_counter(), time.process_time()
from trainyard.catalog.pools import Pool  # noqa: E402
from trainyard.schedule import (  # noqa: E402
    CandidateCache,
    QueuedJob,
    SchedulerConfig,
    TenantQuota,
    schedule_round,
)
from trainyard.spec import spec_from_dict  # noqa: E402

IMPORT_S, IMPORT_CPU_S = time.perf_counter() - _IMPORT_T0, time.process_time() - _IMPORT_C0
_ROUNDS_RUN = 0  # rounds this process has run (the first pays any first-call cost left in a round)

ACCELERATORS = [
    ("a100-40gb", 8, 1.6),
    ("a100-80gb", 8, 2.2),
    ("h100", 8, 4.0),
    ("h200", 8, 5.0),
    ("l4", 8, 0.8),
    ("a10g", 4, 1.0),
    ("t4", 4, 0.45),
    ("tpu-v4", 4, 3.2),
    ("tpu-v5e", 8, 1.2),
    ("trn1", 16, 1.3),
    ("mi300x", 8, 3.5),
]
MARKET_FACTOR = {"on_demand": 1.0, "spot": 0.35, "reserved": 0.65}
REGIONS = ["us-east-1", "us-west-2", "eu-west-1", "us-central1", "europe-west4"]

# Distinct job shapes (queues repeat a few templates many times: fine-tunes of the same base models).
SHAPES = [
    # n_layers, d_model, n_heads, vocab, seq_len, global_batch, steps, method
    (12, 768, 12, 50257, 1024, 32, 2000, "full"),
    (16, 2048, 16, 32000, 2048, 8, 20000, "full"),
    (24, 2048, 16, 32000, 2048, 16, 5000, "full"),
    (32, 4096, 32, 32000, 2048, 32, 1000, "lora"),
    (32, 4096, 32, 32000, 4096, 64, 3000, "full"),
    (40, 5120, 40, 32000, 2048, 64, 2000, "full"),
    (28, 3072, 24, 50000, 1024, 16, 8000, "full"),
    (22, 2048, 32, 32000, 2048, 32, 4000, "lora"),
]


def make_pools(n: int, rng: random.Random) -> list[Pool]:
    pools = []
    for i in range(n):
        acc, per_node, price = ACCELERATORS[i % len(ACCELERATORS)]
        market = ["on_demand", "spot", "reserved"][(i // len(ACCELERATORS)) % 3]
        nodes = rng.choice([2, 4, 8, 16, 32])
        total = nodes * per_node
        available = rng.choice([0, total // 4, total // 2, total]) if market != "reserved" else total // 2
        pools.append(
            Pool(
                name=f"{acc}-{market}-{i}",
                accelerator=acc,
                devices_per_node=per_node,
                nodes=nodes,
                available_devices=available,
                market=market,
                price_usd_per_device_hour=round(price * MARKET_FACTOR[market] * rng.uniform(0.85, 1.25), 4),
                region=REGIONS[i % len(REGIONS)],
                cloud="bench",
                interruption_rate_per_hour=0.08 if market == "spot" else None,
            )
        )
    return pools


def make_jobs(n: int, rng: random.Random) -> list[QueuedJob]:
    specs = []
    for k, (layers, d, heads, vocab, seq, batch, steps, method) in enumerate(SHAPES):
        for variant in range(3):
            lo = [1, 2, 8][variant]
            doc: dict[str, Any] = {
                "name": f"shape{k}-v{variant}",
                "model": {"n_layers": layers, "d_model": d, "n_heads": heads, "vocab_size": vocab},
                "workload": {"seq_len": seq, "global_batch": batch, "steps": steps, "method": method},
                "resources": {"min_devices": lo, "max_devices": lo * 4},
            }
            if variant == 1:
                doc["objective"] = {"deadline": "48h"}
            if variant == 2:
                doc["objective"] = {"markets": ["on_demand", "reserved"]}
            specs.append(spec_from_dict(doc))
    jobs = []
    for i in range(n):
        s = specs[rng.randrange(len(specs))]
        jobs.append(
            QueuedJob(
                job_id=f"job-{i:05d}",
                tenant=f"tenant-{rng.randrange(10)}",
                spec=s,
                submit_s=-rng.uniform(0, 4 * 3600),
                priority=rng.choice([0, 0, 0, 1, 2]),
            )
        )
    return jobs


def _timed_round(
    jobs: list[QueuedJob], pools: list[Pool], cfg: SchedulerConfig, cache: CandidateCache
) -> tuple[Any, float, float]:
    global _ROUNDS_RUN
    t0, c0 = time.perf_counter(), time.process_time()
    result = schedule_round(jobs, pools, now_s=0.0, config=cfg, cache=cache)
    wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    _ROUNDS_RUN += 1
    return result, wall_s, cpu_s


def bench(
    n_jobs: int,
    n_pools: int,
    limit_s: float,
    optimal_limit_s: float | None,
    seed: int,
    cold_repeats: int = 3,
) -> dict[str, Any]:
    rng = random.Random(seed)
    pools = make_pools(n_pools, rng)
    jobs = make_jobs(n_jobs, rng)
    quotas = {f"tenant-{t}": TenantQuota(max_devices=256, max_jobs=max(5, n_jobs // 15)) for t in range(10)}
    cfg = SchedulerConfig(time_limit_s=limit_s, quotas=quotas)
    cache = CandidateCache()
    first = _ROUNDS_RUN == 0
    cold, cold_s, cold_cpu = _timed_round(jobs, pools, cfg, cache)
    warm, warm_s, warm_cpu = _timed_round(jobs, pools, cfg, cache)
    again = [_timed_round(jobs, pools, cfg, CandidateCache()) for _ in range(cold_repeats)]
    row: dict[str, Any] = {
        "jobs": n_jobs,
        "pools": n_pools,
        "distinct_specs": len({j.spec.name for j in jobs}),
        "first_round_in_process": first,
        "round_cold_cache_s": round(cold_s, 3),
        "round_cold_cache_cpu_s": round(cold_cpu, 3),
        "round_warm_cache_s": round(warm_s, 3),
        "round_warm_cache_cpu_s": round(warm_cpu, 3),
        "cp_sat_wall_s": round(warm.solve_time_s, 3),
        "status": warm.solver_status,
        "placed": len(warm.placements),
        "unplaced": len(warm.unplaced),
        "objective_usd": round(warm.objective_usd, 2),
        "greedy_objective_usd": round(warm.greedy_objective_usd, 2),
        "lower_bound_usd": None if warm.lower_bound_usd is None else round(warm.lower_bound_usd, 2),
        "gap_to_bound_pct": None
        if warm.lower_bound_usd is None
        else round(100.0 * (warm.objective_usd - warm.lower_bound_usd) / max(warm.lower_bound_usd, 1e-9), 3),
        "deterministic": all(
            [p.to_contract() for p in r.placements] == [p.to_contract() for p in warm.placements]
            for r in (cold, *(a[0] for a in again))
        ),
    }
    if again:
        walls, cpus = sorted(a[1] for a in again), sorted(a[2] for a in again)
        row["round_cold_again_min_s"] = round(walls[0], 3)
        row["round_cold_again_median_s"] = round(walls[len(walls) // 2], 3)
        row["round_cold_again_min_cpu_s"] = round(cpus[0], 3)
        row["round_cold_again_median_cpu_s"] = round(cpus[len(cpus) // 2], 3)
    if optimal_limit_s:
        # the same model, CP-SAT always searching, with a long limit
        long_cfg = replace(cfg, skip_search_gap=0.0, wall_limit_factor=1.0)
        t0 = time.perf_counter()
        best = schedule_round(
            jobs, pools, now_s=0.0, config=long_cfg, cache=cache, time_limit_s=optimal_limit_s
        )
        row["long_solve_s"] = round(time.perf_counter() - t0, 2)
        row["long_status"] = best.solver_status
        row["long_objective_usd"] = round(best.objective_usd, 2)
        row["long_lower_bound_usd"] = None if best.lower_bound_usd is None else round(best.lower_bound_usd, 2)
        row["gap_pct"] = round(
            100.0 * (warm.objective_usd - best.objective_usd) / max(best.objective_usd, 1e-9), 3
        )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, nargs="*", default=[100, 1000, 5000])
    ap.add_argument("--pools", type=int, default=100)
    ap.add_argument("--time-limit-s", type=float, default=SchedulerConfig().time_limit_s)
    ap.add_argument("--optimal-limit-s", type=float, default=60.0, help="long limit for the reference solve")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--cold-repeats", type=int, default=3, help="more rounds with a new empty cache each")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "scheduler.json")
    args = ap.parse_args()
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    rows = [
        bench(n, args.pools, args.time_limit_s, args.optimal_limit_s, args.seed, args.cold_repeats)
        for n in args.jobs
    ]
    cols = [
        "jobs", "pools", "round_cold_cache_s", "round_cold_cache_cpu_s", "round_cold_again_median_s",
        "round_warm_cache_s", "round_warm_cache_cpu_s", "status", "placed", "unplaced", "objective_usd",
        "gap_to_bound_pct", "long_objective_usd", "long_status", "gap_pct",
    ]  # fmt: skip
    print(f"import_s {IMPORT_S:.3f} (cpu {IMPORT_CPU_S:.3f})")
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r.get(c, "")) for c in cols))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    doc = {
        "machine": f"{platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}",
        "load_average_1m_at_start": load_start,
        "load_average_1m_at_end": load,
        "import_s": round(IMPORT_S, 3),
        "import_cpu_s": round(IMPORT_CPU_S, 3),
        "command": "python benchmarks/bench_scheduler.py " + " ".join(sys.argv[1:]),
        "rows": rows,
    }
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
