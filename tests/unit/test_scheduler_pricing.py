"""The scheduler's pricing fast paths give the cost model's own numbers.

``price_option`` shares ``cost.quote.AllocationTimes`` between specs that differ only in length, budget,
deadline or device-hour limit and between pools that differ only in price, region, cloud, market or size;
``candidates_for`` fills the prediction memo with one ``predict_many`` call per accelerator and topology.
Each option must still equal ``cost.quote.option_for`` field for field, and each candidate the one built
from ``option_for``'s quote.
"""

from __future__ import annotations

import math
import random
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard.catalog.pools import Pool
from trainyard.cost.quote import (
    QuoteOption,
    candidate_device_counts,
    eligibility_reason,
    option_for,
    pool_accelerator,
    predict_kwargs,
    screen_option,
)
from trainyard.predict import predict
from trainyard.schedule import CandidateCache, SchedulerConfig
from trainyard.schedule.candidates import (
    base_key,
    candidates_for,
    pool_class_key,
    price_option,
    shape_key,
    to_candidate,
)
from trainyard.spec import spec_from_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_scheduler

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
    if draw(st.booleans()):
        doc["requirements"] = {"regions": ["us-*"]}
    doc["objective"] = {"markets": ["spot", "on_demand", "reserved"]}
    return doc


def _pool(
    name: str, accelerator: str, per_node: int, inter_node_gbps: float | None, rate: float | None, draw: Any
) -> Pool:
    market = draw(st.sampled_from(["on_demand", "spot", "reserved"]))
    return Pool(
        name=name,
        accelerator=accelerator,
        devices_per_node=per_node,
        nodes=draw(st.sampled_from([1, 2, 4])),
        market=market,
        price_usd_per_device_hour=draw(st.sampled_from([0.5, 2.0, 4.5])),
        region=draw(st.sampled_from(["us-east-1", "eu-west-1"])),
        cloud=draw(st.sampled_from(["aws", "gcp"])),
        inter_node_gbps=inter_node_gbps,
        interruption_rate_per_hour=rate if market == "spot" else None,
        notice_s=draw(st.sampled_from([None, 30.0])),
        whole_nodes_only=draw(st.booleans()),
    )


@st.composite
def pool_pairs(draw: Any) -> tuple[Pool, Pool]:
    """Two pools of one accelerator, node size and network: mostly of one class (the same interruption
    rate), differing in price, region, cloud, market, size, notice and shape rules."""
    accelerator = draw(st.sampled_from(ACCELERATORS))
    per_node = draw(st.sampled_from([1, 4, 8]))
    gbps = draw(st.sampled_from([None, 25.0, 400.0]))
    rate = draw(st.sampled_from([0.0, 0.05, 0.5, 30.0]))
    first = _pool("a", accelerator, per_node, gbps, rate, draw)
    second = _pool("b", accelerator, per_node, gbps, draw(st.sampled_from([rate, rate, 0.2])), draw)
    return first, second


def _with(doc: dict[str, Any], steps: int, budget: float | None, hours: float | None) -> Any:
    d = {**doc, "workload": {**doc["workload"], "steps": steps}, "resources": dict(doc["resources"])}
    d["objective"] = dict(doc["objective"])
    if budget is not None:
        d["objective"]["budget_usd"] = budget
    if hours is not None:
        d["resources"]["accelerator_hours"] = hours
    return spec_from_dict(d)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    doc=spec_docs(),
    pools=pool_pairs(),
    steps=st.integers(1, 2_000_000),
    budget=st.one_of(st.none(), st.sampled_from([1.0, 50.0, 5000.0])),
    hours=st.one_of(st.none(), st.sampled_from([1.0, 100.0])),
    deadline=st.one_of(st.none(), st.sampled_from(["2h", "48h"])),
    elapsed=st.one_of(st.just(0.0), st.floats(0.0, 0.99)),
)
def test_shared_allocation_times_give_option_for_quotes(
    doc: dict[str, Any],
    pools: tuple[Pool, Pool],
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
    a, b = pools
    cache = CandidateCache()
    counts = sorted(set(candidate_device_counts(first, a)[:3] + candidate_device_counts(first, b)[:3]))
    for devices in counts:
        # the first spec on the first pool fills the memo; the other spec on either pool reuses it
        assert price_option(first, a, devices, 0.0, cache) == option_for(
            first, a, devices, deadline_s=math.inf
        )
    shared = pool_class_key(a, pool_accelerator(a)) == pool_class_key(b, pool_accelerator(b))
    for p in (a, b):
        for devices in counts:
            n = len(cache.times)
            got = price_option(other, p, devices, elapsed, cache)
            assert got == option_for(other, p, devices, elapsed_fraction=elapsed, deadline_s=math.inf)
            primed = not isinstance(screen_option(first, a, devices, pool_accelerator(a)), QuoteOption)
            if shared and primed:
                assert len(cache.times) == n  # the times priced for the first spec on the first pool
    for devices in counts:  # memoised: the same object again
        assert price_option(other, b, devices, elapsed, cache) is price_option(
            other, b, devices, elapsed, cache
        )


def _bench_queue(n_jobs: int, seed: int) -> tuple[list[Any], list[Pool]]:
    rng = random.Random(seed)
    pools = bench_scheduler.make_pools(40, rng)
    specs = list({id(j.spec): j.spec for j in bench_scheduler.make_jobs(n_jobs, rng)}.values())
    measured = spec_from_dict(
        {
            "name": "measured",
            "model": {"n_layers": 24, "d_model": 2048, "n_heads": 16, "vocab_size": 32000},
            "workload": {"seq_len": 2048, "global_batch": 16, "steps": 5000},
            "resources": {"min_devices": 2, "max_devices": 16},
            "measured": {"step_time_s": {"h100": 0.8, "tpu-v5e": 1.9}},
        }
    )
    return [*specs, measured], pools


def _option_for_candidates(spec: Any, pools: list[Pool], progress: float, hook: Any = None) -> list[Any]:
    """The candidates as the plain cost model gives them: one ``option_for`` per pool and device count,
    predicting one ``predict`` at a time (through ``hook`` first when given)."""
    cfg = SchedulerConfig()
    out = []
    for p in pools:
        counts = candidate_device_counts(spec, p)
        if eligibility_reason(spec, p) or not counts:  # nothing priced: the pool's one "never" candidate
            out.extend(
                candidates_for(
                    job_id="j",
                    tenant="t",
                    spec=spec,
                    pools=[p],
                    now_s=0.0,
                    deadline_abs_s=None,
                    config=cfg,
                    cache=CandidateCache(),
                    elapsed_fraction=progress,
                )
            )
            continue

        def pf(s: Any, a: Any, n: int, p: Pool = p) -> Any:
            topology = predict_kwargs(p, a)
            return (hook(s, a, n, topology) if hook else None) or predict(s, a, n, **topology)

        for d in counts:
            q = option_for(spec, p, d, elapsed_fraction=progress, deadline_s=math.inf, predict_fn=pf)
            out.append(
                to_candidate(
                    job_id="j",
                    tenant="t",
                    spec=spec,
                    pool=p,
                    option=q,
                    now_s=0.0,
                    deadline_abs_s=None,
                    config=cfg,
                )
            )
    return out


def test_candidates_with_batched_predictions_equal_option_for_one_by_one() -> None:
    specs, pools = _bench_queue(300, 5)
    cache = CandidateCache()  # one cache for every spec and both progress values, as a round keeps it
    for progress in (0.0, 0.4):
        for s in specs:
            fast = candidates_for(
                job_id="j", tenant="t", spec=s, pools=pools, now_s=0.0, deadline_abs_s=None,
                config=SchedulerConfig(), cache=cache, elapsed_fraction=progress,
            )  # fmt: skip
            assert fast == _option_for_candidates(s, pools, progress)
            assert any(c.feasible for c in fast)
    # the batch did the predicting: one prediction per (shape, accelerator and memory, devices, topology),
    # one set of allocation times per (spec base, pool class, devices), both fewer than the options
    assert len(cache.predictions) < len(cache.times) < len(cache.options)


def _slower_nvidia(asked: list[tuple[Any, ...]]) -> Any:
    def hook(s: Any, accelerator: Any, devices: int, topology: Any) -> Any:
        asked.append(
            (shape_key(s), accelerator.name, accelerator.memory_gib, devices, sorted(topology.items()))
        )
        if accelerator.family != "nvidia":
            return None  # the packaged predictor answers
        p = predict(s, accelerator, devices, **topology)
        return replace(p, step_time_s=2 * p.step_time_s, step_time_p90_s=2 * p.step_time_p90_s)

    return hook


def test_batched_predictions_ask_the_calibration_hook_first() -> None:
    specs, pools = _bench_queue(60, 9)
    asked: list[tuple[Any, ...]] = []
    cache = CandidateCache(calibrated=_slower_nvidia(asked))
    for s in specs:
        fast = candidates_for(
            job_id="j", tenant="t", spec=s, pools=pools, now_s=0.0, deadline_abs_s=None,
            config=SchedulerConfig(), cache=cache,
        )  # fmt: skip
        assert fast == _option_for_candidates(s, pools, 0.0, hook=_slower_nvidia([]))
        plain = _option_for_candidates(s, pools, 0.0)
        if s.measured.step_time_s:
            continue  # a measured step time and the ratios scaled from it stay as measured
        nvidia = [i for i, c in enumerate(plain) if c.feasible and c.accelerator in ("h100", "a100-80gb")]
        assert nvidia and all(fast[i].step_time_s == 2 * plain[i].step_time_s for i in nvidia)
    # asked once per prediction, never again for a memoised one
    assert asked and len(asked) == len({repr(a) for a in asked})


def test_a_calibration_hook_that_rejects_a_count_gives_the_option_for_reason() -> None:
    specs, pools = _bench_queue(30, 4)

    def picky(s: Any, accelerator: Any, devices: int, topology: Any) -> Any:
        if accelerator.family == "google-tpu" and devices > 4:
            raise ValueError(f"no calibration for {devices} x {accelerator.name}")
        return None

    cache = CandidateCache(calibrated=picky)
    rejected = 0
    for s in specs:
        fast = candidates_for(
            job_id="j", tenant="t", spec=s, pools=pools, now_s=0.0, deadline_abs_s=None,
            config=SchedulerConfig(), cache=cache,
        )  # fmt: skip
        assert fast == _option_for_candidates(s, pools, 0.0, hook=picky)
        rejected += sum(
            c.reasons[:1] == (f"predictor: no calibration for {c.devices} x {c.accelerator}",) for c in fast
        )
    assert rejected > 0
