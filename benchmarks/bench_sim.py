"""Simulator benchmark: what trainyard saves on the example traces, and how fast the simulator runs.

    .venv/bin/python benchmarks/bench_sim.py                 # both parts (several minutes on 2 cores)
    .venv/bin/python benchmarks/bench_sim.py --skip-scale    # savings only
    .venv/bin/python benchmarks/bench_sim.py --skip-savings --scale-jobs 10000 --scale-days 30

Part 1 runs every policy on examples/trace-small.jsonl and examples/trace-week.jsonl against
examples/sim-pools.yaml (same arrivals, same seed per run) and checks the issue's targets: trainyard's
cost <= 1.2 x the lower bound, <= 0.6 x on-demand-only, below cheapest-hourly, no more deadline misses
than on-demand-only, all jobs completed. Part 2 simulates a generated trace (default 10,000 jobs over
30 days) on examples/sim-pools-large.yaml under the trainyard policy and reports wall and CPU time.
Results go to benchmarks/results/bench_sim.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainyard.catalog.pools import load_pools  # noqa: E402
from trainyard.schedule import SchedulerConfig  # noqa: E402
from trainyard.sim import POLICY_NAMES, SimConfig, TraceMix, generate_trace, simulate  # noqa: E402
from trainyard.sim.files import read_trace  # noqa: E402

TRACES = ("trace-small.jsonl", "trace-week.jsonl")


def savings(seeds: list[int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    pools = load_pools(ROOT / "examples" / "sim-pools.yaml")
    rows: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    for name in TRACES:
        jobs = read_trace(ROOT / "examples" / name)
        for seed in seeds:
            by_policy: dict[str, dict[str, Any]] = {}
            for policy in POLICY_NAMES:
                t0, c0 = time.perf_counter(), time.process_time()
                r = simulate(
                    jobs,
                    pools,
                    policy,
                    SimConfig(seed=seed),
                    scheduler_config=SchedulerConfig(seed=seed),
                    timer=time.perf_counter,
                )
                s = r.summary()
                s.update(
                    trace=name, seed=seed, wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0
                )
                by_policy[policy] = s
                rows.append(s)
                print(
                    f"{name:18s} seed {seed} {policy:16s} ${s['total_cost_usd']:>10,.2f} "
                    f"x LB {s['total_cost_usd'] / s['lower_bound_cost_usd']:.3f}  done {s['jobs_completed']}/"
                    f"{s['jobs_total']}  missed {s['deadline_misses']:2d}  preempt {s['preemptions']:4d}  "
                    f"mean JCT {s['mean_jct_s'] / 3600:5.2f} h  ({s['cpu_s']:.1f} s CPU)",
                    flush=True,
                )
            ty, od, ch = by_policy["trainyard"], by_policy["on-demand-only"], by_policy["cheapest-hourly"]
            check = {
                "trace": name,
                "seed": seed,
                "cost_over_lower_bound": ty["total_cost_usd"] / ty["lower_bound_cost_usd"],
                "cost_over_on_demand_only": ty["total_cost_usd"] / od["total_cost_usd"],
                "cost_over_cheapest_hourly": ty["total_cost_usd"] / ch["total_cost_usd"],
                "deadline_misses": ty["deadline_misses"],
                "on_demand_only_deadline_misses": od["deadline_misses"],
                "all_completed": ty["jobs_completed"] == ty["jobs_total"],
            }
            check["pass"] = (
                check["cost_over_lower_bound"] <= 1.2
                and check["cost_over_on_demand_only"] <= 0.6
                and check["cost_over_cheapest_hourly"] < 1.0
                and check["deadline_misses"] <= check["on_demand_only_deadline_misses"]
                and check["all_completed"]
            )
            checks.append(check)
    return rows, checks


def scale(
    n_jobs: int, days: float, seed: int, round_gap_s: float, replan_s: float, limit_s: float
) -> dict[str, Any]:
    t0 = time.perf_counter()
    jobs = generate_trace(TraceMix(n_jobs=n_jobs, span_s=days * 86400.0), seed=seed)
    gen_s = time.perf_counter() - t0
    pools = load_pools(ROOT / "examples" / "sim-pools-large.yaml")
    out: dict[str, Any] = {
        "jobs": n_jobs,
        "days": days,
        "generate_s": gen_s,
        "round_gap_s": round_gap_s,
        "replan_running_s": replan_s,
    }
    cfg = SimConfig(seed=seed, round_gap_s=round_gap_s, replan_running_s=replan_s)
    for policy in ("cheapest-hourly", "trainyard"):
        t0, c0 = time.perf_counter(), time.process_time()
        r = simulate(
            jobs,
            pools,
            policy,
            cfg,
            scheduler_config=SchedulerConfig(time_limit_s=limit_s),
            timer=time.perf_counter,
        )
        s = r.summary()
        s.update(wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0, rounds=r.rounds)
        s["simulated_days"] = r.end_s / 86400.0
        out[policy] = s
        print(
            f"scale {n_jobs} jobs / {days:g} days, {policy:16s}: {s['wall_s']:.1f} s wall, "
            f"{s['cpu_s']:.1f} s CPU, "
            f"{r.rounds} rounds, {s['jobs_completed']}/{n_jobs} done, ${s['total_cost_usd']:,.0f} "
            f"(x LB {s['total_cost_usd'] / s['lower_bound_cost_usd']:.3f})",
            flush=True,
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="1,2", help="comma list of seeds for part 1")
    ap.add_argument("--skip-savings", action="store_true")
    ap.add_argument("--skip-scale", action="store_true")
    ap.add_argument("--scale-jobs", type=int, default=10_000)
    ap.add_argument("--scale-days", type=float, default=30.0)
    ap.add_argument("--scale-round-gap-s", type=float, default=900.0)
    ap.add_argument("--scale-replan-s", type=float, default=3 * 3600.0)
    ap.add_argument("--scale-time-limit-s", type=float, default=0.1)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_sim.json"))
    args = ap.parse_args()
    result: dict[str, Any] = {"machine": {"python": platform.python_version(), "cpus": _cpus()}}
    if not args.skip_savings:
        rows, checks = savings([int(s) for s in args.seeds.split(",")])
        result["savings"] = rows
        result["checks"] = checks
        print()
        print(
            "| trace | seed | trainyard / lower bound | / on-demand-only | / cheapest-hourly "
            "| misses (on-demand-only) | pass |"
        )
        print("|---|---|---|---|---|---|---|")
        for c in checks:
            print(
                f"| {c['trace']} | {c['seed']} | {c['cost_over_lower_bound']:.3f} "
                f"| {c['cost_over_on_demand_only']:.3f} | {c['cost_over_cheapest_hourly']:.3f} "
                f"| {c['deadline_misses']} ({c['on_demand_only_deadline_misses']}) "
                f"| {'yes' if c['pass'] else 'NO'} |"
            )
    if not args.skip_scale:
        result["scale"] = scale(
            args.scale_jobs,
            args.scale_days,
            1,
            args.scale_round_gap_s,
            args.scale_replan_s,
            args.scale_time_limit_s,
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {out}")


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


if __name__ == "__main__":
    main()
