"""`trainyard schedule --jobs JOBS --pools POOLS [--json]`: one optimisation round over a queue."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.table import Table

from trainyard.cli.common import console, handle_errors, print_json
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
    table = Table(title=f"Placements ({len(result.placements)} of {len(queue)} jobs)")
    for col in ("job", "pool", "devices", "market", "expected $", "hours", "checkpoint"):
        table.add_column(col, overflow="fold")
    for p in result.placements:
        ckpt = f"{p.checkpoint_interval_s / 60:.0f} min" if p.checkpoint_interval_s else "-"
        table.add_row(
            p.job_id,
            p.pool,
            f"{p.devices} × {p.accelerator}",
            p.market,
            f"{p.expected_cost_usd:,.2f}",
            f"{p.expected_hours:.2f}",
            ckpt,
        )
    console.print(table)
    for p in result.placements:
        console.print(f"[bold]{p.job_id}[/]: {p.reason}", highlight=False)
    if result.unplaced:
        un = Table(title=f"Unplaced ({len(result.unplaced)})")
        un.add_column("job")
        un.add_column("why", overflow="fold")
        for u in result.unplaced:
            un.add_row(u.job_id, u.reason)
        console.print(un)
    console.print(
        f"round: {round_s * 1000:.0f} ms ({result.solver_status}), "
        f"objective ${result.objective_usd:,.2f} (greedy alone ${result.greedy_objective_usd:,.2f})"
    )
