"""`trainyard catalog accelerators|offers`: the packaged hardware catalog as a table or JSON."""

from __future__ import annotations

from typing import Any

import typer

from trainyard.catalog.accelerators import load_accelerators
from trainyard.catalog.names import FAMILIES, normalize_accelerator_name
from trainyard.catalog.offers import (
    DEFAULT_SPOT_BAND,
    RESERVED_DISCOUNT_1Y,
    RESERVED_DISCOUNT_3Y,
    default_interruption_rate_per_hour,
    default_notice_s,
    filter_offers,
    load_offers,
    regional_offers,
    reserved_price,
    skipped_rows,
)
from trainyard.cli.common import WIDE_OPTION_HELP, Col, console, handle_errors, print_json, print_table
from trainyard.cost.money import format_usd
from trainyard.errors import UnknownAcceleratorError

app = typer.Typer(
    help="The packaged hardware catalog: accelerators and priced instance offers.", no_args_is_help=True
)

ATTRIBUTION = "Prices: SkyPilot catalog (skypilot-org/skypilot-catalog), 2025 snapshot; not live prices."


def _check_accelerator(name: str | None) -> None:
    if name and name.lower() not in FAMILIES and normalize_accelerator_name(name) is None:
        raise UnknownAcceleratorError(f"--accelerator: unknown accelerator or family {name!r}")


@app.command("accelerators")
@handle_errors
def accelerators(
    as_json: bool = typer.Option(False, "--json", help="Print {accelerators: [...]} as one JSON document."),
    family: str | None = typer.Option(None, "--family", help=f"Only this family: {', '.join(FAMILIES)}."),
    wide: bool = typer.Option(False, "--wide", "-w", help=WIDE_OPTION_HELP),
) -> None:
    """Accelerators: memory, bandwidth, peak throughput, software stack, compile needs, cheapest offers."""
    if family is not None and family.lower() not in FAMILIES:
        raise UnknownAcceleratorError(
            f"--family: {family!r} is not a family", hint=f"Families: {', '.join(FAMILIES)}."
        )
    offers = load_offers()
    rows: list[dict[str, Any]] = []
    for acc in sorted(load_accelerators().values(), key=lambda a: (a.family, a.name)):
        if family and acc.family != family.lower():
            continue
        mine = [o for o in offers if o.accelerator == acc.name]
        spot = [
            o.spot_usd_per_device_hour
            for o in mine
            if o.spot_discount_recorded and o.spot_usd_per_device_hour
        ]
        rows.append(
            {
                "name": acc.name,
                "vendor": acc.vendor,
                "family": acc.family,
                "memory_gib": acc.memory_gib,
                "mem_bw_gbs": acc.mem_bw_gbs,
                "peak_tflops": dict(acc.peak_tflops),
                "intra_node_gbs": acc.intra_node_gbs,
                "inter_node_gbps": acc.inter_node_gbps,
                "software_stack": acc.software_stack,
                "compile_required": acc.compile_required,
                "first_compile_s": acc.first_compile_s,
                "max_devices_per_node": acc.max_devices_per_node,
                "offers": len(mine),
                "min_on_demand_usd_per_device_hour": min(
                    (o.on_demand_usd_per_device_hour for o in mine), default=None
                ),
                "min_spot_usd_per_device_hour": min(spot, default=None),
                "spot_interruption_rate_per_hour": default_interruption_rate_per_hour(acc.name, "spot"),
                "spot_band": DEFAULT_SPOT_BAND.get(acc.name),
            }
        )
    if as_json:
        print_json({"accelerators": rows})
        return
    cols = (
        Col("name", key=True),
        Col("vendor", priority=3),
        Col("memory", justify="right"),
        Col("HBM GB/s", justify="right", priority=2),
        Col("bf16 TFLOP/s", justify="right", priority=1),
        Col("link GB/s", justify="right", priority=4),
        Col("compile", priority=3),
        Col("offers", justify="right", priority=4),
        Col("from $/dev-h", justify="right"),
        Col("spot from", justify="right", priority=1),
    )
    table_rows = []
    for r in rows:
        peak = r["peak_tflops"].get("bf16") or r["peak_tflops"].get("fp16") or r["peak_tflops"].get("fp32")
        table_rows.append(
            [
                r["name"],
                r["vendor"],
                f"{r['memory_gib']:g} GiB",
                f"{r['mem_bw_gbs']:,.0f}",
                f"{peak:g}" if peak else "-",
                f"{r['intra_node_gbs']:g}",
                f"{r['first_compile_s'] / 60:.0f} min" if r["compile_required"] else "-",
                str(r["offers"]),
                format_usd(r["min_on_demand_usd_per_device_hour"])
                if r["min_on_demand_usd_per_device_hour"]
                else "-",
                format_usd(r["min_spot_usd_per_device_hour"]) if r["min_spot_usd_per_device_hour"] else "-",
            ]
        )
    print_table(cols, table_rows, title="Accelerators", wide=wide)
    console.print(f"[dim]{ATTRIBUTION}[/]")


@app.command("offers")
@handle_errors
def offers(
    as_json: bool = typer.Option(False, "--json", help="Print {offers: [...]} as one JSON document."),
    accelerator: str | None = typer.Option(None, "--accelerator", "-a", help="Accelerator name or family."),
    cloud: str | None = typer.Option(None, "--cloud", help="aws, gcp or azure."),
    region: str | None = typer.Option(None, "--region", help="Region glob, e.g. 'us-*'."),
    instance_type: str | None = typer.Option(None, "--instance-type", help="Exact instance type."),
    max_price: float | None = typer.Option(
        None, "--max-usd-per-device-hour", help="Only offers at most this on-demand price per device-hour."
    ),
    zones: bool = typer.Option(False, "--zones", help="One row per zone instead of zones merged per region."),
    skipped: bool = typer.Option(
        False, "--skipped", help="List the catalog rows that are not offers, and why."
    ),
    limit: int = typer.Option(60, "--limit", min=1, help="Rows shown in the table (JSON has all)."),
    wide: bool = typer.Option(False, "--wide", "-w", help=WIDE_OPTION_HELP),
) -> None:
    """Priced instance offers (on-demand, spot, reserved), cheapest per device-hour first."""
    if skipped:
        rows = [s.__dict__ for s in skipped_rows()]
        if as_json:
            print_json({"skipped": rows})
            return
        skipped_cols = (
            Col("cloud"),
            Col("region", key=True),
            Col("instance_type", key=True),
            Col("accelerator", key=True),
            Col("reason"),
        )
        table_rows = [
            [r.cloud, r.region, r.instance_type or "-", r.accelerator_name, r.reason] for r in skipped_rows()
        ]
        print_table(skipped_cols, table_rows, title="Catalog rows not offered", wide=wide)
        return
    _check_accelerator(accelerator)
    picked = filter_offers(
        load_offers(),
        accelerator=accelerator,
        cloud=cloud,
        region=region,
        instance_type=instance_type,
        max_usd_per_device_hour=max_price,
    )
    docs: list[dict[str, Any]] = []
    if zones:
        for o in picked:
            d = o.to_dict()
            d["reserved_1y_usd_per_hour"] = o.reserved_usd_per_hour(RESERVED_DISCOUNT_1Y)
            d["reserved_3y_usd_per_hour"] = o.reserved_usd_per_hour(RESERVED_DISCOUNT_3Y)
            docs.append(d)
    else:
        for r in regional_offers(picked):
            docs.append(
                {
                    "cloud": r.cloud,
                    "region": r.region,
                    "instance_type": r.instance_type,
                    "accelerator": r.accelerator,
                    "devices_per_instance": r.devices_per_instance,
                    "on_demand_usd_per_hour": r.on_demand_usd_per_hour,
                    "spot_usd_per_hour": r.spot_usd_per_hour,
                    "reserved_1y_usd_per_hour": reserved_price(
                        r.on_demand_usd_per_hour, RESERVED_DISCOUNT_1Y
                    ),
                    "reserved_3y_usd_per_hour": reserved_price(
                        r.on_demand_usd_per_hour, RESERVED_DISCOUNT_3Y
                    ),
                    "on_demand_usd_per_device_hour": r.on_demand_usd_per_hour / r.devices_per_instance,
                    "spot_usd_per_device_hour": None
                    if r.spot_usd_per_hour is None
                    else r.spot_usd_per_hour / r.devices_per_instance,
                    "spot_interruption_rate_per_hour": default_interruption_rate_per_hour(
                        r.accelerator, "spot"
                    ),
                    "spot_notice_s": default_notice_s(r.cloud),
                    "zones": list(r.zones),
                }
            )
    docs.sort(key=lambda d: (d["on_demand_usd_per_device_hour"], d["accelerator"], d["cloud"], d["region"]))
    if as_json:
        print_json({"offers": docs})
        return
    cols = (
        Col("accelerator", key=True),
        Col("n", justify="right"),
        Col("cloud"),
        Col("zone" if zones else "region", key=True),
        Col("instance", key=True),
        Col("on-demand $/h", justify="right", priority=2),
        Col("spot $/h", justify="right", priority=2),
        Col("reserved 1y", justify="right", priority=3),
        Col("$/dev-h", justify="right"),
        Col("spot $/dev-h", justify="right", priority=1),
    )
    table_rows = []
    for d in docs[:limit]:
        table_rows.append(
            [
                d["accelerator"],
                str(d.get("devices_per_instance")),
                d["cloud"],
                (d.get("zone") or d["region"]) if zones else d["region"],
                d["instance_type"],
                format_usd(d["on_demand_usd_per_hour"]),
                format_usd(d["spot_usd_per_hour"]) if d["spot_usd_per_hour"] is not None else "-",
                format_usd(d["reserved_1y_usd_per_hour"]),
                format_usd(d["on_demand_usd_per_device_hour"]),
                format_usd(d["spot_usd_per_device_hour"])
                if d["spot_usd_per_device_hour"] is not None
                else "-",
            ]
        )
    title = f"Offers ({len(docs)}{', per zone' if zones else ', zones merged per region'})"
    print_table(cols, table_rows, title=title, wide=wide)
    console.print(f"[dim]{ATTRIBUTION} Spot: median over zones with a discount.[/]")
    if len(docs) > limit:
        console.print(
            f"[dim]{len(docs) - limit} more; filter with --accelerator/--cloud/--region or use --json[/]"
        )
