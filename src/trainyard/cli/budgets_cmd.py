"""`trainyard budgets set|list|get|events`: dollar budgets per tenant and per tag value."""

from __future__ import annotations

from typing import Any

import typer

from trainyard.cli._remote import client
from trainyard.cli.common import Col, handle_errors, print_json, print_table, usd

app = typer.Typer(help="Dollar budgets per tenant and tag: alerts, hard limits.", no_args_is_help=True)


COLUMNS = (
    Col("TENANT", key=True),
    Col("TAG", key=True),
    Col("PERIOD"),
    Col("BUDGET", justify="right"),
    Col("KIND", priority=2),
    Col("SPENT", justify="right"),
    Col("RESERVED", justify="right", priority=1),
    Col("USED", justify="right"),
)


def _row(b: dict[str, Any]) -> list[str]:
    return [
        b["tenant"],
        b.get("tag") or "-",
        f"{b['period']} {b['period_key']}",
        usd(b["usd"]),
        "hard" if b["hard"] else "soft",
        usd(b["spent_usd"]),
        usd(b["reserved_usd"]),
        f"{b['used_pct']:.1f}%",
    ]


@app.command("set")
@handle_errors
def set_budget(
    tenant: str = typer.Argument(..., help="Tenant name."),
    usd: float = typer.Option(..., "--usd", min=0, help="Dollars per period."),
    period: str = typer.Option("month", "--period", help="month or day."),
    hard: bool = typer.Option(
        False, "--hard/--soft", help="Hard: refuse submissions and stop running work at the limit."
    ),
    tag: str = typer.Option(None, "--tag", help="Budget of one tag value, e.g. team=support."),
    as_json: bool = typer.Option(False, "--json", help="Print the budget as JSON."),
) -> None:
    """Set (create or change) a budget (admin key). Alerts are recorded at 50/80/100 %."""
    with client() as c:
        doc = c.set_budget(tenant, usd=usd, period=period, hard=hard, tag=tag)
    if as_json:
        print_json(doc)
        return
    print_table(COLUMNS, [_row(doc)])


@app.command("list")
@handle_errors
def list_budgets(
    tenant: str = typer.Option(None, "--tenant", help="Only this tenant."),
    as_json: bool = typer.Option(False, "--json", help="Print {budgets} as JSON."),
) -> None:
    """Budgets with what their current period spent and holds reserved."""
    with client() as c:
        doc = c.list_budgets(tenant=tenant)
    if as_json:
        print_json(doc)
        return
    print_table(COLUMNS, [_row(b) for b in doc["budgets"]])


@app.command("get")
@handle_errors
def get_budget(
    tenant: str = typer.Argument(..., help="Tenant name."),
    tag: str = typer.Option(None, "--tag", help="The tag value's budget, e.g. team=support."),
    period: str = typer.Option("month", "--period", help="month or day."),
    as_json: bool = typer.Option(False, "--json", help="Print the budget as JSON."),
) -> None:
    """One budget."""
    with client() as c:
        doc = c.get_budget(tenant, tag=tag, period=period)
    if as_json:
        print_json(doc)
        return
    print_table(COLUMNS, [_row(doc)])


@app.command("events")
@handle_errors
def events(
    tenant: str = typer.Argument(..., help="Tenant name."),
    as_json: bool = typer.Option(False, "--json", help="Print {events} as JSON."),
) -> None:
    """Budget alerts (50/80/100 %), stops at hard limits and resumes."""
    with client() as c:
        doc = c.budget_events(tenant)
    if as_json:
        print_json(doc)
        return
    rows = []
    for e in doc["events"]:
        d = e["data"]
        detail = ", ".join(f"{k}={v}" for k, v in d.items() if k not in ("tenant",))
        rows.append([e["time"] or "", e["kind"], detail])
    print_table((Col("TIME"), Col("KIND", key=True), Col("DETAILS")), rows)
