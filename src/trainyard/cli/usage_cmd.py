"""`trainyard usage` (grouped reports from the ledger, JSON or CSV), `usage invoice`, `usage reconcile`."""

from __future__ import annotations

import csv
import io
import sys

import typer
from rich.table import Table

from trainyard.cli._remote import client
from trainyard.cli.common import console, handle_errors, print_json

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
    table = Table(by.upper(), "USD", "DEVICE-H", "TOKENS", "REQUESTS", "ENTRIES")
    for r in doc["rows"]:
        table.add_row(
            r["group"],
            f"${r['usd']:,.4f}",
            f"{r['device_hours']:,.3f}",
            str(r["tokens"]),
            str(r["requests"]),
            str(r["entries"]),
        )
    console.print(table)
    console.print(f"total ${doc['total_usd']:,.4f}")


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
    table = Table("KIND", "ACCELERATOR", "MARKET", "QUANTITY", "UNIT", "UNIT PRICE", "USD")
    for line in doc["lines"]:
        table.add_row(
            line["kind"],
            line.get("accelerator") or "-",
            line.get("market") or "-",
            f"{line['quantity']:,.3f}",
            line["unit"],
            f"${line['unit_price_usd']:.8f}",
            f"${line['usd']:,.4f}",
        )
    console.print(f"invoice for [bold]{doc['tenant']}[/], {doc['month']}")
    console.print(table)
    console.print(f"total ${doc['total_usd']:,.2f}")


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
