"""`trainyard tenants create|list` (admin key) and `trainyard tenants keys list|revoke`."""

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


keys_app = typer.Typer(
    help="A tenant's API keys (an admin key, or a key of that tenant).", no_args_is_help=True
)
app.add_typer(keys_app, name="keys")


@keys_app.command("list")
@handle_errors
def list_keys(
    name: str = typer.Argument(..., help="Tenant name."),
    as_json: bool = typer.Option(False, "--json", help="Print {keys} as JSON."),
) -> None:
    """List a tenant's API keys: id, prefix, created, revoked (the keys themselves are never stored)."""
    with client() as c:
        doc = c.list_api_keys(name)
    if as_json:
        print_json(doc)
        return
    table = Table("ID", "KEY", "ADMIN", "CREATED", "REVOKED")
    for k in doc["keys"]:
        table.add_row(
            k["id"],
            f"ty_{k['prefix']}_…",
            "yes" if k["admin"] else "no",
            k.get("created_at") or "",
            "yes" if k["revoked"] else "no",
        )
    console.print(table)


@keys_app.command("revoke")
@handle_errors
def revoke_key(
    name: str = typer.Argument(..., help="Tenant name."),
    key_id: str = typer.Argument(..., help="Key id from `trainyard tenants keys list NAME`."),
    as_json: bool = typer.Option(False, "--json", help="Print the key document as JSON."),
) -> None:
    """Revoke an API key: requests with it answer 401 from now on."""
    with client() as c:
        doc = c.revoke_api_key(name, key_id)
    if as_json:
        print_json(doc)
        return
    console.print(f"key {doc['id']} (ty_{doc['prefix']}_…) of tenant [bold]{name}[/] revoked.")
