"""`trainyard sweeps quote SWEEP`: a hyperparameter sweep priced as a group before anything runs."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from trainyard.catalog.offers import with_catalog_price
from trainyard.catalog.pools import load_pools
from trainyard.cli.common import console, handle_errors, print_json
from trainyard.cost.model import CostParams
from trainyard.cost.money import format_duration_s, format_usd
from trainyard.errors import SpecError
from trainyard.settings import load_settings
from trainyard.spec.loader import parse_document
from trainyard.spec.sweep import SweepSpec, sweep_from_dict

app = typer.Typer(
    help="Hyperparameter sweeps: grid or random search, successive halving, one budget.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def load_sweep(path: Path) -> SweepSpec:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file", hint="Give the path of a sweep YAML or JSON file.") from None
    return sweep_from_dict(parse_document(text, str(path)), str(path))


def _param(path: str, value: object) -> str:
    name = path.split(".")[-1]
    return f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}"


@app.command("quote")
def quote_command(
    sweep_path: Path = typer.Argument(..., metavar="SWEEP", help="Sweep file (kind: Sweep)."),
    pools_path: Path | None = typer.Option(None, "--pools", help="POOLS file (default: the catalog)."),
    as_json: bool = typer.Option(False, "--json", help="Print the group quote as one JSON document."),
) -> None:
    """Expected total cost and time of the whole search, per trial and per rung."""
    _quote(sweep_path, pools_path, as_json)


@handle_errors
def _quote(sweep_path: Path, pools_path: Path | None, as_json: bool) -> None:
    from trainyard.cost.sweep import quote_sweep

    sweep = load_sweep(sweep_path)
    params = CostParams(reserved_discount=load_settings().reserved_discount_1y)
    pools = None
    if pools_path is not None:
        pools = [
            with_catalog_price(p, reserved_discount=params.reserved_discount) for p in load_pools(pools_path)
        ]
    q = quote_sweep(sweep, pools, params=params, now=datetime.now(UTC))
    if as_json:
        doc = q.to_dict()
        for k in ("expected_cost_usd", "max_cost_usd", "expected_hours"):
            if not math.isfinite(doc[k]):
                doc[k] = None
        print_json(doc)
        return
    out = console if console.is_terminal else Console(width=140)
    t = Table(title=f"Sweep {sweep.name}: {len(q.trials)} trials", header_style="bold")
    for col in ("trial", "parameters", "accelerator", "market", "pool", "$/step", "full run $"):
        t.add_column(col, no_wrap=col in ("trial", "pool"))
    for tr in q.trials:
        o = tr.option
        params_text = ", ".join(_param(k, v) for k, v in tr.parameters.items())
        if o is None:
            t.add_row(tr.name, params_text, "-", "-", tr.reason, "-", "-")
        else:
            where = f"{o.devices} x {o.accelerator}"
            market = o.market.replace("_", "-")
            t.add_row(tr.name, params_text, where, market, o.pool, format_usd(o.usd_per_step),
                      format_usd(o.expected_cost_usd))  # fmt: skip
    out.print(t)
    if len(q.rungs) > 1:
        out.print(
            "successive halving: "
            + " -> ".join(
                f"{r.trials} trial{'s' if r.trials != 1 else ''} to {r.steps:,} steps" for r in q.rungs
            )
        )
    if math.isfinite(q.expected_cost_usd):
        out.print(
            f"expected {format_usd(q.expected_cost_usd)}, at most {format_usd(q.max_cost_usd)}, "
            f"about {format_duration_s(q.expected_hours * 3600)} with {sweep.max_parallel} trials at a time"
            + (f"; budget {format_usd(q.budget_usd)}" if q.budget_usd is not None else "")
        )
    if not q.feasible:
        out.print(f"[bold red]not feasible[/]: {q.reason}")
        raise typer.Exit(4)
