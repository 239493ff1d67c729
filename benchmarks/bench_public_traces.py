"""Simulator benchmark on public workloads: Philly arrivals and gang sizes, Gavel's measured step times.

Workload (``benchmarks/data/philly_gavel/``, see its README for the sources): the first 40 jobs of each of
the first four Philly virtual clusters as they come (real arrival times and gang sizes), each job's model
and batch size from Gavel's mapping, and the true step time of each job on K80, P100 and V100 from Gavel's
measured throughputs (``measured.step_time_s``: the simulator takes a measured step time as the truth).
Every job is an ``architecture: custom`` model without ``seq_len`` (CNNs, recommenders, RL, LSTMs and
Transformers alike: only their measured speed matters here). Gang sizes not in Gavel's table (1, 2, 4, 8
GPUs) use the next smaller measured size scaled linearly. Work is ``total_steps`` capped at
``--cap-hours`` of V100 time (Gavel's traces are heavy-tailed).

Cluster: K80, P100 and V100, each on-demand and spot (GCP list prices from the shared price snapshot;
K80, retired from GCP, at its former list price), plus a small reserved V100 pool billed as committed
spend. The V100 and P100 spot pools replay the packaged AWS 4-node preemption traces of Can't Be Late
(NSDI '24); the seed moves where in the trace the run starts.

Policies: trainyard, on-demand-only, cheapest-hourly, fastest; each against the capacity-aware lower
bound (``SimResult.lower_bound_cost_usd``: committed spend + the LP over (job, pool) shares). The reserved
pool is billed over one span for every policy, the longest run's (``sim.simulate_policies``): a policy
that finishes sooner does not pay less for a reservation, and one that finishes later does not get a
larger bound to be measured against.

    .venv/bin/python benchmarks/bench_public_traces.py                 # 4 VCs × 2 seeds
    .venv/bin/python benchmarks/bench_public_traces.py --vcs 2 --seeds 0

Writes benchmarks/results/public_traces.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from trainyard.catalog.pools import Pool
from trainyard.sim import SimConfig, TraceJob, common_span_s, parse_spot_trace, run_policies
from trainyard.spec import spec_from_dict

DATA = Path(__file__).parent / "data" / "philly_gavel"
SPOT_DATA = Path(__file__).parents[1] / "src" / "trainyard" / "sim" / "data"
GPUS = ("k80", "p100", "v100")

# rough parameter counts (billions) of Gavel's models; only memory checks read them
PARAMS_B = {
    "ResNet-18": 0.0117,
    "ResNet-50": 0.0256,
    "Transformer": 0.065,
    "LM": 0.03,
    "Recommendation": 0.02,
    "CycleGAN": 0.0114,
    "A3C": 0.001,
}
# USD per device-hour: (on-demand, spot). P100/V100: GCP us-central1 accelerator prices in the shared
# snapshot (SkyPilot catalog); K80: GCP's former list price ($0.45 on-demand, $0.135 preemptible).
PRICES = {"k80": (0.45, 0.135), "p100": (1.46, 0.7034), "v100": (2.48, 0.74)}
RESERVED_V100_USD = 1.40


def throughputs() -> dict[tuple[str, int], dict[str, float]]:
    out: dict[tuple[str, int], dict[str, float]] = {}
    with (DATA / "gavel_throughputs.csv").open() as f:
        for r in csv.DictReader(f):
            out[(r["job_type"], int(r["num_gpus"]))] = {g: float(r[f"{g}_steps_per_s"]) for g in GPUS}
    return out


def job_type(model: str, batch: str) -> str:
    return model if not batch else f"{model} (batch size {batch})"


def step_times(tp: dict[tuple[str, int], dict[str, float]], jt: str, gpus: int) -> dict[str, float]:
    """Seconds per step of the whole gang on each GPU type (linear scaling past the largest measured)."""
    sizes = sorted(n for t, n in tp if t == jt)
    ref = max([n for n in sizes if n <= gpus] or sizes[:1])
    return {g: ref / (gpus * v) for g, v in tp[(jt, ref)].items() if v > 0}


def load_jobs(vc: str, cap_hours: float) -> list[TraceJob]:
    tp = throughputs()
    jobs = []
    with (DATA / "trace_jobs_first40_of_4vcs.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["vc"] == vc]
    for r in rows:
        gpus = int(r["num_gpus"])
        jt = job_type(r["model_or_task"], r["batch_size"])
        st = step_times(tp, jt, gpus)
        steps = min(int(r["total_steps"]), max(1, int(cap_hours * 3600 / st["v100"])))
        spec = spec_from_dict(
            {
                "name": f"{vc}-{r['job_id']}",
                "model": {"architecture": "custom", "params_b": PARAMS_B[r["model_or_task"]]},
                "workload": {"global_batch": int(r["batch_size"] or 1), "steps": steps, "precision": "fp32"},
                "resources": {"min_devices": gpus, "max_devices": gpus},
                "measured": {"step_time_s": st},
            }
        )
        jobs.append(TraceJob(job_id=spec.name, submit_s=float(r["submit_time_s"]), tenant=vc, spec=spec))
    return jobs


def _costs(r: Any) -> dict[str, Any]:
    return {
        "total_cost_usd": round(r.total_cost_usd, 2),
        "committed_cost_usd": round(r.committed_cost_usd, 2),
        "usage_cost_usd": round(r.usage_cost_usd, 2),
        "lower_bound_cost_usd": round(r.lower_bound_cost_usd, 2),
        "per_job_lower_bound_usd": round(r.per_job_lower_bound_usd, 2),
        "lower_bound_status": r.lower_bound_status,
        "x_bound": round(r.total_cost_usd / r.lower_bound_cost_usd, 3)
        if r.lower_bound_cost_usd > 0
        else None,
    }


def vcs_in_order() -> list[str]:
    with (DATA / "trace_jobs_first40_of_4vcs.csv").open() as f:
        return list(dict.fromkeys(r["vc"] for r in csv.DictReader(f)))


def make_pools() -> list[Pool]:
    pools = []
    for g in GPUS:
        od, spot = PRICES[g]
        pools.append(
            Pool(name=f"{g}-od", accelerator=g, devices_per_node=8, nodes=4, market="on_demand",
                 price_usd_per_device_hour=od, cloud="gcp", region="us-central1")
        )  # fmt: skip
        pools.append(
            Pool(name=f"{g}-spot", accelerator=g, devices_per_node=4, nodes=4, market="spot",
                 price_usd_per_device_hour=spot, cloud="gcp", region="us-central1",
                 interruption_rate_per_hour=0.05, notice_s=30.0)
        )  # fmt: skip
    pools.append(
        Pool(name="v100-reserved", accelerator="v100", devices_per_node=4, nodes=1, market="reserved",
             price_usd_per_device_hour=RESERVED_V100_USD, cloud="gcp", region="us-central1")
    )  # fmt: skip
    return pools


def spot_traces() -> dict[str, Any]:
    return {
        "v100-spot": parse_spot_trace((SPOT_DATA / "aws-preemption-4node-us-west-2c.json").read_text()),
        "p100-spot": parse_spot_trace((SPOT_DATA / "aws-preemption-4node-us-east-2a.json").read_text()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vcs", type=int, default=4, help="how many VCs, in file order")
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1])
    ap.add_argument("--cap-hours", type=float, default=12.0, help="cap each job's work at this V100 time")
    ap.add_argument(
        "--policies", nargs="*", default=["trainyard", "on-demand-only", "cheapest-hourly", "fastest"]
    )
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "public_traces.json")
    args = ap.parse_args()
    load_start = os.getloadavg()[0]
    rows = []
    pools = make_pools()
    traces = spot_traces()
    for vc in vcs_in_order()[: args.vcs]:
        jobs = load_jobs(vc, args.cap_hours)
        for seed in args.seeds:
            cfg = SimConfig(seed=seed, trace_offset_s=seed * 5 * 86400.0)
            row: dict[str, Any] = {"vc": vc, "jobs": len(jobs), "seed": seed}
            t0 = time.process_time()
            sims = run_policies(jobs, pools, args.policies, cfg, spot_traces=traces)
            span_s = common_span_s(sims)
            row["cpu_s_all_policies"] = round(time.process_time() - t0, 1)
            row["common_span_h"] = round(span_s / 3600, 1)
            for policy, sim in sims.items():
                r, own = sim.result(span_s), sim.result(None)
                s = r.summary()
                row[policy] = {
                    **_costs(r),  # committed spend over the common span (the headline figures)
                    "own_span": {**_costs(own), "committed_span_h": round(own.committed_span_s / 3600, 1)},
                    "completed": s["jobs_completed"],
                    "deadline_misses": s["deadline_misses"],
                    "preemptions": s["preemptions"],
                    "mean_jct_h": round(s["mean_jct_s"] / 3600, 2),
                    "end_h": round(r.end_s / 3600, 1),
                    "pool_utilisation": {p.name: round(p.utilisation, 3) for p in r.pools},
                }
            ty, od = row.get("trainyard"), row.get("on-demand-only")
            if ty and od:
                row["trainyard_over_on_demand_only"] = round(ty["total_cost_usd"] / od["total_cost_usd"], 3)
            rows.append(row)
            print(
                f"{vc} seed {seed} ({len(jobs)} jobs): "
                + "; ".join(
                    f"{p} ${row[p]['total_cost_usd']:,.0f} (committed {row[p]['committed_cost_usd']:,.0f}) "
                    f"×bound {row[p]['x_bound']} (own span {row[p]['own_span']['x_bound']}) "
                    f"missed {row[p]['deadline_misses']} "
                    f"done {row[p]['completed']}"
                    for p in args.policies
                )
                + f"; trainyard/on-demand-only {row.get('trainyard_over_on_demand_only')}",
                flush=True,
            )
    doc = {
        "machine": f"{platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}",
        "load_average_1m_at_start": load_start,
        "load_average_1m_at_end": os.getloadavg()[0],
        "command": "python benchmarks/bench_public_traces.py " + " ".join(sys.argv[1:]),
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
