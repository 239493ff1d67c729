"""Scheduler benchmark on a queue where every job has its own shape: 1,000 queued jobs × 100 pools.

``bench_scheduler.py``'s queue repeats 24 specs, so quotes and predictions are shared between jobs. Here
each job is a distinct ``architecture: custom`` model (0.05–20 B parameters) with measured step times on
5–10 of the pools' accelerators, a gang range inside 1–16 devices, a mix of allowed markets, deadlines and
budgets, so nothing is shared between jobs except the pools. One round = ``schedule_round(...)`` as in
``bench_scheduler.py`` (pricing, the model, LP/CP-SAT, explanations for every job).

    .venv/bin/python benchmarks/bench_scheduler_distinct.py               # 1,000 jobs × 100 pools
    .venv/bin/python benchmarks/bench_scheduler_distinct.py --jobs 200 1000 --profile

Rounds: cold (a new empty cache each), warm (the same round again on the first round's cache), then on the
cache of the round before each: one pool's price +10 %, one pool with one node fewer free, one minute later.

Writes benchmarks/results/scheduler_distinct.json (wall and CPU seconds, the load average at start and end).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_scheduler import ACCELERATORS, make_pools
from trainyard.schedule import CandidateCache, QueuedJob, SchedulerConfig, schedule_round
from trainyard.spec import spec_from_dict

_ACC_NAMES = [a for a, _, _ in ACCELERATORS]
_MEM_HEAVY = {"t4", "a10g", "l4"}


def make_distinct_jobs(n: int, rng: random.Random) -> list[QueuedJob]:
    """``n`` jobs, each with its own custom model, measured step times, gang range and objective."""
    jobs = []
    for i in range(n):
        params_b = round(10 ** rng.uniform(-1.3, 1.3), 3)
        lo = rng.choice([1, 1, 2, 4, 8])
        hi = min(16, lo * rng.choice([1, 2, 4]))
        accs = rng.sample(_ACC_NAMES, rng.randint(5, 10))
        base = 0.2 + params_b * rng.uniform(0.05, 0.2)
        measured = {
            a: round(base * rng.uniform(0.4, 2.5) * (1.5 if a in _MEM_HEAVY else 1.0), 4) for a in accs
        }
        objective: dict[str, Any] = {}
        r = rng.random()
        if r < 0.3:
            objective["deadline"] = f"{rng.choice([6, 12, 24, 48, 96])}h"
        if rng.random() < 0.25:
            objective["markets"] = rng.choice([["on_demand", "reserved"], ["spot"], ["spot", "on_demand"]])
        if rng.random() < 0.1:
            objective["budget_usd"] = round(rng.uniform(5, 500), 2)
        if rng.random() < 0.1:
            objective["minimize"] = "time"
        doc: dict[str, Any] = {
            "name": f"distinct-{i:05d}",
            "model": {"architecture": "custom", "params_b": params_b},
            "workload": {
                "seq_len": rng.choice([512, 1024, 2048, 4096]),
                "global_batch": rng.choice([8, 16, 32, 64, 128]),
                "steps": rng.randrange(500, 20_000),
                "method": rng.choice(["full", "full", "lora"]),
            },
            "resources": {"min_devices": lo, "max_devices": hi},
            "objective": objective,
            "measured": {"step_time_s": measured},
        }
        jobs.append(
            QueuedJob(
                job_id=f"job-{i:05d}",
                tenant=f"tenant-{rng.randrange(10)}",
                spec=spec_from_dict(doc),
                submit_s=-rng.uniform(0, 4 * 3600),
                priority=rng.choice([0, 0, 0, 1, 2]),
            )
        )
    return jobs


def _round(jobs: list[QueuedJob], pools: list[Any], cfg: SchedulerConfig, cache: CandidateCache) -> Any:
    t0, c0 = time.perf_counter(), time.process_time()
    res = schedule_round(jobs, pools, now_s=0.0, config=cfg, cache=cache)
    return res, time.perf_counter() - t0, time.process_time() - c0


def bench(n_jobs: int, n_pools: int, seed: int, repeats: int, profile: bool) -> dict[str, Any]:
    rng = random.Random(seed)
    pools = make_pools(n_pools, rng)
    jobs = make_distinct_jobs(n_jobs, rng)
    cfg = SchedulerConfig()
    colds = []
    cache = CandidateCache()
    first, w0, c0 = _round(jobs, pools, cfg, cache)
    colds.append((w0, c0))
    warm, ww, wc = _round(jobs, pools, cfg, cache)
    # warm rounds after small changes, each on the cache of the round before it (as a control plane's loop)
    moved = list(pools)
    i = next(k for k, p in enumerate(moved) if p.price_usd_per_device_hour)
    price = moved[i].price_usd_per_device_hour * 1.1
    moved[i] = moved[i].model_copy(update={"price_usd_per_device_hour": round(price, 4)})
    price_res, pw, pc = _round(jobs, moved, cfg, cache)
    price_ref = schedule_round(jobs, moved, now_s=0.0, config=cfg, cache=CandidateCache())
    fewer = list(moved)
    k = next(k for k, p in enumerate(fewer) if p.free_devices >= p.devices_per_node)
    fewer[k] = fewer[k].model_copy(
        update={"available_devices": fewer[k].free_devices - fewer[k].devices_per_node}
    )
    _, capw, capc = _round(jobs, fewer, cfg, cache)
    t0, c0 = time.perf_counter(), time.process_time()
    schedule_round(jobs, fewer, now_s=60.0, config=cfg, cache=cache)
    clkw, clkc = time.perf_counter() - t0, time.process_time() - c0
    for _ in range(repeats):
        _, w, c = _round(jobs, pools, cfg, CandidateCache())
        colds.append((w, c))
    walls = sorted(w for w, _ in colds)
    cpus = sorted(c for _, c in colds)
    row: dict[str, Any] = {
        "jobs": n_jobs,
        "pools": n_pools,
        "distinct_specs": len({j.spec.model_dump_json(exclude={"name"}) for j in jobs}),
        "round_cold_first_s": round(w0, 3),
        "round_cold_min_s": round(walls[0], 3),
        "round_cold_median_s": round(walls[len(walls) // 2], 3),
        "round_cold_median_cpu_s": round(cpus[len(cpus) // 2], 3),
        "round_warm_s": round(ww, 3),
        "round_warm_cpu_s": round(wc, 3),
        "round_warm_price_s": round(pw, 3),  # one pool's price +10 %
        "round_warm_price_cpu_s": round(pc, 3),
        "round_warm_capacity_s": round(capw, 3),  # one pool has one node fewer free
        "round_warm_capacity_cpu_s": round(capc, 3),
        "round_warm_clock_s": round(clkw, 3),  # one minute later
        "round_warm_clock_cpu_s": round(clkc, 3),
        "warm_price_decides_as_fresh": [p.to_contract() for p in price_res.placements]
        == [p.to_contract() for p in price_ref.placements],
        "status": warm.solver_status,
        "placed": len(warm.placements),
        "unplaced": len(warm.unplaced),
        "objective_usd": round(warm.objective_usd, 2),
        "lower_bound_usd": None if warm.lower_bound_usd is None else round(warm.lower_bound_usd, 2),
        "deterministic": [p.to_contract() for p in first.placements]
        == [p.to_contract() for p in warm.placements],
    }
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        schedule_round(jobs, pools, now_s=0.0, config=cfg, cache=CandidateCache())
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(30)
        print(buf.getvalue())
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, nargs="*", default=[1000])
    ap.add_argument("--pools", type=int, default=100)
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=2, help="more cold rounds, each with a new empty cache")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of one more cold round")
    ap.add_argument("--label", default="", help="what the source tree is (recorded in the JSON)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "scheduler_distinct.json")
    args = ap.parse_args()
    load_start = os.getloadavg()[0]
    rows = [bench(n, args.pools, args.seed, args.repeats, args.profile) for n in args.jobs]
    cols = list(rows[0])
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    doc = {
        "machine": f"{platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}",
        "load_average_1m_at_start": load_start,
        "load_average_1m_at_end": os.getloadavg()[0],
        "command": "python benchmarks/bench_scheduler_distinct.py " + " ".join(sys.argv[1:]),
        "label": args.label,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
