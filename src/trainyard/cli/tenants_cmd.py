"""`trainyard tenants create|list|get|update` (admin key) and `trainyard tenants keys
list|create|rotate|revoke`."""

from __future__ import annotations

from typing import Any

import typer

from trainyard.cli._remote import client
from trainyard.cli.common import Col, console, handle_errors, print_json, print_table
from trainyard.errors import InvalidInputError

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
    cols = (
        Col("NAME", key=True),
        Col("ID", key=True),
        Col("CREATED", priority=1),
        Col("MAX QUEUED", justify="right", priority=2),
        Col("MAX DEVICES", justify="right", priority=2),
    )
    rows = [
        [
            t["name"],
            t["id"],
            str(t.get("created_at") or "")[:19].replace("T", " "),
            str(t.get("max_queued_jobs") or "-"),
            str(t.get("max_active_devices") or "-"),
        ]
        for t in doc["tenants"]
    ]
    print_table(cols, rows)


# option name -> field of PATCH /v1/tenants/{name}; `--unset FIELD` removes a limit
UPDATE_FIELDS = (
    "max_queued_jobs",
    "max_active_devices",
    "max_concurrent_jobs",
    "rate_limit_rps",
    "rate_limit_burst",
    "key_rate_limit_rps",
    "tokens_per_minute",
)


@app.command("update")
@handle_errors
def update(
    name: str = typer.Argument(..., help="Tenant name."),
    max_queued_jobs: int = typer.Option(None, "--max-queued-jobs", min=1, help="Cap on unfinished jobs."),
    max_active_devices: int = typer.Option(
        None, "--max-active-devices", min=1, help="Cap on devices held at once (checked at submission)."
    ),
    max_concurrent_jobs: int = typer.Option(
        None, "--max-concurrent-jobs", min=1, help="Cap on jobs starting or running at once."
    ),
    max_usd: float = typer.Option(
        None, "--max-usd", min=0, help="Hard monthly dollar budget (as `budgets set --hard`)."
    ),
    rate_limit_rps: float = typer.Option(
        None, "--rate-limit-rps", min=0.001, help="API requests/s, all keys."
    ),
    rate_limit_burst: float = typer.Option(None, "--rate-limit-burst", min=1, help="Bucket size (requests)."),
    key_rate_limit_rps: float = typer.Option(
        None, "--key-rate-limit-rps", min=0.001, help="API requests/s for each key."
    ),
    tokens_per_minute: int = typer.Option(
        None, "--tokens-per-minute", min=1, help="Inference tokens per minute."
    ),
    storage_root: list[str] = typer.Option(
        None,
        "--storage-root",
        help="A storage URL the tenant may use besides its namespace (repeatable; replaces the list).",
    ),
    clear_storage_roots: bool = typer.Option(
        False, "--clear-storage-roots", help="Take back every granted storage root."
    ),
    allow_user_code: bool = typer.Option(
        None,
        "--allow-user-code/--no-allow-user-code",
        help="Whether the tenant may run its own code (`entrypoint`), always inside the sandbox.",
    ),
    unset: list[str] = typer.Option(
        None, "--unset", help=f"Remove a limit (repeatable): {', '.join(UPDATE_FIELDS)}."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the tenant as JSON."),
) -> None:
    """Change a tenant's quotas, rate limits, dollar cap, storage roots and user code (admin key)."""
    values = {
        "max_queued_jobs": max_queued_jobs,
        "max_active_devices": max_active_devices,
        "max_concurrent_jobs": max_concurrent_jobs,
        "rate_limit_rps": rate_limit_rps,
        "rate_limit_burst": rate_limit_burst,
        "key_rate_limit_rps": key_rate_limit_rps,
        "tokens_per_minute": tokens_per_minute,
        "max_usd_per_month": max_usd,
    }
    changes: dict[str, Any] = {k: v for k, v in values.items() if v is not None}
    for field in unset or []:
        key = field.replace("-", "_").removeprefix("__")
        if key not in UPDATE_FIELDS:
            raise InvalidInputError(
                f"--unset {field}: no such limit",
                hint=f"Use one of {', '.join(UPDATE_FIELDS)}.",
                details={"errors": [{"field": "unset", "message": "unknown limit"}]},
            )
        changes[key] = None
    if clear_storage_roots:
        changes["storage_roots"] = []
    elif storage_root:
        changes["storage_roots"] = list(storage_root)
    if allow_user_code is not None:
        changes["allow_user_code"] = allow_user_code
    with client() as c:
        doc = c.update_tenant(name, changes)
    if as_json:
        print_json(doc)
        return
    console.print(f"tenant [bold]{doc['name']}[/] updated:")
    for k in (*UPDATE_FIELDS,):
        console.print(f"  {k}: {doc.get(k) if doc.get(k) is not None else '-'}")
    roots = ", ".join(doc.get("storage_roots") or []) or "-"
    console.print(f"  user code: {'allowed' if doc.get('allow_user_code') else 'not allowed'}")
    console.print(f"  storage: {doc.get('storage_url') or '-'} plus roots: {roots}", highlight=False)


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
    expiring = any(k.get("expires_at") for k in doc["keys"])
    cols = [Col("ID", key=True), Col("KEY", key=True), Col("ROLE"), Col("CREATED", priority=1)]
    if expiring:
        cols.append(Col("EXPIRES"))
    cols.append(Col("REVOKED"))
    rows = []
    for k in doc["keys"]:
        row = [
            k["id"],
            f"ty_{k['prefix']}_…",
            k.get("role") or ("admin" if k["admin"] else "member"),
            k.get("created_at") or "",
        ]
        if expiring:
            row.append(k.get("expires_at") or "-")
        rows.append([*row, "yes" if k["revoked"] else "no"])
    print_table(cols, rows)


@keys_app.command("create")
@handle_errors
def create_key(
    name: str = typer.Argument(..., help="Tenant name."),
    role: str = typer.Option("member", "--role", help="admin, member, or viewer (read-only)."),
    as_json: bool = typer.Option(False, "--json", help="Print the key document (with api_key) as JSON."),
) -> None:
    """Create an API key; it is printed once and never stored in clear."""
    with client() as c:
        doc = c.create_api_key(name, role=role)
    if as_json:
        print_json(doc)
        return
    console.print(f"{doc['role']} key {doc['id']} of tenant [bold]{name}[/] (shown once, store it now):")
    console.print(doc["api_key"], highlight=False, soft_wrap=True)


@keys_app.command("rotate")
@handle_errors
def rotate_key(
    name: str = typer.Argument(..., help="Tenant name."),
    key_id: str = typer.Argument(..., help="Key id from `trainyard tenants keys list NAME`."),
    overlap_s: float = typer.Option(3600.0, "--overlap-s", min=0, help="Seconds the old key keeps working."),
    as_json: bool = typer.Option(False, "--json", help="Print {new, old} as JSON."),
) -> None:
    """Replace a key with a new one of the same role; the old key works for --overlap-s more seconds."""
    with client() as c:
        doc = c.rotate_api_key(name, key_id, overlap_s=overlap_s)
    if as_json:
        print_json(doc)
        return
    console.print(
        f"new key {doc['new']['id']} (shown once, store it now); "
        f"{key_id} stops at {doc['old']['expires_at']}:"
    )
    console.print(doc["new"]["api_key"], highlight=False, soft_wrap=True)


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
