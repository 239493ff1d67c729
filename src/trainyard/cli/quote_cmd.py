"""`trainyard quote SPEC [--pools POOLS] [--json]`: every option priced and ranked."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import typer
from rich.console import Console

from trainyard.catalog.offers import with_catalog_price
from trainyard.catalog.pools import load_pools
from trainyard.cli.common import (
    WIDE_OPTION_HELP,
    Col,
    console,
    handle_errors,
    market,
    print_json,
    print_table,
)
from trainyard.cost.model import CostParams
from trainyard.cost.money import format_duration_s, format_usd
from trainyard.cost.quote import QuoteOption
from trainyard.predict.model import mark_executability
from trainyard.settings import load_settings
from trainyard.spec import JobSpec, load_spec


def _where(o: QuoteOption) -> str:
    return f"{o.cloud}/{o.region}" if o.cloud else o.region


def quote_rows(
    spec: JobSpec, options: Sequence[QuoteOption], limit: int | None
) -> tuple[list[Col], list[list[str]], str]:
    """Feasible options, ranked, as table columns (lowest value dropped first on a narrow terminal),
    rows and the caption."""
    feasible = [o for o in options if o.feasible]
    shown = feasible if limit is None else feasible[:limit]
    rank_by = "expected hours" if spec.objective.minimize.value == "time" else "expected cost"
    cols = [
        Col("#", justify="right"),
        Col("accelerator", key=True),
        Col("dev", justify="right"),
        Col("market"),
        Col("offer", key=True, priority=1),
        Col("s/step", justify="right", priority=3),
        Col("$/h", justify="right", priority=2),
        Col("$/step", justify="right"),
        Col("hours", justify="right", priority=1),
        Col("p90 h", justify="right", priority=4),
        Col("expected $", justify="right"),
        Col("preempt $", justify="right", priority=3),
        Col("ckpt", justify="right", priority=2),
    ]
    rows = []
    for i, o in enumerate(shown, 1):
        where = f"{o.cloud} {o.region}" if o.cloud else o.region
        offer = f"{where} {o.instance_type}" if o.instance_type and o.pool.count("/") == 3 else o.pool
        step = f"{o.step_time_s:.3g}" + ("*" if o.step_time_source.startswith("measured") else "")
        rows.append(
            [
                str(i),
                o.accelerator,
                str(o.devices),
                market(o.market),
                offer,
                step,
                format_usd(o.price_usd_per_hour),
                format_usd(o.usd_per_step),
                f"{o.expected_hours:,.1f}",
                f"{o.expected_hours_p90:,.1f}",
                format_usd(o.expected_cost_usd),
                format_usd(o.preemption_overhead_usd) if o.preemption_overhead_usd else "-",
                format_duration_s(o.checkpoint_interval_s),
            ]
        )
    return cols, rows, f"ranked by {rank_by}; $/step includes checkpoint and preemption overhead"


def infeasible_rows(options: Sequence[QuoteOption], limit: int = 10) -> tuple[list[list[str]], int]:
    """Infeasible options grouped by accelerator and reason (most common first)."""
    groups: Counter[tuple[str, str]] = Counter((o.accelerator, o.reason) for o in options if not o.feasible)
    rows = [[acc, str(n), reason] for (acc, reason), n in groups.most_common(limit)]
    return rows, max(0, len(groups) - limit)


def print_quote(
    spec: JobSpec,
    options: Sequence[QuoteOption],
    *,
    limit: int | None,
    out: Console,
    title: str,
    wide: bool = False,
) -> None:
    feasible = sum(o.feasible for o in options)
    cols, rows, caption = quote_rows(spec, options, limit)
    print_table(cols, rows, title=title, out=out, wide=wide)
    out.print(f"[dim]{caption}[/]")
    if limit is not None and feasible > limit:
        out.print(f"[dim]{feasible - limit} more feasible options: --limit N, --all or --json[/]")
    if feasible == 0:
        out.print("[bold red]no feasible option[/]: relax the constraints named below")
    reasons, more = infeasible_rows(options)
    if reasons:
        why = (Col("accelerator", key=True), Col("options", justify="right"), Col("why"))
        print_table(why, reasons, title="Not feasible", out=out)
        if more:
            out.print(f"[dim]{more} more reasons: --json lists every option[/]")
    if any(o.feasible and o.step_time_source.startswith("measured") for o in options):
        out.print("[dim]* measured step time (measured.step_time_s)[/]")


def quote_command(
    spec_path: Path = typer.Argument(..., help="Job spec (YAML or JSON)."),
    pools_path: Path | None = typer.Option(
        None, "--pools", help="POOLS file (YAML); without it the packaged catalog is quoted."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print {options: [...]} as one JSON document."),
    limit: int = typer.Option(20, "--limit", min=1, help="Feasible rows shown in the table."),
    show_all: bool = typer.Option(False, "--all", help="Show every feasible row."),
    wide: bool = typer.Option(False, "--wide", "-w", help=WIDE_OPTION_HELP),
) -> None:
    """Price the job on every pool × device count × market, cheapest first, with reasons for the rest."""
    _run(spec_path, pools_path, as_json, None if show_all else limit, wide)


@handle_errors
def _run(spec_path: Path, pools_path: Path | None, as_json: bool, limit: int | None, wide: bool) -> None:
    spec = load_spec(spec_path)
    settings = load_settings()
    params = CostParams(reserved_discount=settings.reserved_discount_1y)
    pools = None
    if pools_path is not None:
        # a pool without a price of its own must have one in the catalog: fail on the file, not per option
        pools = [
            with_catalog_price(p, reserved_discount=params.reserved_discount) for p in load_pools(pools_path)
        ]
    from trainyard.cli.predict_cmd import resolve_calibration
    from trainyard.services.feedback import calibrated_quote

    if pools is None:  # the packaged catalog, as `quote` would take it
        from trainyard.catalog.offers import offers_as_pools

        pools = offers_as_pools(reserved_discount=params.reserved_discount)
    # the calibration `trainyard predict` and the server use (this machine's profiles included)
    cal = resolve_calibration(None, use_profiles=True)
    options = mark_executability(
        spec, calibrated_quote(spec, pools, cal, params=params, now=datetime.now(UTC))
    )
    if as_json:
        print_json({"options": [o.to_contract() for o in options]})
        return
    src = str(pools_path) if pools_path else "the packaged catalog"
    print_quote(spec, options, limit=limit, out=console, title=f"Quote for {spec.name} on {src}", wide=wide)
