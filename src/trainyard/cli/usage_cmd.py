"""`trainyard usage` (grouped reports from the ledger, JSON or CSV), `usage invoice`, `usage reconcile`."""

from __future__ import annotations

import csv
import io
import sys

import typer

from trainyard.cli._remote import client
from trainyard.cli.common import Col, console, handle_errors, number, print_json, print_table, usd

app = typer.Typer(
    help="Usage from the ledger: reports, invoices.", no_args_is_help=False, invoke_without_command=True
)

CSV_COLUMNS = ("group", "usd", "device_hours", "tokens", "requests", "storage_gb_hours", "entries")


@app.callback(invoke_without_command=True)
@handle_errors
def usage(
    ctx: typer.Context,
    by: str = typer.Option(
        "tenant",
        "--by",
        help="tenant, tag:KEY, model, deployment, accelerator, market, pool, kind, job, day.",
    ),
    from_: str = typer.Option(None, "--from", help="Start date (YYYY-MM-DD, UTC) or ISO timestamp."),
    to: str = typer.Option(None, "--to", help="End date (inclusive day) or ISO timestamp (exclusive)."),
    tenant: str = typer.Option(None, "--tenant", help="Only this tenant (admin: any tenant)."),
    as_json: bool = typer.Option(False, "--json", help="Print {rows: [...]} as JSON."),
    as_csv: bool = typer.Option(False, "--csv", help="Print the rows as CSV."),
) -> None:
    """Dollars, device-hours, tokens and requests grouped by tenant, tag, model, accelerator or day."""
    if ctx.invoked_subcommand is not None:
        return
    with client() as c:
        doc = c.usage(by=by, from_=from_, to=to, tenant=tenant)
    if as_json:
        print_json(doc)
        return
    if as_csv:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(CSV_COLUMNS)
        for r in doc["rows"]:
            w.writerow([r.get(k) for k in CSV_COLUMNS])
        sys.stdout.write(buf.getvalue())
        return
    cols = (
        Col(by.upper(), key=True),
        Col("USD", justify="right"),
        Col("DEVICE-H", justify="right"),
        Col("TOKENS", justify="right", priority=1),
        Col("REQUESTS", justify="right", priority=2),
        Col("ENTRIES", justify="right", priority=3),
    )
    rows = [
        [
            r["group"],
            usd(r["usd"]),
            number(r["device_hours"], ",.3f"),
            number(r["tokens"]),
            number(r["requests"]),
            number(r["entries"]),
        ]
        for r in doc["rows"]
    ]
    print_table(cols, rows)
    console.print(f"total {usd(doc['total_usd'])}")


@app.command("invoice")
@handle_errors
def invoice(
    tenant: str = typer.Option(None, "--tenant", help="Tenant (default: the key's own)."),
    month: str = typer.Option(None, "--month", help="YYYY-MM (default: this month)."),
    as_json: bool = typer.Option(False, "--json", help="Print the invoice as JSON."),
) -> None:
    """A tenant's monthly invoice: one line per kind, accelerator, market and unit price."""
    with client() as c:
        doc = c.invoice(tenant=tenant, month=month)
    if as_json:
        print_json(doc)
        return
    from trainyard.cli.common import market

    cols = (
        Col("KIND", key=True),
        Col("ACCELERATOR"),
        Col("MARKET"),
        Col("QUANTITY", justify="right"),
        Col("UNIT", priority=1),
        Col("UNIT PRICE", justify="right", priority=2),
        Col("USD", justify="right"),
    )
    rows = [
        [
            line["kind"],
            line.get("accelerator") or "-",
            market(line.get("market")),
            number(line["quantity"], ",.3f"),
            line["unit"],
            usd(line["unit_price_usd"], 3),
            usd(line["usd"]),
        ]
        for line in doc["lines"]
    ]
    console.print(f"invoice for [bold]{doc['tenant']}[/], {doc['month']}")
    print_table(cols, rows)
    console.print(f"total {usd(doc['total_usd'])}")


@app.command("reconcile")
@handle_errors
def reconcile(as_json: bool = typer.Option(False, "--json", help="Print the report as JSON.")) -> None:
    """Check that the ledger and every job's cost (and every budget's spend) agree to the cent (admin);
    exits non-zero, naming each disagreement, when they do not."""
    with client() as c:
        doc = c.reconcile_usage()
    if as_json:
        print_json(doc)
        return
    console.print(f"ledger reconciles: {doc['jobs_checked']} jobs, {doc['budgets_checked']} budget periods")
