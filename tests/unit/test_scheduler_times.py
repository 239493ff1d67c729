"""Allocation times as arrays (``schedule.times``) equal the scalar ``cost.quote.allocation_times``.

Every row ``time_rows_many`` answers must be ``grid.time_row`` of the scalar allocation times bit for bit
(the predictions are those of ``predict`` one by one); a row that does not fit must be the scalar
``AllocationTimes`` itself (reason in words, step times, source); only a row without a memoised
prediction is left to the scalar path.
"""

from __future__ import annotations

import random
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard.catalog.pools import Pool
from trainyard.cost import model as cm
from trainyard.cost.quote import AllocationTimes, SpecFacts, allocation_times
from trainyard.schedule import CandidateCache
from trainyard.schedule.candidates import device_counts, eligibility, prefetch_predictions
from trainyard.schedule.grid import time_row
from trainyard.schedule.times import choose_intervals_s, time_rows_many
from trainyard.spec import spec_from_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_scheduler
import bench_scheduler_distinct

ACCELERATORS = ("a100-80gb", "t4", "h100", "tpu-v5e", "trn1", "mi300x", "l4", "v100")


@st.composite
def specs(draw: Any) -> Any:
    lo = draw(st.sampled_from([1, 1, 2, 4, 8]))
    doc: dict[str, Any] = {
        "name": "j",
        "model": {
            "architecture": "custom",
            # 400B fits almost nowhere: the rows that do not fit and their device-count search
            "params_b": draw(st.sampled_from([0.05, 0.7, 3.0, 13.0, 70.0, 400.0])),
        },
        "workload": {
            "seq_len": draw(st.sampled_from([512, 2048])),
            "global_batch": draw(st.sampled_from([1, 8, 64, 256])),
            "steps": draw(st.integers(1, 500_000)),
            "method": draw(st.sampled_from(["full", "lora"])),
        },
        "resources": {"min_devices": lo, "max_devices": draw(st.sampled_from([lo, 2 * lo, 16, 64]))},
        "objective": {},
    }
    if draw(st.booleans()):
        doc["checkpoint"] = {"interval": draw(st.sampled_from(["auto", "5m", "1h"]))}
        if draw(st.booleans()):
            doc["checkpoint"]["storage"] = draw(st.sampled_from(["s3://bucket/ckpt", "gs://b/c"]))
    if draw(st.booleans()):
        accs = draw(st.lists(st.sampled_from(ACCELERATORS), min_size=1, max_size=5, unique=True))
        doc["measured"] = {"step_time_s": {a: draw(st.sampled_from([0.01, 0.4, 3.0, 40.0])) for a in accs}}
    if draw(st.booleans()):
        doc["objective"]["deadline"] = draw(st.sampled_from(["2h", "48h"]))
    doc["objective"]["markets"] = draw(
        st.sampled_from([["spot", "on_demand", "reserved"], ["spot"], ["on_demand", "reserved"]])
    )
    return spec_from_dict(doc)


@st.composite
def pool_lists(draw: Any) -> list[Pool]:
    out = []
    for i in range(draw(st.integers(1, 6))):
        market = draw(st.sampled_from(["on_demand", "spot", "reserved"]))
        out.append(
            Pool(
                name=f"p{i}",
                accelerator=draw(st.sampled_from(ACCELERATORS)),
                devices_per_node=draw(st.sampled_from([1, 4, 8])),
                nodes=draw(st.sampled_from([1, 2, 4, 16])),
                available_devices=None,
                market=market,
                price_usd_per_device_hour=2.0,
                region="us-east-1",
                inter_node_gbps=draw(st.sampled_from([None, 25.0, 400.0])),
                interruption_rate_per_hour=(
                    draw(st.sampled_from([None, 0.0, 0.05, 0.5, 30.0])) if market == "spot" else None
                ),
                memory_per_device_gib=draw(st.sampled_from([None, None, 16.0])),
            )
        )
    return out


def _check(spec: Any, pools: list[Pool]) -> tuple[int, int]:
    """Compare every (pool, device count) of ``spec``; returns (rows answered, rows declined)."""
    cache = CandidateCache()
    screened = [(p, device_counts(spec, p, cache)) for p in pools if not eligibility(spec, p, cache)]
    prefetch_predictions(spec, [(p, c) for p, c in screened if c], cache)
    facts = SpecFacts.of(spec, None, float("inf"))
    keys, refs = [], []
    for pool, counts in screened:
        acc, pclass = cache.pool_class(pool)
        gk = cache.pool_topology(pool)[2]
        for d in counts:
            keys.append((acc, gk, pool.devices_per_node, pclass[4], d))
            # the reference: the scalar cost model on the packaged predictor, one prediction at a time
            refs.append(allocation_times(spec, pool, d, acc, facts))
    got = time_rows_many(spec, keys, cache.shape(spec), cache.predictions, facts.checkpoint_bytes)
    answered = rejected = 0
    for row, t in zip(got, refs, strict=True):
        assert row is not None  # every prediction was memoised
        if isinstance(row, AllocationTimes):
            rejected += 1
            assert t.reason and t.prediction is not None, t
            # the scalar path's own answer, reason in words included (the prediction is the memoised one)
            assert replace(row, prediction=None) == replace(t, prediction=None), (row, t)
            assert row.prediction.step_time_s == t.prediction.step_time_s
            assert row.prediction.fits == t.prediction.fits
        else:
            answered += 1
            assert not t.reason and t.prediction is not None, t
            assert row == time_row(t), (row, time_row(t))
    return answered, rejected


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs(), pools=pool_lists())
def test_time_rows_equal_the_scalar_allocation_times(spec: Any, pools: list[Pool]) -> None:
    _check(spec, pools)


def test_time_rows_equal_the_scalar_allocation_times_on_the_distinct_benchmark() -> None:
    """The distinct-shapes queue (custom models with measured step times on 5-10 accelerators, gangs of
    1-16, mixed markets and deadlines) over the benchmark's 100 pools: spot and on-demand rows, measured
    and scaled step times, and rows that do not fit."""
    rng = random.Random(5)
    pools = bench_scheduler.make_pools(100, rng)
    jobs = bench_scheduler_distinct.make_distinct_jobs(12, rng)
    big = spec_from_dict(
        {
            "name": "big",
            "model": {"architecture": "custom", "params_b": 300.0},
            "workload": {"seq_len": 2048, "global_batch": 16, "steps": 1000},
            "resources": {"min_devices": 2, "max_devices": 16},
            "measured": {"step_time_s": {"h100": 9.0, "a100-80gb": 14.0}},
        }
    )
    # no plan on the measured reference count (3 devices: data parallel 3 exceeds the batch of 2), so a
    # measured step time scales linearly to the counts that have one
    linear = spec_from_dict(
        {
            "name": "linear",
            "model": {"architecture": "custom", "params_b": 0.5},
            "workload": {"seq_len": 1024, "global_batch": 2, "steps": 1000},
            "resources": {"min_devices": 3, "max_devices": 8},
            "measured": {"step_time_s": {"h100": 2.0, "a100-80gb": 3.0, "l4": 5.0}},
        }
    )
    answered = rejected = 0
    for s in [*(j.spec for j in jobs), big, linear]:
        a, r = _check(s, pools)
        answered, rejected = answered + a, rejected + r
    assert answered > 300 and rejected > 20


def test_time_rows_without_memoised_predictions_are_declined() -> None:
    spec = bench_scheduler_distinct.make_distinct_jobs(1, random.Random(1))[0].spec
    pool = bench_scheduler.make_pools(4, random.Random(2))[0]
    cache = CandidateCache()
    acc, pclass = cache.pool_class(pool)
    key = (acc, cache.pool_topology(pool)[2], pool.devices_per_node, pclass[4], 1)
    assert time_rows_many(spec, [key], cache.shape(spec), {}, 1e9) == [None]


def test_intervals_equal_the_scalar_choice() -> None:
    rng = np.random.default_rng(7)
    stall = np.concatenate([[0.0, 1e-3, 1.0, 30.0, 600.0], 10 ** rng.uniform(-3, 3.5, 500)])
    rate = np.concatenate([[0.0, 1e-6, 1e-4, 1e-2, 1.0], 10 ** rng.uniform(-8, -1, 500)])
    rate[::7] = 0.0
    params = cm.DEFAULT_PARAMS
    for pinned in (None, 300.0):
        got = choose_intervals_s(pinned, stall, rate, params)
        pairs = zip(stall.tolist(), rate.tolist(), strict=True)
        want = [cm.choose_interval_s(pinned, c, r, params) for c, r in pairs]
        assert got.tolist() == want


def test_a_pool_list_changed_in_place_is_priced_on_its_new_pools() -> None:
    """The grid memoises its pools' accelerators, classes and prices per list of pools, object by object:
    a list changed in place (a pool repriced) is priced on the new pool."""
    from trainyard.schedule import SchedulerConfig
    from trainyard.schedule.grid import spec_candidates

    spec = bench_scheduler_distinct.make_distinct_jobs(3, random.Random(3))[2].spec
    pools = [p for p in bench_scheduler.make_pools(100, random.Random(4)) if p.price_usd_per_device_hour]
    cfg = SchedulerConfig()
    cache = CandidateCache()
    before = spec_candidates(spec, pools, cfg, cache)
    k = next(i for i, c in enumerate(before) if c.feasible)
    at = next(i for i, p in enumerate(pools) if p.name == before[k].pool)
    pools[at] = pools[at].model_copy(
        update={"price_usd_per_device_hour": pools[at].price_usd_per_device_hour * 2}
    )
    after = spec_candidates(spec, pools, cfg, cache)
    assert after[k].price_usd_per_hour == 2 * before[k].price_usd_per_hour
    assert after == spec_candidates(spec, pools, cfg, CandidateCache())
