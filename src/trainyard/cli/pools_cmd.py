"""`trainyard pools list|set|delete`: live capacity on a running platform."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from trainyard.cli._remote import client
from trainyard.cli.common import (
    WIDE_OPTION_HELP,
    Col,
    console,
    handle_errors,
    market,
    print_json,
    print_table,
    usd,
)
from trainyard.errors import InvalidInputError

app = typer.Typer(help="Live pools: capacity, prices, interruption rates.", no_args_is_help=True)


@app.command("list")
@handle_errors
def list_pools(
    wide: bool = typer.Option(False, "--wide", "-w", help=WIDE_OPTION_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print {pools} as JSON."),
) -> None:
    """List the live pools the scheduler places jobs on."""
    with client() as c:
        doc = c.list_pools()
    if as_json:
        print_json(doc)
        return
    cols = (
        Col("NAME", key=True),
        Col("ACCELERATOR", key=True),
        Col("DEVICES", justify="right"),
        Col("IN USE", justify="right", priority=3),
        Col("MARKET"),
        Col("$/DEVICE-H", justify="right"),
        Col("INTERRUPTS/H", justify="right", priority=2),
        Col("REGION", priority=1),
        Col("BACKEND", priority=4),
    )
    rows = []
    for p in doc["pools"]:
        total = p["nodes"] * p["devices_per_node"]
        avail = p.get("available_devices")
        price = p.get("price_usd_per_device_hour")
        rows.append(
            [
                p["name"],
                p["accelerator"],
                f"{avail if avail is not None else total}/{total}",
                str(p.get("devices_in_use", 0)),
                market(p["market"]),
                usd(price),
                str(p.get("interruption_rate_per_hour", "-")),
                p["region"],
                f"{p.get('backend', '-')}{'' if p.get('executable', True) else ' (planning only)'}",
            ]
        )
    print_table(cols, rows, wide=wide)


@app.command("set")
@handle_errors
def set_pool(
    name: str = typer.Argument(None, help="Pool to change (omit with --file)."),
    file: Path = typer.Option(
        None, "--file", "-f", help="A POOLS YAML file: create or replace every pool in it."
    ),
    available_devices: int = typer.Option(None, "--available-devices", min=0, help="Free capacity now."),
    nodes: int = typer.Option(None, "--nodes", min=1, help="Nodes in the pool."),
    price: float = typer.Option(None, "--price-usd-per-device-hour", min=0, help="Current price."),
    rate: float = typer.Option(None, "--interruption-rate-per-hour", min=0, help="Spot interruption rate."),
    notice_s: float = typer.Option(None, "--notice-s", min=0, help="Preemption notice in seconds."),
    as_json: bool = typer.Option(False, "--json", help="Print the resulting pool(s) as JSON."),
) -> None:
    """Change a live pool (admin key), or load pools from a POOLS file."""
    changes: dict[str, Any] = {
        k: v
        for k, v in {
            "available_devices": available_devices,
            "nodes": nodes,
            "price_usd_per_device_hour": price,
            "interruption_rate_per_hour": rate,
            "notice_s": notice_s,
        }.items()
        if v is not None
    }
    with client() as c:
        if file is not None:
            from trainyard.catalog.pools import load_pools

            if name is not None or changes:
                raise InvalidInputError("give either --file or a pool name with changes, not both")
            docs = [c.put_pool(p.model_dump(mode="json", exclude_none=True)) for p in load_pools(file)]
            out: Any = {"pools": docs}
        else:
            if name is None:
                raise InvalidInputError(
                    "name the pool to change, or pass --file POOLS.yaml",
                    hint="Example: trainyard pools set local-cpu --available-devices 1",
                )
            if not changes:
                raise InvalidInputError(
                    "nothing to change", hint="Pass --available-devices, --price-usd-per-device-hour, ..."
                )
            out = c.patch_pool(name, changes)
    if as_json:
        print_json(out)
        return
    for p in out.get("pools", [out]):
        console.print(f"pool [bold]{p['name']}[/] updated")


@app.command("delete")
@handle_errors
def delete_pool(
    name: str = typer.Argument(..., help="Pool name."),
    as_json: bool = typer.Option(False, "--json", help="Print {name, deleted} as JSON."),
) -> None:
    """Remove a live pool (admin key)."""
    with client() as c:
        c.delete_pool(name)
    if as_json:
        print_json({"name": name, "deleted": True})
        return
    console.print(f"pool {name} deleted")
