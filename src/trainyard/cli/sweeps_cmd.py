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
from trainyard.cli.common import WIDE_OPTION_HELP, console, handle_errors, print_json
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


# ---- sweeps on a running server -------------------------------------------------------------------
def _money(v: object) -> str:
    return format_usd(float(v)) if isinstance(v, int | float) else "-"


def _print_sweep(doc: dict[str, object]) -> None:
    from trainyard.cli.common import Col, print_table

    d: dict[str, object] = dict(doc)
    budget = d.get("budget_usd")
    console.print(
        f"[bold]{d['id']}[/] {d['name']}: {d['state']}"
        + (f" ({d['reason']})" if d.get("reason") else "")
        + f"; spent {_money(d.get('spent_usd'))}"
        + (f" of {_money(budget)}" if budget is not None else "")
    )
    quote = d.get("quote") or {}
    assert isinstance(quote, dict)
    expected, most = _money(quote.get("expected_cost_usd")), _money(quote.get("max_cost_usd"))
    console.print(f"quoted: expected {expected}, at most {most}")
    best = d.get("best_trial")
    if isinstance(best, dict):
        console.print(
            f"best: {best['name']} ({', '.join(_param(k, v) for k, v in best['parameters'].items())}) "
            f"value {best['value']:.6g}, model {d.get('model_version') or '-'}"
        )
    trials = d.get("trials")
    if not isinstance(trials, list):
        return
    cols = (
        Col("TRIAL", key=True),
        Col("PARAMETERS", key=True),
        Col("STATE"),
        Col("JOB", priority=2),
        Col("STEP", justify="right"),
        Col("RUNGS", priority=1),
        Col("COST", justify="right"),
        Col("REASON", priority=3),
    )
    rows = [
        [
            t["name"],
            ", ".join(_param(k, v) for k, v in t["parameters"].items()),
            t["state"],
            t.get("job_id"),
            t.get("last_step"),
            " ".join(f"{v:.4g}" for v in t["rungs"].values() if v is not None) or None,
            _money(t.get("cost_usd")),
            t.get("reason") or None,
        ]
        for t in trials
    ]
    print_table(cols, rows)


@app.command("create")
def create_command(
    sweep_path: Path = typer.Argument(..., metavar="SWEEP", help="Sweep file (kind: Sweep)."),
    wait: bool = typer.Option(False, "--wait", help="Wait until the sweep ends."),
    timeout_s: float = typer.Option(86400.0, "--timeout-s", help="Give up waiting after this long."),
    as_json: bool = typer.Option(False, "--json", help="Print the sweep document as JSON."),
) -> None:
    """Start a sweep on the server: quoted as a group, trials run as jobs, halved, one budget."""
    _create(sweep_path, wait, timeout_s, as_json)


@handle_errors
def _create(sweep_path: Path, wait: bool, timeout_s: float, as_json: bool) -> None:
    from trainyard.cli._remote import client

    with client() as c:
        doc = c.create_sweep(sweep_path)
        if wait:
            doc = c.wait_sweep(doc["id"], timeout_s=timeout_s)
    if as_json:
        print_json(doc)
        return
    _print_sweep(doc)


@app.command("get")
def get_command(
    sweep_id: str = typer.Argument(..., help="Sweep id (sweep-…)."),
    as_json: bool = typer.Option(False, "--json", help="Print the sweep document as JSON."),
) -> None:
    """Show one sweep with its trials."""
    _get(sweep_id, as_json)


@handle_errors
def _get(sweep_id: str, as_json: bool) -> None:
    from trainyard.cli._remote import client

    with client() as c:
        doc = c.get_sweep(sweep_id)
    if as_json:
        print_json(doc)
        return
    _print_sweep(doc)


@app.command("list")
def list_command(
    limit: int = typer.Option(100, "--limit", min=1, max=500, help="At most this many sweeps."),
    wide: bool = typer.Option(False, "--wide", "-w", help=WIDE_OPTION_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print {sweeps} as JSON."),
) -> None:
    """List sweeps, newest first."""
    _list(limit, wide, as_json)


@handle_errors
def _list(limit: int, wide: bool, as_json: bool) -> None:
    from trainyard.cli._remote import client
    from trainyard.cli.common import Col, print_table

    with client() as c:
        doc = c.list_sweeps(limit=limit)
    if as_json:
        print_json(doc)
        return
    cols = (
        Col("ID", key=True),
        Col("NAME", key=True),
        Col("STATE"),
        Col("TRIALS", priority=1),
        Col("SPENT", justify="right"),
        Col("BUDGET", justify="right", priority=2),
        Col("MODEL", priority=1),
    )
    rows = [
        [
            s["id"],
            s["name"],
            s["state"],
            " ".join(f"{k} {v}" for k, v in sorted(s["trial_counts"].items())),
            _money(s.get("spent_usd")),
            _money(s.get("budget_usd")),
            s.get("model_version"),
        ]
        for s in doc["sweeps"]
    ]
    print_table(cols, rows, wide=wide)


@app.command("cancel")
def cancel_command(
    sweep_id: str = typer.Argument(..., help="Sweep id (sweep-…)."),
    as_json: bool = typer.Option(False, "--json", help="Print the sweep document as JSON."),
) -> None:
    """Cancel a sweep: its running trials are cancelled, its waiting trials never start."""
    _cancel(sweep_id, as_json)


@handle_errors
def _cancel(sweep_id: str, as_json: bool) -> None:
    from trainyard.cli._remote import client

    with client() as c:
        doc = c.cancel_sweep(sweep_id)
    if as_json:
        print_json(doc)
        return
    _print_sweep(doc)
