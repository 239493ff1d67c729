"""Catalog offers: normalisation of the packaged SkyPilot snapshot, quirks, reserved prices, spot defaults."""

from __future__ import annotations

import math

import pytest

from trainyard.catalog.offers import (
    SPOT_ANCHOR_RATE_PER_HOUR,
    band_rate_per_hour,
    catalog_pools,
    default_interruption_rate_per_hour,
    default_notice_s,
    filter_offers,
    literal_band_rate_per_hour,
    load_offers,
    offers_as_pools,
    pool_interruption_rate_per_hour,
    pool_notice_s,
    price_usd_per_device_hour_for,
    regional_offers,
    reserved_price,
    skipped_rows,
    tpu_slice_chips,
    with_catalog_price,
)
from trainyard.catalog.pools import Pool
from trainyard.errors import PoolsFileError


def _find(**kw: str):
    return [o for o in load_offers() if all(getattr(o, k) == v for k, v in kw.items())]


def test_gcp_host_plus_accelerator_rows_combine() -> None:
    offers = _find(cloud="gcp", region="us-central1", instance_type="a2-highgpu-1g")
    assert offers and {round(o.on_demand_usd_per_hour, 3) for o in offers} == {3.673}
    assert offers[0].accelerator == "a100-40gb" and offers[0].devices_per_instance == 1
    h200 = _find(cloud="gcp", instance_type="a3-ultragpu-8g", region="us-central1")
    assert h200 and h200[0].devices_per_instance == 8 and h200[0].accelerator == "h200"


def test_gcp_attached_gpus_get_an_estimated_host() -> None:
    t4 = [o for o in load_offers() if o.cloud == "gcp" and o.accelerator == "t4"]
    assert t4 and all(o.host_estimated for o in t4)
    one = next(o for o in t4 if o.devices_per_instance == 1 and o.region == "us-central1")
    assert one.on_demand_usd_per_hour == pytest.approx(0.35 + 4 * 0.0475)
    assert one.instance_type == "n1-standard-4+1xT4"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("tpu-v4-8", ("tpu-v4", 4)),
        ("tpu-v5p-128", ("tpu-v5p", 64)),
        ("tpu-v5litepod-16", ("tpu-v5e", 16)),
        ("tpu-v6e-8", ("tpu-v6e", 8)),
        ("tpu-v6e-1", ("tpu-v6e", 1)),
        ("a100", None),
    ],
)
def test_tpu_slices_count_chips(name: str, expected: tuple[str, int] | None) -> None:
    assert tpu_slice_chips(name) == expected


def test_tpu_offers_are_slices_and_deduplicated() -> None:
    v4 = _find(accelerator="tpu-v4", instance_type="tpu-v4-8")
    assert len(v4) == 1 and v4[0].devices_per_instance == 4
    assert v4[0].on_demand_usd_per_device_hour == pytest.approx(v4[0].on_demand_usd_per_hour / 4)
    keys = [(o.cloud, o.zone, o.instance_type) for o in load_offers()]
    assert len(keys) == len(set(keys))


def test_quirks_are_handled() -> None:
    nd = _find(cloud="azure", instance_type="Standard_ND96isr_H100_v5")
    assert nd and all(o.devices_per_instance == 8 for o in nd)
    assert any("12" in n for n in nd[0].notes)
    # spot == on-demand in some AWS AZs: kept as recorded, no spot discount there
    p5 = _find(cloud="aws", instance_type="p5.48xlarge", zone="use1-az1")
    assert p5 and p5[0].spot_usd_per_hour == p5[0].on_demand_usd_per_hour and not p5[0].spot_discount_recorded
    # the regional spot price is the median of zones that undercut on-demand (az1/az4 record 55.04)
    p5r = next(r for r in regional_offers() if r.instance_type == "p5.48xlarge" and r.region == "us-east-1")
    assert p5r.spot_usd_per_hour == pytest.approx((19.2531 + 21.1543) / 2)
    # spot > on-demand on the GPU component alone (GCP A100-80GB us-central1 1.964 > 1.8462): the whole
    # VM (host + GPU) still undercuts on-demand, so the combined offer keeps its spot price
    a2u = [r for r in regional_offers() if r.instance_type == "a2-ultragpu-1g" and r.region == "us-central1"]
    assert a2u and a2u[0].spot_usd_per_hour is not None
    assert a2u[0].spot_usd_per_hour < a2u[0].on_demand_usd_per_hour
    names = {p.name for p in catalog_pools()}
    # p5.4xlarge has no spot price at all
    assert "aws/us-east-1/p5.4xlarge/spot" not in names


def test_a10_is_not_a10g_and_unmodelled_rows_are_reported() -> None:
    assert not [o for o in load_offers() if o.source_accelerator_name == "A10"]
    reasons = {s.accelerator_name: s.reason for s in skipped_rows()}
    assert "not an A10G" in reasons["A10"]
    assert {"B200", "P4", "M60"} <= set(reasons)
    aws_a10g = _find(cloud="aws", instance_type="g5.16xlarge")
    assert aws_a10g and aws_a10g[0].accelerator == "a10g"


def test_canonical_names_only() -> None:
    from trainyard.catalog.names import ACCELERATOR_NAMES

    assert {o.accelerator for o in load_offers()} <= set(ACCELERATOR_NAMES)
    assert all(o.on_demand_usd_per_hour > 0 and o.devices_per_instance >= 1 for o in load_offers())


def test_reserved_prices_from_discounts() -> None:
    assert reserved_price(10.0) == pytest.approx(6.5)
    assert reserved_price(10.0, 0.55) == pytest.approx(4.5)
    with pytest.raises(ValueError):
        reserved_price(10.0, 1.0)
    pools = {p.name: p for p in offers_as_pools(reserved_discount=0.55)}
    od, rs = pools["aws/us-east-1/p4d.24xlarge/on_demand"], pools["aws/us-east-1/p4d.24xlarge/reserved"]
    assert rs.price_usd_per_device_hour == pytest.approx(od.price_usd_per_device_hour * 0.45)


def test_spot_bands_and_notices() -> None:
    rates = [band_rate_per_hour(b) for b in ("<5%", "5-10%", "10-15%", "15-20%", ">20%")]
    assert rates == sorted(rates) and rates[-1] == SPOT_ANCHOR_RATE_PER_HOUR
    assert literal_band_rate_per_hour(">20%") == pytest.approx(-math.log(0.7) / 730)
    # sanity: the anchor sits inside the measured V100 trace range (one preemption per 3.0-4.3 h)
    assert 1 / 4.33 <= SPOT_ANCHOR_RATE_PER_HOUR <= 1 / 2.96
    assert default_interruption_rate_per_hour("a100-80gb", "spot") == SPOT_ANCHOR_RATE_PER_HOUR
    assert default_interruption_rate_per_hour("t4", "spot") < default_interruption_rate_per_hour(
        "a10g", "spot"
    )
    assert default_interruption_rate_per_hour("h100", "on_demand") == 0.0
    assert (default_notice_s("aws"), default_notice_s("gcp"), default_notice_s("azure")) == (
        120.0,
        30.0,
        30.0,
    )
    p = Pool(
        name="x", accelerator="h100", devices_per_node=8, nodes=1, market="spot", region="r", cloud="gcp"
    )
    assert pool_interruption_rate_per_hour(p) == SPOT_ANCHOR_RATE_PER_HOUR and pool_notice_s(p) == 30.0
    q = p.model_copy(update={"interruption_rate_per_hour": 0.01, "notice_s": 5.0})
    assert pool_interruption_rate_per_hour(q) == 0.01 and pool_notice_s(q) == 5.0


def test_pool_price_from_catalog_by_instance_type() -> None:
    p = Pool(
        name="x",
        accelerator="a100-40gb",
        devices_per_node=8,
        nodes=2,
        market="on_demand",
        region="us-east-1",
        cloud="aws",
        instance_type="p4d.24xlarge",
    )
    assert price_usd_per_device_hour_for(p) == pytest.approx(21.957642 / 8)
    assert with_catalog_price(p).price_usd_per_device_hour == pytest.approx(21.957642 / 8)
    spot = p.model_copy(update={"market": "spot"})
    us_east = sorted(o.spot_usd_per_hour for o in _find(instance_type="p4d.24xlarge", region="us-east-1"))
    assert price_usd_per_device_hour_for(spot) == pytest.approx((us_east[1] + us_east[2]) / 2 / 8)
    with pytest.raises(PoolsFileError, match="instance_type"):
        price_usd_per_device_hour_for(p.model_copy(update={"instance_type": "nope.large"}))
    with pytest.raises(PoolsFileError, match="accelerator"):
        price_usd_per_device_hour_for(p.model_copy(update={"accelerator": "h100"}))
    with pytest.raises(PoolsFileError, match="price_usd_per_device_hour"):
        price_usd_per_device_hour_for(p.model_copy(update={"instance_type": None}))


def test_catalog_pools_are_whole_instances_with_unique_names() -> None:
    pools = catalog_pools()
    assert len({p.name for p in pools}) == len(pools)
    assert all(p.whole_nodes_only and p.price_usd_per_device_hour for p in pools)
    slices = [p for p in pools if p.accelerator == "tpu-v5e" and p.instance_type == "tpu-v5litepod-256"]
    assert slices and all(p.nodes == 1 and p.devices_per_node == 256 for p in slices)


def test_filters() -> None:
    offers = load_offers()
    assert {o.accelerator for o in filter_offers(offers, accelerator="google-tpu")} <= {
        "tpu-v4",
        "tpu-v5e",
        "tpu-v5p",
        "tpu-v6e",
    }
    assert {o.region for o in filter_offers(offers, region="us-*")} <= {
        r for r in {o.region for o in offers} if r.startswith("us-")
    }
    assert all(o.cloud == "azure" for o in filter_offers(offers, cloud="Azure"))
    assert all(
        o.on_demand_usd_per_device_hour <= 1.0 for o in filter_offers(offers, max_usd_per_device_hour=1.0)
    )
    assert filter_offers(offers, accelerator="A100") == filter_offers(offers, accelerator="a100-40gb")


def test_v100_pools_state_their_16gb_memory() -> None:
    from trainyard.cost.quote import quote
    from trainyard.spec import spec_from_dict

    pools = {p.name: p for p in catalog_pools()}
    assert pools["gcp/us-central1/n1-standard-8+1xV100/on_demand"].memory_per_device_gib == 16.0
    assert pools["azure/eastus/Standard_ND40rs_v2/on_demand"].memory_per_device_gib is None  # the 32 GB part
    assert pools["aws/us-east-1/p4d.24xlarge/on_demand"].memory_per_device_gib is None
    spec = spec_from_dict(
        {
            "name": "v",
            "model": {"architecture": "custom", "params_b": 0.5},
            "workload": {"seq_len": 512, "global_batch": 8, "steps": 10},
            "resources": {"min_memory_per_device_gib": 20},
            "requirements": {"allow": ["v100"]},
        }
    )
    by_pool = {o.pool: o for o in quote(spec)}
    assert "16 GiB" in by_pool["gcp/us-central1/n1-standard-8+1xV100/on_demand"].reason
    assert by_pool["azure/eastus/Standard_ND40rs_v2/on_demand"].feasible


def test_pools_file_priced_from_the_catalog(tmp_path) -> None:
    from trainyard.catalog.pools import load_pools
    from trainyard.cost.quote import quote
    from trainyard.spec import spec_from_dict

    f = tmp_path / "pools.yaml"
    f.write_text(
        "pools:\n"
        "- {name: p4d, accelerator: a100, devices_per_node: 8, nodes: 2, market: reserved, cloud: aws,\n"
        "   region: us-east-1, instance_type: p4d.24xlarge}\n"
    )
    spec = spec_from_dict(
        {"name": "x", "model": {"architecture": "custom", "params_b": 1.0},
         "workload": {"seq_len": 1024, "global_batch": 8, "steps": 100}}
    )  # fmt: skip
    opts = quote(spec, load_pools(f))
    eight = next(o for o in opts if o.devices == 8)
    assert eight.price_usd_per_hour == pytest.approx(21.957642 * 0.65)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("pools:\n- {name: p, accelerator: h100, devices_per_node: 8, nodes: 1, available_devices: 9, "
         "market: spot, region: r}\n", "available_devices"),
        ("pools:\n- {name: p, accelerator: h999, devices_per_node: 8, nodes: 1, market: spot, region: r}\n",
         "accelerator"),
        ("pools:\n- {name: p, accelerator: h100, devices_per_node: 0, nodes: 1, market: spot, region: r}\n",
         "devices_per_node"),
        ("pools: [\n", "malformed"),
    ],
)  # fmt: skip
def test_bad_pools_files(tmp_path, text: str, needle: str) -> None:
    from trainyard.catalog.pools import load_pools

    f = tmp_path / "pools.yaml"
    f.write_text(text)
    with pytest.raises(PoolsFileError) as exc:
        load_pools(f)
    assert needle in str(exc.value) and exc.value.exit_code == 2
