"""`trainyard tenants create|list` (admin key)."""

from __future__ import annotations

import typer
from rich.table import Table

from trainyard.cli._remote import client
from trainyard.cli.common import console, handle_errors, print_json

app = typer.Typer(help="Tenants and their API keys (needs an admin key).", no_args_is_help=True)


@app.command("create")
@handle_errors
def create(
    name: str = typer.Argument(..., help="Tenant name (lowercase letters, digits, dashes)."),
    admin: bool = typer.Option(False, "--admin", help="Give the new key admin rights."),
    max_queued_jobs: int = typer.Option(None, "--max-queued-jobs", min=1, help="Cap on unfinished jobs."),
    max_active_devices: int = typer.Option(
        None, "--max-active-devices", min=1, help="Cap on devices in use."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print {name, api_key} as JSON."),
) -> None:
    """Create a tenant; its API key is printed once and never stored in clear."""
    with client() as c:
        doc = c.create_tenant(
            name, admin=admin, max_queued_jobs=max_queued_jobs, max_active_devices=max_active_devices
        )
    if as_json:
        print_json({"name": doc["name"], "api_key": doc["api_key"], "id": doc["id"]})
        return
    console.print(f"tenant [bold]{doc['name']}[/] created. API key (shown once, store it now):")
    console.print(doc["api_key"], highlight=False, soft_wrap=True)


@app.command("list")
@handle_errors
def list_tenants(as_json: bool = typer.Option(False, "--json", help="Print {tenants} as JSON.")) -> None:
    """List tenants."""
    with client() as c:
        doc = c.list_tenants()
    if as_json:
        print_json(doc)
        return
    table = Table("NAME", "ID", "CREATED", "MAX QUEUED", "MAX DEVICES")
    for t in doc["tenants"]:
        table.add_row(
            t["name"],
            t["id"],
            t.get("created_at") or "",
            str(t.get("max_queued_jobs") or "-"),
            str(t.get("max_active_devices") or "-"),
        )
    console.print(table)
