"""The scheduler's exact fast path: a quote rescaled to another length, budget or progress equals the
cost model's own quote (``cost.quote.option_for``) field for field."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard.catalog.pools import Pool
from trainyard.cost.quote import candidate_device_counts, option_for
from trainyard.schedule import CandidateCache
from trainyard.schedule.candidates import base_key, price_option, rescale_option
from trainyard.spec import spec_from_dict

ACCELERATORS = ("a100-80gb", "t4", "h100", "tpu-v5e", "trn1")


@st.composite
def spec_docs(draw: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "j",
        "model": {"architecture": "custom", "params_b": draw(st.sampled_from([0.5, 3.0, 13.0]))},
        "workload": {"seq_len": 2048, "global_batch": draw(st.sampled_from([8, 64])), "steps": 1000},
        "resources": {"min_devices": 1, "max_devices": draw(st.sampled_from([1, 8, 32]))},
    }
    if draw(st.booleans()):
        doc["checkpoint"] = {"interval": draw(st.sampled_from(["10m", "1h"]))}
    if draw(st.booleans()):
        doc["measured"] = {"step_time_s": {"a100-80gb": draw(st.sampled_from([0.5, 3.0]))}}
    if draw(st.booleans()):
        doc["resources"]["min_interconnect_gbps"] = draw(st.sampled_from([50.0, 400.0]))
    doc["objective"] = {"markets": ["spot", "on_demand", "reserved"]}
    return doc


@st.composite
def pools(draw: Any) -> Pool:
    market = draw(st.sampled_from(["on_demand", "spot", "reserved"]))
    extra: dict[str, Any] = {}
    if market == "spot":
        extra = {
            "interruption_rate_per_hour": draw(st.sampled_from([0.0, 0.05, 0.5, 30.0])),
            "notice_s": 30.0,
        }
    return Pool(
        name="p",
        accelerator=draw(st.sampled_from(ACCELERATORS)),
        devices_per_node=draw(st.sampled_from([1, 4, 8])),
        nodes=draw(st.sampled_from([1, 2, 4])),
        market=market,
        price_usd_per_device_hour=draw(st.sampled_from([0.5, 2.0, 4.5])),
        region="us-east-1",
        cloud="aws",
        inter_node_gbps=draw(st.sampled_from([None, 25.0, 400.0])),
        **extra,
    )


def _with(doc: dict[str, Any], steps: int, budget: float | None, hours: float | None) -> Any:
    d = {**doc, "workload": {**doc["workload"], "steps": steps}, "resources": dict(doc["resources"])}
    d["objective"] = dict(doc["objective"])
    if budget is not None:
        d["objective"]["budget_usd"] = budget
    if hours is not None:
        d["resources"]["accelerator_hours"] = hours
    return spec_from_dict(d)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    doc=spec_docs(),
    pool=pools(),
    steps=st.integers(1, 2_000_000),
    budget=st.one_of(st.none(), st.sampled_from([1.0, 50.0, 5000.0])),
    hours=st.one_of(st.none(), st.sampled_from([1.0, 100.0])),
    deadline=st.one_of(st.none(), st.sampled_from(["2h", "48h"])),
    elapsed=st.one_of(st.just(0.0), st.floats(0.0, 0.99)),
)
def test_rescaled_quote_equals_option_for(
    doc: dict[str, Any],
    pool: Pool,
    steps: int,
    budget: float | None,
    hours: float | None,
    deadline: str | None,
    elapsed: float,
) -> None:
    first = _with(doc, 1000, None, None)
    other = _with(doc, steps, budget, hours)
    if deadline is not None:
        other = other.model_copy(
            update={"objective": other.objective.model_copy(update={"deadline": deadline})}
        )
    assert base_key(first) == base_key(other)
    cache = CandidateCache()
    for devices in candidate_device_counts(first, pool)[:3]:
        base = price_option(first, pool, devices, 0.0, cache)  # the full quote, kept as the base
        want = option_for(other, pool, devices, elapsed_fraction=elapsed, deadline_s=math.inf)
        assert rescale_option(base, other, pool, elapsed, cache) == want
        assert price_option(other, pool, devices, elapsed, cache) == want  # through the cache
