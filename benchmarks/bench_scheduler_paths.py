"""Candidate pricing side by side: the vectorised path against the scalar reference, in one process.

Both workloads of the scheduler benchmarks, each round run on both paths (``SchedulerConfig.
vectorised_pricing`` True / False), alternating so that machine load falls on both alike:

* ``shared``: ``bench_scheduler.py``'s queue (1,000 jobs drawn from 24 specs) over its 100 pools;
* ``distinct``: ``bench_scheduler_distinct.py``'s queue (1,000 jobs, every one its own model) over the same
  kind of pools.

Per path and workload: ``--repeats`` cold rounds (a new empty ``CandidateCache`` each), each followed by a
warm round on its cache; the medians of wall and CPU seconds, the ratios scalar / vectorised, whether the
model each round handed the solver (every job's options, capacities, quotas) was equal on both paths
(``same_model``: the solver's inputs are recorded by wrapping ``schedule.round.solve``, which still runs),
and whether every round's decisions (placements and reasons, unplaced jobs and reasons, objective, bounds)
were (``same_decisions``). Equal models give equal decisions unless CP-SAT stops at its wall-clock safety
net (``wall_limit_factor`` x ``time_limit_s``) instead of its deterministic limit, which heavy machine load
can make happen (``cp_sat_wall_capped`` counts those rounds).

    .venv/bin/python benchmarks/bench_scheduler_paths.py                   # 1,000 jobs, both workloads
    .venv/bin/python benchmarks/bench_scheduler_paths.py --jobs 300 --repeats 1

Writes benchmarks/results/scheduler_paths.json (with the load average at start and end).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import trainyard.schedule.round as round_module
from bench_scheduler import make_jobs, make_pools
from bench_scheduler_distinct import make_distinct_jobs
from trainyard.schedule import CandidateCache, QueuedJob, RoundResult, SchedulerConfig, schedule_round

_SOLVE = round_module.solve
_INPUTS: list[tuple[Any, ...]] = []  # (problem, capacities, tenants) of each solve, in order


def _recording_solve(problem: Any, capacities: Any, tenants: Any, cfg: Any, **kw: Any) -> Any:
    _INPUTS.append((problem, capacities, tenants))
    return _SOLVE(problem, capacities, tenants, cfg, **kw)


round_module.solve = _recording_solve  # type: ignore[assignment]


def _decisions(r: RoundResult) -> tuple[Any, ...]:
    return (r.placements, r.unplaced, r.kept, r.objective_usd, r.solver_status, r.lower_bound_usd)


def _round(jobs: list[QueuedJob], pools: list[Any], cfg: SchedulerConfig, cache: CandidateCache) -> Any:
    t0, c0 = time.perf_counter(), time.process_time()
    res = schedule_round(jobs, pools, now_s=0.0, config=cfg, cache=cache)
    return res, time.perf_counter() - t0, time.process_time() - c0, _INPUTS[-1]


def _workload(name: str, n_jobs: int, seed: int) -> tuple[list[QueuedJob], list[Any]]:
    rng = random.Random(seed)
    pools = make_pools(100, rng)
    jobs = make_distinct_jobs(n_jobs, rng) if name == "distinct" else make_jobs(n_jobs, rng)
    return jobs, pools


def bench(name: str, n_jobs: int, seed: int, repeats: int) -> dict[str, Any]:
    jobs, pools = _workload(name, n_jobs, seed)
    base = SchedulerConfig()
    paths = {"scalar": replace(base, vectorised_pricing=False), "vectorised": base}
    times: dict[str, dict[str, list[float]]] = {
        p: {"cold_wall": [], "cold_cpu": [], "warm_wall": [], "warm_cpu": []} for p in paths
    }
    same = same_model = True
    capped = 0
    cap_s = base.wall_limit_factor * base.time_limit_s
    for i in range(repeats):
        order = list(paths) if i % 2 == 0 else list(reversed(paths))
        got: dict[str, tuple[Any, Any]] = {}
        models: dict[str, tuple[Any, Any]] = {}
        for p in order:
            cache = CandidateCache()
            cold, cw, cc, cold_in = _round(jobs, pools, paths[p], cache)
            warm, ww, wc, warm_in = _round(jobs, pools, paths[p], cache)
            models[p] = (cold_in, warm_in)
            capped += sum(
                r.solver_status == "feasible" and r.solve_time_s >= 0.95 * cap_s for r in (cold, warm)
            )
            t = times[p]
            t["cold_wall"].append(cw)
            t["cold_cpu"].append(cc)
            t["warm_wall"].append(ww)
            t["warm_cpu"].append(wc)
            got[p] = (cold, warm)
        same = same and all(_decisions(got["scalar"][k]) == _decisions(got["vectorised"][k]) for k in (0, 1))
        same_model = same_model and models["scalar"] == models["vectorised"]
    med = {p: {k: statistics.median(v) for k, v in t.items()} for p, t in times.items()}
    s, v = med["scalar"], med["vectorised"]
    result = got["vectorised"][0]
    return {
        "workload": name,
        "jobs": n_jobs,
        "pools": len(pools),
        "distinct_specs": len({j.spec.model_dump_json(exclude={"name"}) for j in jobs}),
        "repeats": repeats,
        **{f"scalar_{k}_s": round(x, 3) for k, x in s.items()},
        **{f"vectorised_{k}_s": round(x, 3) for k, x in v.items()},
        "cold_cpu_ratio": round(s["cold_cpu"] / v["cold_cpu"], 2),
        "warm_cpu_ratio": round(s["warm_cpu"] / v["warm_cpu"], 2),
        "same_model": same_model,
        "same_decisions": same,
        "cp_sat_wall_capped": capped,
        "placed": len(result.placements),
        "unplaced": len(result.unplaced),
        "objective_usd": round(result.objective_usd, 2),
        "status": result.solver_status,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--workloads", nargs="*", default=["shared", "distinct"])
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=2, help="cold (+ warm) rounds per path and workload")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "scheduler_paths.json")
    args = ap.parse_args()
    load_start = os.getloadavg()[0]
    rows = [bench(w, args.jobs, args.seed, args.repeats) for w in args.workloads]
    for r in rows:
        print(json.dumps(r))
    doc = {
        "machine": f"{platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}",
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "load_average_1m_at_start": load_start,
        "load_average_1m_at_end": os.getloadavg()[0],
        "command": "python benchmarks/bench_scheduler_paths.py " + " ".join(sys.argv[1:]),
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
