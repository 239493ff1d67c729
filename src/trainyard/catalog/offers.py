"""Instance offers and prices from the packaged SkyPilot catalog snapshot (``data/instance_prices.csv``).

An *offer* is one way to rent accelerators: (cloud, region, zone, instance type, accelerator, devices
per instance) with an on-demand and (where recorded) a spot price per instance-hour. This module turns
the raw catalog rows into offers with canonical accelerator names, derives reserved prices from
documented commitment discounts, gives default spot interruption rates and notices, and turns offers
into :class:`~trainyard.catalog.pools.Pool` objects so the quote engine can price them.

Everything here is pure: the CSV is package data read through ``importlib.resources`` (no clock, no
network, no environment). ``data/SOURCES.md`` documents every decision taken below.
"""

from __future__ import annotations

import csv
import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from trainyard.catalog.names import ACCELERATOR_FAMILY, normalize_accelerator_name
from trainyard.catalog.pools import Pool
from trainyard.errors import PoolsFileError
from trainyard.spec.models import Market

# ---- reserved / committed-use prices ------------------------------------------------------------------
# Documented discounts for 1- and 3-year commitments on accelerator instances (AWS Savings Plans /
# Reserved Instances, GCP committed-use discounts, Azure reservations are all in the 30-40 % and 50-60 %
# ranges for GPU instances). Settings.reserved_discount_1y/3y carry the operator's values; pure code takes
# them as parameters with these defaults.
RESERVED_DISCOUNT_1Y = 0.35
RESERVED_DISCOUNT_3Y = 0.55


def reserved_price(on_demand_usd_per_hour: float, discount: float = RESERVED_DISCOUNT_1Y) -> float:
    """Effective hourly price under a commitment with ``discount`` (0..1) off on-demand."""
    if not 0.0 <= discount < 1.0:
        raise ValueError(f"reserved discount must be in [0, 1), got {discount}")
    return on_demand_usd_per_hour * (1.0 - discount)


# ---- spot interruption -------------------------------------------------------------------------------
# AWS Spot Advisor publishes a "frequency of interruption" band per instance type: the share of instances
# reclaimed over the trailing month. A literal reading as a constant hazard gives
# lambda = -ln(1 - p) / 730 h, i.e. 7e-5/h for "<5 %" and 5e-4/h for ">20 %". The measured AWS traces in
# the reference data (p3.2xlarge, a ">20 %" type, 2023: one preemption every 3.0-4.3 wall-clock hours in
# four AZs) are about 500x higher: the band averages over all sizes and regions and over instances that
# never run long. We therefore keep the bands for the *relative* risk and anchor the absolute scale on
# the measured trace: ">20 %" = 0.25 per hour, the others scaled by their literal hazard ratio.
SPOT_BANDS_MONTHLY: dict[str, float] = {
    "<5%": 0.05,
    "5-10%": 0.10,
    "10-15%": 0.15,
    "15-20%": 0.20,
    ">20%": 0.30,
}
SPOT_ANCHOR_BAND = ">20%"
SPOT_ANCHOR_RATE_PER_HOUR = 0.25  # trace_summary.csv: p3.2xlarge preemption traces, 0.23-0.34 per hour
HOURS_PER_MONTH = 730.0


def literal_band_rate_per_hour(band: str) -> float:
    """The Spot Advisor band read literally as a constant monthly hazard, per hour."""
    return -math.log(1.0 - SPOT_BANDS_MONTHLY[band]) / HOURS_PER_MONTH


def band_rate_per_hour(band: str, anchor_rate_per_hour: float = SPOT_ANCHOR_RATE_PER_HOUR) -> float:
    """Per-hour interruption rate used for a band: relative risk from the band, scale from the traces."""
    if band not in SPOT_BANDS_MONTHLY:
        raise ValueError(f"unknown spot band {band!r}; bands: {', '.join(SPOT_BANDS_MONTHLY)}")
    return (
        anchor_rate_per_hour * literal_band_rate_per_hour(band) / literal_band_rate_per_hour(SPOT_ANCHOR_BAND)
    )


# Default band per accelerator: high-end training GPUs (p3/p4d/p4de/p5/p5en and their GCP/Azure peers) are
# the scarcest spot capacity and sit in ">20 %" on the Spot Advisor; mid-range inference GPUs (g5 A10G,
# g6 L4) in "5-10 %"; g4dn T4 in "<5 %"; trn1 in "10-15 %". TPUs and non-AWS accelerators have no
# advisor: we use "10-15 %" (GCP spot TPUs are reclaimed regularly; the GCP c3 trace saw 3 preemptions in
# 45 h in one of four zones). Every pool can override with interruption_rate_per_hour.
DEFAULT_SPOT_BAND: dict[str, str] = {
    "a100-40gb": ">20%", "a100-80gb": ">20%", "h100": ">20%", "h200": ">20%", "v100": ">20%",
    "a10g": "5-10%", "l4": "5-10%", "p100": "5-10%", "k80": "5-10%", "t4": "<5%",
    "trn1": "10-15%", "trn2": "10-15%",
    "tpu-v4": "10-15%", "tpu-v5e": "10-15%", "tpu-v5p": "10-15%", "tpu-v6e": "10-15%",
    "mi250": "10-15%", "mi300x": "10-15%", "gaudi2": "10-15%", "cpu": "<5%",
}  # fmt: skip

# Notice before a spot VM is reclaimed: AWS two-minute interruption notice; GCP and Azure 30 s.
SPOT_NOTICE_S: dict[str, float] = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
DEFAULT_NOTICE_S = 30.0


def default_interruption_rate_per_hour(accelerator: str, market: Market | str) -> float:
    """Default preemption rate for a market: 0 for on-demand and reserved, the band rate for spot."""
    if Market(market) != Market.SPOT:
        return 0.0
    return band_rate_per_hour(DEFAULT_SPOT_BAND.get(accelerator, "10-15%"))


def default_notice_s(cloud: str | None) -> float:
    return SPOT_NOTICE_S.get((cloud or "").lower(), DEFAULT_NOTICE_S)


def pool_interruption_rate_per_hour(pool: Pool) -> float:
    """The pool's own rate when given, else the default for its accelerator and market."""
    if pool.interruption_rate_per_hour is not None:
        return pool.interruption_rate_per_hour
    return default_interruption_rate_per_hour(pool.accelerator, pool.market)


def pool_notice_s(pool: Pool) -> float:
    return pool.notice_s if pool.notice_s is not None else default_notice_s(pool.cloud)


# ---- offers ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Offer:
    cloud: str
    region: str
    zone: str | None
    instance_type: str
    accelerator: str  # canonical name
    devices_per_instance: int  # chips for TPU slices
    on_demand_usd_per_hour: float  # whole instance
    spot_usd_per_hour: float | None  # whole instance; None when the catalog records no spot price
    accelerator_memory_gib: float | None = None
    source_accelerator_name: str = ""
    host_estimated: bool = False  # GCP GPU rows without a host row: host VM price estimated (SOURCES.md)
    notes: tuple[str, ...] = ()

    @property
    def on_demand_usd_per_device_hour(self) -> float:
        return self.on_demand_usd_per_hour / self.devices_per_instance

    @property
    def spot_usd_per_device_hour(self) -> float | None:
        return None if self.spot_usd_per_hour is None else self.spot_usd_per_hour / self.devices_per_instance

    @property
    def spot_discount_recorded(self) -> bool:
        """False when spot is missing or costs at least on-demand (a catalog quirk, kept as recorded)."""
        return self.spot_usd_per_hour is not None and self.spot_usd_per_hour < self.on_demand_usd_per_hour

    def reserved_usd_per_hour(self, discount: float = RESERVED_DISCOUNT_1Y) -> float:
        return reserved_price(self.on_demand_usd_per_hour, discount)

    def price_usd_per_hour(
        self, market: Market | str, reserved_discount: float = RESERVED_DISCOUNT_1Y
    ) -> float | None:
        m = Market(market)
        if m == Market.ON_DEMAND:
            return self.on_demand_usd_per_hour
        if m == Market.RESERVED:
            return self.reserved_usd_per_hour(reserved_discount)
        return self.spot_usd_per_hour

    def to_dict(self) -> dict[str, Any]:
        return {
            "cloud": self.cloud,
            "region": self.region,
            "zone": self.zone,
            "instance_type": self.instance_type,
            "accelerator": self.accelerator,
            "devices_per_instance": self.devices_per_instance,
            "on_demand_usd_per_hour": self.on_demand_usd_per_hour,
            "spot_usd_per_hour": self.spot_usd_per_hour,
            "on_demand_usd_per_device_hour": self.on_demand_usd_per_device_hour,
            "spot_usd_per_device_hour": self.spot_usd_per_device_hour,
            "accelerator_memory_gib": self.accelerator_memory_gib,
            "host_estimated": self.host_estimated,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class SkippedRow:
    """A catalog row that did not become an offer, with the reason (shown by `catalog offers --skipped`)."""

    cloud: str
    region: str
    instance_type: str
    accelerator_name: str
    reason: str


# Catalog accelerator names that are *not* the canonical chip of the same spelling, or that trainyard has
# no hardware data for. 'A10' (Azure NV*ads_A10_v5) is the NVIDIA A10 (125 dense BF16 TFLOPS), not the
# AWS-only A10G (about 70): mapping one onto the other would mis-predict step times, so A10 rows are
# skipped until the accelerator table has an A10 entry.
_NOT_MODELLED = {
    "a10": "NVIDIA A10 is not an A10G and has no entry in the accelerator table",
    "b200": "no B200 entry in the accelerator table",
    "p4": "no P4 entry in the accelerator table (inference GPU)",
    "m60": "no M60 entry in the accelerator table (graphics GPU)",
    "radeon-mi25": "no MI25 entry in the accelerator table (graphics GPU)",
}

# GCP machine type -> (catalog accelerator name, count) for host rows, as SOURCES.md lists them.
_GCP_HOST_TYPES = re.compile(
    r"^(a2-highgpu|a2-megagpu|a2-ultragpu|a3-highgpu|a3-edgegpu|a3-megagpu|a3-ultragpu|a4-highgpu)-(\d+)g$"
)

# GCP GPUs that attach to general-purpose hosts whose prices are not in the snapshot. The host VM is
# estimated from public list prices (us-central1, 2025): N1 $0.0475 per vCPU-hour including its 3.75 GiB
# per vCPU (n1-standard-1 = $0.0475/h), with 4 vCPUs per T4 and 8 per V100/P100 (the shapes GCP
# recommends); G2 host share for L4 = g2-standard-4 ($0.7068/h) minus one L4 ($0.56004/h) = $0.1468 per
# L4. Spot hosts are discounted by the same ratio as the GPU's own spot price.
_GCP_ATTACHED_HOST: dict[str, tuple[str, float]] = {
    "T4": ("n1-standard-{v}", 4 * 0.0475),
    "V100": ("n1-standard-{v}", 8 * 0.0475),
    "P100": ("n1-standard-{v}", 8 * 0.0475),
    "L4": ("g2-standard-{v}", 0.1468),
}
_GCP_HOST_VCPUS = {"T4": 4, "V100": 8, "P100": 8, "L4": 4}
_G2_VCPUS_BY_L4 = {1: 4, 2: 24, 4: 48, 8: 96}

# TPU slice names count TensorCores on v2/v3/v4/v5p (2 per chip) and chips on v5e (v5litepod) and v6e.
_TPU_RE = re.compile(r"^tpu-(v\d+[a-z]*|v5litepod)-(\d+)$")
_TPU_CORES_PER_CHIP = {"v2": 2, "v3": 2, "v4": 2, "v5p": 2, "v5litepod": 1, "v6e": 1}

# Device memory where the catalog row has none: clouds' plain "V100" SKUs (GCP, Azure NCv3, AWS p3) carry the
# 16 GB part; the accelerator table's V100 row is the 32 GB variant.
_MEMORY_BY_SOURCE_NAME = {"V100": 16.0, "V100-32GB": 32.0}
# A pool states its own device memory only when it differs from the table by more than this share (the
# table mixes GB and GiB figures within a few percent; a 16 GB V100 against 32 GB is a different part).
_MEMORY_DIFFERENCE = 0.25

# Azure ND96isr_H100_v5 is listed with 12 GPUs; the real SKU carries 8 x H100 (Azure ND H100 v5 docs).
_COUNT_CORRECTIONS = {("azure", "Standard_ND96isr_H100_v5"): 8}


def tpu_slice_chips(name: str) -> tuple[str, int] | None:
    """('tpu-v4', chips) for a catalog TPU slice name such as 'tpu-v4-8' (4 chips); None if not a TPU."""
    m = _TPU_RE.match(name.strip().lower())
    if not m:
        return None
    gen, size = m.group(1), int(m.group(2))
    per_chip = _TPU_CORES_PER_CHIP.get(gen)
    if per_chip is None:
        return None
    chips = max(1, size // per_chip)
    canonical = "tpu-v5e" if gen == "v5litepod" else f"tpu-{gen}"
    return canonical, chips


def _float(v: str) -> float | None:
    v = v.strip()
    return float(v) if v else None


def _canonical(catalog_name: str) -> tuple[str | None, str]:
    key = re.sub(r"[\s_]+", "-", catalog_name.strip().lower())
    if key in _NOT_MODELLED:
        return None, _NOT_MODELLED[key]
    c = normalize_accelerator_name(catalog_name)
    if c is None:
        return None, f"accelerator {catalog_name!r} has no canonical name"
    return c, ""


@cache
def _load() -> tuple[tuple[Offer, ...], tuple[SkippedRow, ...]]:
    text = (
        resources.files("trainyard.catalog").joinpath("data/instance_prices.csv").read_text(encoding="utf-8")
    )
    rows = list(csv.DictReader(text.splitlines()))
    offers: list[Offer] = []
    skipped: list[SkippedRow] = []
    seen: set[tuple[str, ...]] = set()
    gcp_acc: dict[tuple[str, str, int], dict[str, str]] = {}
    gcp_hosts: list[dict[str, str]] = []

    def skip(row: dict[str, str], reason: str) -> None:
        skipped.append(
            SkippedRow(row["cloud"], row["region"], row["instance_type"], row["accelerator_name"], reason)
        )

    for row in rows:
        key = tuple(row[k] for k in ("cloud", "availability_zone", "instance_type", "accelerator_name",
                                     "accelerator_count", "price_component"))  # fmt: skip
        if key in seen:
            continue  # duplicate upstream rows (TPU v4)
        seen.add(key)
        cloud, component, acc_name = row["cloud"], row["price_component"], row["accelerator_name"]
        if cloud == "gcp" and component == "accelerator_only":
            gcp_acc[(row["availability_zone"], acc_name, int(row["accelerator_count"]))] = row
            continue
        if cloud == "gcp" and component == "host_vm_only":
            gcp_hosts.append(row)
            continue
        on_demand = _float(row["price_per_hour"])
        if on_demand is None or on_demand <= 0:
            skip(row, "no on-demand price")
            continue
        tpu = tpu_slice_chips(acc_name) if acc_name.lower().startswith("tpu-") else None
        if acc_name.lower().startswith("tpu-"):
            if tpu is None or tpu[0] not in ACCELERATOR_FAMILY:
                skip(row, f"TPU generation {acc_name!r} has no entry in the accelerator table")
                continue
            accelerator, devices = tpu
            instance_type = acc_name.lower()
        else:
            canonical, why = _canonical(acc_name)
            if canonical is None:
                skip(row, why)
                continue
            accelerator = canonical
            devices = int(float(row["accelerator_count"]))
            instance_type = row["instance_type"]
        notes: list[str] = []
        corrected = _COUNT_CORRECTIONS.get((cloud, instance_type))
        if corrected is not None and corrected != devices:
            notes.append(f"catalog lists {devices} devices; the SKU has {corrected}")
            devices = corrected
        if devices < 1:
            skip(row, "fractional accelerator")
            continue
        spot = _float(row["spot_price_per_hour"])
        if spot is not None and spot >= on_demand:
            notes.append("spot price recorded at or above on-demand")
        offers.append(
            Offer(
                cloud=cloud,
                region=row["region"],
                zone=row["availability_zone"] or None,
                instance_type=instance_type,
                accelerator=accelerator,
                devices_per_instance=devices,
                on_demand_usd_per_hour=on_demand,
                spot_usd_per_hour=spot,
                accelerator_memory_gib=_float(row["accelerator_memory_gib"])
                or _MEMORY_BY_SOURCE_NAME.get(acc_name),
                source_accelerator_name=acc_name,
                notes=tuple(notes),
            )
        )

    # GCP accelerator-optimised machine types: host row + accelerator-only row of the same zone.
    used_acc: set[tuple[str, str, int]] = set()
    for host in gcp_hosts:
        m = _GCP_HOST_TYPES.match(host["instance_type"])
        acc_name, count = host["accelerator_name"], int(host["accelerator_count"])
        key3 = (host["availability_zone"], acc_name, count)
        acc_row = gcp_acc.get(key3)
        if m is None or acc_row is None:
            skip(host, "GCP host row without a matching accelerator-only row")
            continue
        used_acc.add(key3)
        canonical, why = _canonical(acc_name)
        if canonical is None:
            skip(host, why)
            continue
        host_od, acc_od = _float(host["price_per_hour"]), _float(acc_row["price_per_hour"])
        if host_od is None or acc_od is None:
            skip(host, "no on-demand price")
            continue
        host_spot, acc_spot = _float(host["spot_price_per_hour"]), _float(acc_row["spot_price_per_hour"])
        spot = None if host_spot is None or acc_spot is None else host_spot + acc_spot
        on_demand = host_od + acc_od
        notes = []
        if spot is not None and spot >= on_demand:
            notes.append("spot price recorded at or above on-demand")
        offers.append(
            Offer(
                cloud="gcp",
                region=host["region"],
                zone=host["availability_zone"] or None,
                instance_type=host["instance_type"],
                accelerator=canonical,
                devices_per_instance=count,
                on_demand_usd_per_hour=on_demand,
                spot_usd_per_hour=spot,
                accelerator_memory_gib=_float(acc_row["accelerator_memory_gib"])
                or _MEMORY_BY_SOURCE_NAME.get(acc_name),
                source_accelerator_name=acc_name,
                notes=tuple(notes),
            )
        )

    # GCP GPUs on general-purpose hosts (T4, V100, P100, L4): estimated host price.
    for key3, acc_row in gcp_acc.items():
        if key3 in used_acc:
            continue
        acc_name, count = key3[1], key3[2]
        canonical, why = _canonical(acc_name)
        if canonical is None:
            skip(acc_row, why)
            continue
        if acc_name not in _GCP_ATTACHED_HOST:
            skip(acc_row, "GCP accelerator-only row without a host machine type")
            continue
        pattern, per_gpu = _GCP_ATTACHED_HOST[acc_name]
        acc_od = _float(acc_row["price_per_hour"])
        if acc_od is None or acc_od <= 0:
            skip(acc_row, "no on-demand price")
            continue
        vcpus = (
            _G2_VCPUS_BY_L4.get(count, 4 * count) if acc_name == "L4" else _GCP_HOST_VCPUS[acc_name] * count
        )
        host_od = per_gpu * count
        acc_spot = _float(acc_row["spot_price_per_hour"])
        spot = None if acc_spot is None else acc_spot + host_od * (acc_spot / acc_od)
        offers.append(
            Offer(
                cloud="gcp",
                region=acc_row["region"],
                zone=acc_row["availability_zone"] or None,
                instance_type=f"{pattern.format(v=vcpus)}+{count}x{acc_name}",
                accelerator=canonical,
                devices_per_instance=count,
                on_demand_usd_per_hour=acc_od + host_od,
                spot_usd_per_hour=spot,
                accelerator_memory_gib=_float(acc_row["accelerator_memory_gib"])
                or _MEMORY_BY_SOURCE_NAME.get(acc_name),
                source_accelerator_name=acc_name,
                host_estimated=True,
                notes=("host VM price estimated from public list prices",),
            )
        )
    offers.sort(key=lambda o: (o.accelerator, o.cloud, o.region, o.instance_type, o.zone or ""))
    return tuple(offers), tuple(skipped)


def load_offers() -> list[Offer]:
    """Every priced offer in the packaged catalog (one per zone where the catalog is per zone)."""
    return list(_load()[0])


def skipped_rows() -> list[SkippedRow]:
    return list(_load()[1])


def filter_offers(
    offers: Iterable[Offer],
    *,
    accelerator: str | None = None,
    cloud: str | None = None,
    region: str | None = None,
    instance_type: str | None = None,
    max_usd_per_device_hour: float | None = None,
) -> list[Offer]:
    """Offers matching every filter given (accelerator by name or family; region as a glob)."""
    from fnmatch import fnmatch

    out = []
    acc = accelerator.lower() if accelerator else None
    acc_canonical = normalize_accelerator_name(accelerator) if accelerator else None
    for o in offers:
        if acc and not (o.accelerator == acc_canonical or ACCELERATOR_FAMILY.get(o.accelerator) == acc):
            continue
        if cloud and o.cloud != cloud.lower():
            continue
        if region and not fnmatch(o.region, region):
            continue
        if instance_type and o.instance_type != instance_type:
            continue
        if max_usd_per_device_hour is not None and o.on_demand_usd_per_device_hour > max_usd_per_device_hour:
            continue
        out.append(o)
    return out


# ---- offers -> pools ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RegionalOffer:
    """An instance type in one region: zones merged (on-demand is uniform; spot is the zones' median)."""

    cloud: str
    region: str
    instance_type: str
    accelerator: str
    devices_per_instance: int
    on_demand_usd_per_hour: float
    spot_usd_per_hour: float | None
    zones: tuple[str, ...]
    accelerator_memory_gib: float | None = None


def regional_offers(offers: Sequence[Offer] | None = None) -> list[RegionalOffer]:
    """Merge zones of the same (cloud, region, instance type).

    On-demand prices are the same in every zone of a region (the highest is kept if they differ). The
    spot price is the median over zones whose spot price undercuts on-demand: a zone recording spot at or
    above on-demand (a catalog quirk) offers no discount and would never be chosen for spot.
    """
    groups: dict[tuple[str, str, str], list[Offer]] = {}
    for o in offers if offers is not None else load_offers():
        groups.setdefault((o.cloud, o.region, o.instance_type), []).append(o)
    out = []
    for (cloud, region, itype), group in groups.items():
        first = group[0]
        spots = [
            o.spot_usd_per_hour for o in group if o.spot_discount_recorded and o.spot_usd_per_hour is not None
        ]
        out.append(
            RegionalOffer(
                cloud=cloud,
                region=region,
                instance_type=itype,
                accelerator=first.accelerator,
                devices_per_instance=first.devices_per_instance,
                on_demand_usd_per_hour=max(o.on_demand_usd_per_hour for o in group),
                spot_usd_per_hour=statistics.median(spots) if spots else None,
                zones=tuple(sorted(o.zone for o in group if o.zone)),
                accelerator_memory_gib=first.accelerator_memory_gib,
            )
        )
    out.sort(key=lambda r: (r.accelerator, r.cloud, r.region, r.instance_type))
    return out


def pool_name(cloud: str, region: str, instance_type: str, market: Market | str) -> str:
    return f"{cloud}/{region}/{instance_type}/{Market(market).value}"


def offers_as_pools(
    offers: Sequence[Offer] | None = None,
    *,
    markets: Iterable[Market | str] = (Market.ON_DEMAND, Market.SPOT, Market.RESERVED),
    reserved_discount: float = RESERVED_DISCOUNT_1Y,
    max_devices_per_pool: int = 64,
    interruption_rate_per_hour: dict[str, float] | None = None,
) -> list[Pool]:
    """Catalog offers as pools named ``<cloud>/<region>/<instance>/<market>``, one per market offered.

    Capacity in the catalog is unknown: each pool gets enough whole instances for ``max_devices_per_pool``
    devices (at least one instance; a TPU slice is one indivisible instance). Spot pools exist only where
    the catalog records a spot discount. ``interruption_rate_per_hour`` overrides the spot default per
    accelerator name.
    """
    from trainyard.catalog.accelerators import load_accelerators

    table = load_accelerators()
    wanted = [Market(m) for m in markets]
    overrides = interruption_rate_per_hour or {}
    pools: list[Pool] = []
    for r in regional_offers(offers):
        nodes = max(1, max_devices_per_pool // r.devices_per_instance)
        memory = r.accelerator_memory_gib
        table_memory = table[r.accelerator].memory_gib if r.accelerator in table else None
        if (
            memory is None
            or table_memory is None
            or abs(memory - table_memory) <= _MEMORY_DIFFERENCE * table_memory
        ):
            memory = None
        for market in wanted:
            if market == Market.SPOT:
                if r.spot_usd_per_hour is None:
                    continue
                price = r.spot_usd_per_hour
                rate = overrides.get(r.accelerator, default_interruption_rate_per_hour(r.accelerator, market))
                notice: float | None = default_notice_s(r.cloud)
            elif market == Market.RESERVED:
                price, rate, notice = reserved_price(r.on_demand_usd_per_hour, reserved_discount), 0.0, None
            else:
                price, rate, notice = r.on_demand_usd_per_hour, 0.0, None
            pools.append(
                Pool(
                    name=pool_name(r.cloud, r.region, r.instance_type, market),
                    accelerator=r.accelerator,
                    devices_per_node=r.devices_per_instance,
                    nodes=nodes,
                    market=market,
                    price_usd_per_device_hour=price / r.devices_per_instance,
                    instance_type=r.instance_type,
                    cloud=r.cloud,
                    region=r.region,
                    interruption_rate_per_hour=rate,
                    notice_s=notice,
                    whole_nodes_only=True,
                    memory_per_device_gib=memory,
                )
            )
    return pools


@cache
def catalog_pools() -> tuple[Pool, ...]:
    """The packaged catalog as pools with default settings (cached; pools are immutable)."""
    return tuple(offers_as_pools())


def price_usd_per_device_hour_for(
    pool: Pool, *, reserved_discount: float = RESERVED_DISCOUNT_1Y, offers: Sequence[Offer] | None = None
) -> float:
    """The pool's own price, else the catalog's for its instance type, region and market."""
    if pool.price_usd_per_device_hour is not None:
        return pool.price_usd_per_device_hour
    where = f"pools[{pool.name}]"
    if not pool.instance_type:
        raise PoolsFileError(
            f"{where}.price_usd_per_device_hour: required when the pool has no instance_type",
            hint="Give price_usd_per_device_hour, or an instance_type from `trainyard catalog offers`.",
        )
    matches = [
        r
        for r in regional_offers(offers)
        if r.instance_type == pool.instance_type
        and r.region == pool.region
        and (pool.cloud is None or r.cloud == pool.cloud)
    ]
    if not matches:
        raise PoolsFileError(
            f"{where}.instance_type: {pool.instance_type!r} has no catalog price in region {pool.region!r}",
            hint="Give price_usd_per_device_hour, or pick an offer listed by `trainyard catalog offers`.",
        )
    r = matches[0]
    if r.accelerator != pool.accelerator:
        raise PoolsFileError(
            f"{where}.accelerator: {pool.accelerator!r} but {pool.instance_type!r} carries {r.accelerator!r}",
            hint="Make the pool's accelerator match its instance type.",
        )
    price = Offer(
        r.cloud, r.region, None, r.instance_type, r.accelerator, r.devices_per_instance,
        r.on_demand_usd_per_hour, r.spot_usd_per_hour,
    ).price_usd_per_hour(pool.market, reserved_discount)  # fmt: skip
    if price is None:
        raise PoolsFileError(
            f"{where}.market: the catalog records no spot discount for {pool.instance_type!r} "
            f"in {pool.region!r}",
            hint="Give price_usd_per_device_hour, or use market on_demand or reserved.",
        )
    return price / r.devices_per_instance


def with_catalog_price(pool: Pool, *, reserved_discount: float = RESERVED_DISCOUNT_1Y) -> Pool:
    """The pool with its price filled in from the catalog (unchanged when it has one)."""
    if pool.price_usd_per_device_hour is not None:
        return pool
    price = price_usd_per_device_hour_for(pool, reserved_discount=reserved_discount)
    return pool.model_copy(update={"price_usd_per_device_hour": price})


__all__ = [
    "DEFAULT_SPOT_BAND",
    "RESERVED_DISCOUNT_1Y",
    "RESERVED_DISCOUNT_3Y",
    "SPOT_BANDS_MONTHLY",
    "SPOT_NOTICE_S",
    "Offer",
    "RegionalOffer",
    "SkippedRow",
    "band_rate_per_hour",
    "catalog_pools",
    "default_interruption_rate_per_hour",
    "default_notice_s",
    "filter_offers",
    "literal_band_rate_per_hour",
    "load_offers",
    "offers_as_pools",
    "pool_interruption_rate_per_hour",
    "pool_name",
    "pool_notice_s",
    "price_usd_per_device_hour_for",
    "regional_offers",
    "reserved_price",
    "skipped_rows",
    "tpu_slice_chips",
    "with_catalog_price",
]
