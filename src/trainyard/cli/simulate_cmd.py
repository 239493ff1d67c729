"""`trainyard simulate` (replay a trace on simulated pools under a policy) and `trainyard trace generate`."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from trainyard.catalog.pools import load_pools
from trainyard.cli.common import Col, console, duration, handle_errors, print_json, print_table, usd
from trainyard.errors import InvalidInputError

if TYPE_CHECKING:
    from trainyard.sim.spot import SpotTrace

trace_app = typer.Typer(help="Workload traces for the simulator.", no_args_is_help=True)


def _policies(value: str) -> list[str]:
    from trainyard.sim import POLICY_NAMES

    names = list(POLICY_NAMES) if value == "all" else [v.strip() for v in value.split(",") if v.strip()]
    for n in names:
        if n not in POLICY_NAMES:
            raise InvalidInputError(
                f"--policy: unknown policy {n!r}", hint=f"Policies: {', '.join(POLICY_NAMES)} (or all)."
            )
    if not names:
        raise InvalidInputError(
            "--policy: give a policy name", hint="Policies: trainyard, cheapest-hourly, ..."
        )
    return names


def _spot_traces(values: list[str]) -> dict[str, SpotTrace]:
    from trainyard.sim.files import PACKAGED_SPOT_TRACES, load_spot_trace

    out: dict[str, SpotTrace] = {}
    for v in values:
        pool, sep, ref = v.partition("=")
        if not sep or not pool or not ref:
            raise InvalidInputError(
                f"--spot-trace {v!r}: expected POOL=FILE",
                hint=f"FILE is a spot trace JSON or one of: {', '.join(PACKAGED_SPOT_TRACES)}.",
            )
        out[pool] = load_spot_trace(ref)
    return out


@handle_errors
def simulate(
    trace: Path = typer.Option(..., "--trace", help="TRACE file: JSON Lines of {submit_s, tenant, spec}."),
    pools: Path = typer.Option(..., "--pools", help="POOLS file (YAML): the simulated cluster."),
    policy: str = typer.Option(
        "trainyard",
        "--policy",
        help="trainyard, cheapest-hourly, fastest, on-demand-only; a comma list or 'all' runs several.",
    ),
    seed: int = typer.Option(0, "--seed", min=0, help="Random seed (preemptions, step-time errors, prices)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON document."),
    report: Path | None = typer.Option(None, "--report", help="Write CSVs and PNG plots to this directory."),
    spot_trace: list[str] = typer.Option(
        [],
        "--spot-trace",
        help="POOL=FILE: replay a spot availability/preemption trace on a pool (repeatable).",
    ),
    step_error_sigma: float = typer.Option(
        0.15, "--step-error-sigma", min=0.0, max=3.0, help="Log-normal sigma of true vs predicted step time."
    ),
    price_volatility: float = typer.Option(
        0.0, "--price-volatility", min=0.0, max=2.0, help="Spot price moves: log-price sigma every 6 h."
    ),
    round_gap_s: float = typer.Option(
        300.0, "--round-gap-s", min=0.0, help="At most one round per this many s."
    ),
    time_limit_s: float = typer.Option(
        0.35, "--time-limit-s", min=0.001, max=600, help="Scheduler solve limit per round."
    ),
) -> None:
    """Simulate a trace on pools under one or more policies; print the summary (and write a report)."""
    from trainyard.schedule import SchedulerConfig
    from trainyard.sim import SimConfig
    from trainyard.sim import simulate as run_sim
    from trainyard.sim.files import read_trace, write_report

    names = _policies(policy)
    jobs = read_trace(trace)
    live = load_pools(pools)
    traces = _spot_traces(spot_trace)
    cfg = SimConfig(
        seed=seed,
        step_time_error_sigma=step_error_sigma,
        spot_price_volatility=price_volatility,
        round_gap_s=round_gap_s,
    )
    sched = SchedulerConfig(time_limit_s=time_limit_s, seed=seed)
    results = []
    for name in names:
        if not as_json:
            console.print(f"simulating {len(jobs)} jobs under [bold]{name}[/] ...", highlight=False)
        results.append(
            run_sim(
                jobs, live, name, cfg, spot_traces=traces, scheduler_config=sched, timer=time.perf_counter
            )
        )
    if report is not None:
        written = write_report(results, report)
        if not as_json:
            console.print(f"report: {len(written)} files in {report}", highlight=False)
    summaries = [r.summary() for r in results]
    if as_json:
        print_json(summaries[0] if len(summaries) == 1 else summaries)
        return
    cols = [Col("policy", key=True), Col("done", justify="right")]
    cols += [Col(h, justify="right") for h in ("cost", "reserved", "× LB", "mean JCT", "p99 JCT")]
    late = (("missed", 1), ("preempt", 2), ("lost dev-h", 3))
    cols += [Col(h, justify="right", priority=p) for h, p in late]
    rows = []
    for s in summaries:
        lb = s["lower_bound_cost_usd"]
        rows.append(
            [
                s["policy"],
                f"{s['jobs_completed']}/{s['jobs_total']}",
                usd(s["total_cost_usd"]),
                usd(s["committed_cost_usd"]),
                f"{s['total_cost_usd'] / lb:.2f}" if lb > 0 else "-",
                duration(s["mean_jct_s"]),
                duration(s["p99_jct_s"]),
                str(s["deadline_misses"]),
                str(s["preemptions"]),
                f"{s['lost_work_device_s'] / 3600:.2f}",
            ]
        )
    print_table(cols, rows, title=f"{trace.name} on {pools.name} (seed {seed})")
    console.print(
        "cost = usage + reserved capacity over the run (committed); lower bound per policy (committed + "
        "usage within each pool's capacity over the run, time order relaxed): "
        + ", ".join(f"{s['policy']} {usd(s['lower_bound_cost_usd'])}" for s in summaries)
    )


@trace_app.command("generate")
@handle_errors
def generate(
    jobs: int = typer.Option(100, "--jobs", min=1, max=1_000_000, help="Number of jobs."),
    days: float = typer.Option(2.0, "--days", min=0.001, max=3650, help="Arrival window in days (Poisson)."),
    seed: int = typer.Option(0, "--seed", min=0, help="Random seed."),
    deadline_fraction: float = typer.Option(0.3, "--deadline-fraction", min=0.0, max=1.0),
    lora_fraction: float = typer.Option(0.4, "--lora-fraction", min=0.0, max=1.0),
    sizes: str = typer.Option(
        "0.35b:0.25,1.3b:0.35,7b:0.3,13b:0.1", "--sizes", help="Model-size mix, SIZE:WEIGHT comma list."
    ),
    gangs: str = typer.Option("1:0.45,2:0.2,4:0.2,8:0.15", "--gangs", help="Gang-size mix, DEVICES:WEIGHT."),
    hours: str = typer.Option("0.5:12", "--hours", help="Job length range in reference hours, LO:HI."),
    out: Path | None = typer.Option(None, "--out", help="Write the TRACE here instead of stdout."),
    as_json: bool = typer.Option(
        False, "--json", help="Print {jobs, out} (with --out), or {jobs, trace: [...]}, as one JSON document."
    ),
) -> None:
    """Generate a synthetic TRACE: Poisson arrivals, model-size and gang-size mixes, deadline fractions."""
    from trainyard.sim import TraceMix, dump_trace, generate_trace

    def mix(text: str, what: str, cast: type) -> dict[Any, float]:
        outd: dict[Any, float] = {}
        for part in text.split(","):
            k, sep, w = part.partition(":")
            try:
                outd[cast(k.strip())] = float(w)
            except ValueError:
                raise InvalidInputError(f"--{what}: {part!r} is not KEY:WEIGHT") from None
            if not sep or outd[cast(k.strip())] < 0:
                raise InvalidInputError(f"--{what}: {part!r} is not KEY:WEIGHT with a weight >= 0")
        if not outd or sum(outd.values()) <= 0:
            raise InvalidInputError(f"--{what}: give at least one positive weight")
        return outd

    lo, sep, hi = hours.partition(":")
    try:
        lo_h, hi_h = float(lo), float(hi)
    except ValueError:
        raise InvalidInputError(f"--hours: {hours!r} is not LO:HI") from None
    if not sep or not 0 < lo_h <= hi_h:
        raise InvalidInputError(f"--hours: {hours!r} needs 0 < LO <= HI")
    m = TraceMix(
        n_jobs=jobs,
        span_s=days * 86400.0,
        model_sizes=mix(sizes, "sizes", str),
        gang_sizes=mix(gangs, "gangs", int),
        lora_fraction=lora_fraction,
        deadline_fraction=deadline_fraction,
        job_hours=(lo_h, hi_h),
    )
    try:
        trace = generate_trace(m, seed)
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None
    text = dump_trace(trace)
    if out is not None:
        out.write_text(text, encoding="utf-8")
    if as_json:
        import json

        if out is not None:
            print_json({"jobs": len(trace), "out": str(out)})
        else:
            print_json({"jobs": len(trace), "trace": [json.loads(x) for x in text.splitlines() if x.strip()]})
    elif out is None:
        sys.stdout.write(text)
    else:
        console.print(f"wrote {len(trace)} jobs to {out}", highlight=False)
