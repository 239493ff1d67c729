"""`trainyard schedule --jobs JOBS --pools POOLS [--json]`: one optimisation round over a queue."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from trainyard.cli.common import (
    Col,
    console,
    duration,
    handle_errors,
    hours,
    market,
    print_json,
    print_table,
    usd,
)
from trainyard.schedule.jobs import JobsFileError


def _read_jobs(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise JobsFileError(
            f"{path}: cannot read ({exc.__class__.__name__})",
            hint="Give the path of a JOBS file: JSON Lines of {submit_s, tenant, spec}.",
        ) from None


@handle_errors
def schedule(
    jobs: Path = typer.Option(
        ..., "--jobs", help="JOBS file: JSON Lines of {submit_s, tenant, spec[, priority]}."
    ),
    pools: Path = typer.Option(..., "--pools", help="POOLS file (YAML) with live capacity and prices."),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON document: placements, unplaced, solve_time_s."
    ),
    now_s: float | None = typer.Option(
        None, "--now-s", help="The round's clock in seconds (default: the latest submit_s in JOBS)."
    ),
    time_limit_s: float | None = typer.Option(
        None, "--time-limit-s", min=0.01, max=600, help="CP-SAT search limit in seconds (default 0.1)."
    ),
) -> None:
    """Place a queue of jobs on pools in one optimisation round (cost + waiting, gangs, capacity, quotas)."""
    from trainyard.catalog.pools import load_pools
    from trainyard.schedule import SchedulerConfig, parse_jobs, schedule_round

    queue = parse_jobs(_read_jobs(jobs), str(jobs))
    live = load_pools(pools)
    now = now_s if now_s is not None else max(j.submit_s for j in queue)
    config = SchedulerConfig() if time_limit_s is None else SchedulerConfig(time_limit_s=time_limit_s)
    # load the pricing and solver libraries first, so the reported time is the round's own
    import ortools.sat.python.cp_model  # noqa: F401
    import scipy.optimize  # noqa: F401

    import trainyard.cost.quote  # noqa: F401

    started = time.perf_counter()
    result = schedule_round(queue, live, now_s=now, config=config)
    round_s = time.perf_counter() - started
    if as_json:
        doc = result.to_contract()
        doc["solve_time_s"] = round(round_s, 6)  # the whole round: pricing, LP, CP-SAT, explanations
        print_json(doc)
        return
    cols = (
        Col("job", key=True),
        Col("pool", key=True),
        Col("devices"),
        Col("market"),
        Col("expected $", justify="right"),
        Col("hours", justify="right", priority=1),
        Col("checkpoint", justify="right", priority=2),
    )
    rows = [
        [
            p.job_id,
            p.pool,
            f"{p.devices} × {p.accelerator}",
            market(p.market),
            usd(p.expected_cost_usd),
            hours(p.expected_hours),
            duration(p.checkpoint_interval_s) if p.checkpoint_interval_s else "-",
        ]
        for p in result.placements
    ]
    print_table(cols, rows, title=f"Placements ({len(result.placements)} of {len(queue)} jobs)")
    for p in result.placements:
        console.print(f"[bold]{p.job_id}[/]: {p.reason}", highlight=False)
    if result.unplaced:
        print_table(
            (Col("job", key=True), Col("why")),
            [[u.job_id, u.reason] for u in result.unplaced],
            title=f"Unplaced ({len(result.unplaced)})",
        )
    console.print(
        f"round: {round_s * 1000:.0f} ms ({result.solver_status}), "
        f"objective {usd(result.objective_usd)} (greedy alone {usd(result.greedy_objective_usd)})"
    )
