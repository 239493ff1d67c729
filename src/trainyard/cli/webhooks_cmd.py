"""`trainyard webhooks list|create|delete|test|deliveries`: where the tenant's alerts are delivered, and
how the deliveries went."""

from __future__ import annotations

import typer

from trainyard.cli._remote import client
from trainyard.cli.common import Col, console, handle_errors, print_json, print_table

app = typer.Typer(help="Webhooks the tenant's alerts are delivered to.", no_args_is_help=True)


def _when(value: str | None) -> str:
    return str(value or "")[:19].replace("T", " ")


@app.command("list")
@handle_errors
def list_webhooks(as_json: bool = typer.Option(False, "--json", help="Print {webhooks} as JSON.")) -> None:
    """The tenant's webhooks (the signing secret is shown only when one is created)."""
    with client() as c:
        doc = c.list_webhooks()
    if as_json:
        print_json(doc)
        return
    cols = (Col("ID", key=True), Col("URL", key=True), Col("RULES", priority=1), Col("CREATED", priority=2))
    rows = [
        [w["id"], w["url"], ", ".join(w.get("rules") or []) or "all", _when(w.get("created_at"))]
        for w in doc["webhooks"]
    ]
    print_table(cols, rows)


@app.command("create")
@handle_errors
def create(
    url: str = typer.Argument(..., help="Where to POST the alerts (https://...)."),
    rules: list[str] = typer.Option(
        None, "--rule", help="Only this alert rule (repeat; default every rule)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print {id, url, rules, created_at, signing_secret}."),
) -> None:
    """Register a webhook; prints the tenant's signing secret (verify each delivery's signature with it)."""
    with client() as c:
        doc = c.create_webhook(url, rules=rules or None)
    if as_json:
        print_json(doc)
        return
    console.print(f"webhook [bold]{doc['id']}[/] → {doc['url']}")
    console.print('signing secret (HMAC-SHA256 of "<t>.<body>"; store it now):')
    console.print(doc.get("signing_secret") or "", highlight=False, soft_wrap=True)


@app.command("delete")
@handle_errors
def delete(
    webhook_id: str = typer.Argument(..., help="Webhook id (whk-...)."),
    as_json: bool = typer.Option(False, "--json", help="Print {id, deleted} as JSON."),
) -> None:
    """Remove a webhook; alerts are no longer delivered to it."""
    with client() as c:
        c.delete_webhook(webhook_id)
    if as_json:
        print_json({"id": webhook_id, "deleted": True})
    else:
        console.print(f"webhook {webhook_id} deleted")


@app.command("test")
@handle_errors
def test(
    webhook_id: str = typer.Argument(..., help="Webhook id (whk-...)."),
    as_json: bool = typer.Option(False, "--json", help="Print the test alert as JSON."),
) -> None:
    """Send a webhook_test alert to one webhook now (see `webhooks deliveries` for how it went)."""
    with client() as c:
        doc = c.test_webhook(webhook_id)
    if as_json:
        print_json(doc)
    else:
        console.print(f"test alert {doc.get('id')} queued for {webhook_id}")


@app.command("deliveries")
@handle_errors
def deliveries(
    webhook_id: str = typer.Argument(None, help="Only this webhook's (default: all of the tenant's)."),
    limit: int = typer.Option(50, "--limit", min=1, max=200, help="At most this many, newest first."),
    as_json: bool = typer.Option(False, "--json", help="Print {deliveries} as JSON."),
) -> None:
    """The latest deliveries: pending (with the next attempt), delivered, failed, or dead letters."""
    with client() as c:
        doc = c.list_webhook_deliveries(webhook_id, limit=limit)
    if as_json:
        print_json(doc)
        return
    cols = (
        Col("ID", key=True),
        Col("WEBHOOK", key=True),
        Col("RULE"),
        Col("STATE"),
        Col("ATTEMPTS", justify="right"),
        Col("LAST", priority=1),
        Col("CREATED", priority=2),
    )
    rows = [
        [
            d["id"],
            d["webhook_id"],
            d["rule"],
            d["state"] + (f" (next {_when(d['next_attempt_at'])})" if d.get("next_attempt_at") else ""),
            f"{d['attempts']}/{d['max_attempts']}",
            str(d.get("last_status_code") or d.get("last_error") or "-"),
            _when(d.get("created_at")),
        ]
        for d in doc["deliveries"]
    ]
    print_table(cols, rows)
