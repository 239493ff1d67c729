"""`trainyard catalog` commands in-process (the console-script path is covered in tests/e2e)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from trainyard.cli.catalog_cmd import app

runner = CliRunner()


def test_offers_json_filters_and_merges_zones() -> None:
    r = runner.invoke(app, ["offers", "--json", "-a", "a100", "--cloud", "aws", "--region", "us-*"])
    assert r.exit_code == 0, r.output
    offers = json.loads(r.stdout)["offers"]
    assert offers and {o["instance_type"] for o in offers} == {"p4d.24xlarge"}
    assert {o["region"] for o in offers} == {"us-east-1", "us-west-2"}
    one = offers[0]
    assert one["devices_per_instance"] == 8 and len(one["zones"]) >= 4
    assert one["reserved_1y_usd_per_hour"] == one["on_demand_usd_per_hour"] * 0.65
    assert one["spot_notice_s"] == 120.0
    per_dev = [o["on_demand_usd_per_device_hour"] for o in offers]
    assert per_dev == sorted(per_dev)


def test_offers_per_zone_and_skipped() -> None:
    zones = json.loads(
        runner.invoke(app, ["offers", "--json", "--zones", "--instance-type", "p5.48xlarge"]).stdout
    )
    assert all(o["zone"] for o in zones["offers"]) and len(zones["offers"]) == 10
    skipped = json.loads(runner.invoke(app, ["offers", "--skipped", "--json"]).stdout)["skipped"]
    assert any(s["accelerator_name"] == "A10" for s in skipped)


def test_tables_are_readable() -> None:
    r = runner.invoke(app, ["offers", "-a", "google-tpu", "--limit", "5"])
    assert r.exit_code == 0 and "Offers" in r.output and "tpu-v" in r.output and "more;" in r.output
    r = runner.invoke(app, ["accelerators"])
    assert r.exit_code == 0 and "h100" in r.output and "SkyPilot catalog" in r.output


def test_bad_filters_exit_2() -> None:
    r = runner.invoke(app, ["offers", "-a", "a200"])
    assert r.exit_code == 2 and "unknown accelerator" in r.output
    r = runner.invoke(app, ["accelerators", "--family", "quantum"])
    assert r.exit_code == 2 and "--family" in r.output


def test_accelerators_json_contract() -> None:
    r = runner.invoke(app, ["accelerators", "--json"])
    assert r.exit_code == 0
    accs = {a["name"]: a for a in json.loads(r.stdout)["accelerators"]}
    assert {"a100-80gb", "h100", "tpu-v5e", "trn1", "cpu"} <= set(accs)
    h100 = accs["h100"]
    assert h100["vendor"] == "NVIDIA" and h100["memory_gib"] == 80 and h100["offers"] > 0
    assert accs["tpu-v5e"]["compile_required"] is True and accs["h100"]["compile_required"] is False
    assert h100["min_spot_usd_per_device_hour"] < h100["min_on_demand_usd_per_device_hour"]
    only_tpu = json.loads(runner.invoke(app, ["accelerators", "--json", "--family", "google-tpu"]).stdout)
    assert {a["family"] for a in only_tpu["accelerators"]} == {"google-tpu"}
