"""The vectorised candidate pricing (``schedule.grid``) equals the scalar reference.

The reference is the scalar path kept in ``schedule.candidates``: one ``price_option`` (``cost.quote.
option_for``'s own steps, which ``test_scheduler_pricing`` checks against ``option_for``) and one
``to_candidate`` per (pool, device count), then the job's objective. Rounds on both paths must decide
alike (``scheduler_paths.both_paths``; the other scheduler test modules run every round that way too).
"""

from __future__ import annotations

import math
import random
import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scheduler_paths import both_paths, decisions

from trainyard.catalog.pools import Pool
from trainyard.cost.model import poisson_quantile
from trainyard.predict import predict
from trainyard.schedule import CandidateCache, QueuedJob, RunningJob, SchedulerConfig, schedule_round
from trainyard.schedule.candidates import (
    candidates_for,
    device_counts,
    eligibility,
    prefetch_predictions_many,
)
from trainyard.schedule.grid import poisson_quantiles, spec_candidates
from trainyard.schedule.round import _objective_for_job
from trainyard.schedule.types import Candidate
from trainyard.spec import spec_from_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_scheduler
import bench_scheduler_distinct

ACCELERATORS = ("a100-80gb", "t4", "h100", "tpu-v5e", "trn1", "mi300x", "l4")


@st.composite
def specs(draw: Any) -> Any:
    lo = draw(st.sampled_from([1, 1, 2, 4, 8]))
    doc: dict[str, Any] = {
        "name": "j",
        "model": {"architecture": "custom", "params_b": draw(st.sampled_from([0.1, 0.7, 3.0, 13.0, 40.0]))},
        "workload": {
            "seq_len": draw(st.sampled_from([512, 2048])),
            "global_batch": draw(st.sampled_from([8, 64, 256])),
            "steps": draw(st.integers(1, 500_000)),
            "method": draw(st.sampled_from(["full", "lora"])),
        },
        "resources": {"min_devices": lo, "max_devices": draw(st.sampled_from([lo, 2 * lo, 16, 64]))},
        "objective": {},
    }
    if draw(st.booleans()):
        doc["checkpoint"] = {"interval": draw(st.sampled_from(["5m", "1h"]))}
        if draw(st.booleans()):
            doc["checkpoint"]["storage"] = "s3://bucket/ckpt"
    if draw(st.booleans()):
        accs = draw(st.lists(st.sampled_from(ACCELERATORS), min_size=1, max_size=4, unique=True))
        doc["measured"] = {"step_time_s": {a: draw(st.sampled_from([0.05, 0.4, 3.0])) for a in accs}}
    if draw(st.integers(0, 4)) == 0:
        doc["resources"]["min_interconnect_gbps"] = draw(st.sampled_from([50.0, 400.0]))
    if draw(st.booleans()):
        doc["resources"]["accelerator_hours"] = draw(st.sampled_from([1.0, 100.0, 10_000.0]))
    if draw(st.booleans()):
        doc["objective"]["budget_usd"] = draw(st.sampled_from([1.0, 50.0, 5000.0]))
    if draw(st.booleans()):
        doc["objective"]["minimize"] = "time"
    if draw(st.booleans()):
        doc["objective"]["deadline"] = draw(st.sampled_from(["2h", "48h"]))
    doc["objective"]["markets"] = draw(
        st.sampled_from([["spot", "on_demand", "reserved"], ["spot"], ["on_demand", "reserved"]])
    )
    if draw(st.integers(0, 4)) == 0:
        doc["requirements"] = {"regions": ["us-*"]}
    return spec_from_dict(doc)


@st.composite
def pool_lists(draw: Any) -> list[Pool]:
    out = []
    for i in range(draw(st.integers(1, 6))):
        market = draw(st.sampled_from(["on_demand", "spot", "reserved"]))
        nodes = draw(st.sampled_from([1, 2, 4, 16]))
        out.append(
            Pool(
                name=f"p{i}",
                accelerator=draw(st.sampled_from(ACCELERATORS)),
                devices_per_node=draw(st.sampled_from([1, 4, 8])),
                nodes=nodes,
                available_devices=None,
                market=market,
                price_usd_per_device_hour=draw(st.sampled_from([0.3, 2.0, 4.5])),
                region=draw(st.sampled_from(["us-east-1", "eu-west-1"])),
                cloud=draw(st.sampled_from(["aws", "gcp"])),
                inter_node_gbps=draw(st.sampled_from([None, 25.0, 400.0])),
                interruption_rate_per_hour=(
                    draw(st.sampled_from([None, 0.0, 0.05, 0.5, 30.0])) if market == "spot" else None
                ),
                whole_nodes_only=draw(st.booleans()),
            )
        )
    return out


def _reference(spec: Any, pools: list[Pool], cfg: SchedulerConfig, progress: float) -> list[Candidate]:
    """The per-spec candidates of a round on the scalar path (``round._spec_view``'s reference branch)."""
    raw = candidates_for(
        job_id="", tenant="", spec=spec, pools=pools, now_s=0.0, deadline_abs_s=None, config=cfg,
        cache=CandidateCache(), elapsed_fraction=progress,
    )  # fmt: skip
    return [_objective_for_job(c, spec.objective.minimize, cfg) for c in raw]


def _assert_same(got: list[Candidate], want: list[Candidate]) -> None:
    """Equal candidates, numbers within float tolerance (and the same strings, flags and counts)."""
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        for f in fields(Candidate):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if isinstance(y, float):
                assert math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-12), (f.name, a, b)
            else:
                assert x == y, (f.name, a, b)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=specs(),
    pools=pool_lists(),
    progress=st.one_of(st.just(0.0), st.floats(0.0, 0.99)),
    reserved_factor=st.sampled_from([0.0, 0.0, 0.5]),
    time_value=st.sampled_from([100.0, 7.5]),
)
def test_vectorised_pricing_equals_the_scalar_quotes(
    spec: Any, pools: list[Pool], progress: float, reserved_factor: float, time_value: float
) -> None:
    cfg = SchedulerConfig(reserved_cost_factor=reserved_factor, time_value_usd_per_hour=time_value)
    want = _reference(spec, pools, cfg, progress)
    got = spec_candidates(spec, pools, cfg, CandidateCache(), progress)
    _assert_same(got, want)
    # a cache filled by another spec's pricing (shared predictions and allocation times) changes nothing
    cache = CandidateCache()
    spec_candidates(spec.model_copy(update={"name": "other"}), pools, cfg, cache, 0.0)
    _assert_same(spec_candidates(spec, pools, cfg, cache, progress), want)


def test_vectorised_pricing_equals_the_scalar_quotes_on_the_benchmark_queues() -> None:
    rng = random.Random(21)
    pools = bench_scheduler.make_pools(100, rng)
    jobs = bench_scheduler_distinct.make_distinct_jobs(40, rng)
    shared = {id(j.spec): j.spec for j in bench_scheduler.make_jobs(200, random.Random(4))}
    cfg = SchedulerConfig()
    cache = CandidateCache()
    feasible = spot = 0
    for s in [*(j.spec for j in jobs), *shared.values()]:
        for progress in (0.0, 0.35):
            got = spec_candidates(s, pools, cfg, cache, progress)
            _assert_same(got, _reference(s, pools, cfg, progress))
            feasible += sum(c.feasible for c in got)
            spot += sum(c.feasible and c.market == "spot" for c in got)
    assert feasible > 1000 and spot > 300  # the grid was really priced, spot interruptions included


def test_poisson_quantiles_equal_the_scalar_quantile() -> None:
    rng = np.random.default_rng(3)
    means = np.concatenate(
        [[0.0, 1e-9, 0.1, 0.105, 1.0, 2.3, 499.9, 500.0, 500.1, 2e4], 10 ** rng.uniform(-4, 3.2, 400)]
    )
    for q in (0.5, 0.9, 0.99):
        got = poisson_quantiles(means, q)
        assert got.tolist() == [poisson_quantile(float(m), q) for m in means]


def _distinct_round(n_jobs: int, seed: int) -> tuple[list[QueuedJob], list[Pool], list[RunningJob]]:
    rng = random.Random(seed)
    pools = bench_scheduler.make_pools(100, rng)
    jobs = bench_scheduler_distinct.make_distinct_jobs(n_jobs, rng)
    # capacity for a fraction of the queue: some jobs wait, some take dearer pools
    pools = [
        p.model_copy(update={"available_devices": min(p.free_devices, p.devices_per_node)}) for p in pools
    ]
    running = [
        RunningJob(
            job_id=f"run-{i}",
            tenant=j.tenant,
            spec=j.spec,
            submit_s=-7200.0,
            pool=p.name,
            devices=d,
            market=p.market.value,
            placed_s=-7200.0,
            progress_fraction=0.3,
        )
        for i, (j, p, d) in enumerate(
            (j, p, d)
            for j in jobs[:30]
            for p in pools
            for d in [j.spec.resources.min_devices or 1]
            if p.market.value in [m.value for m in j.spec.objective.markets]
            and d <= p.devices_per_node
            and p.accelerator in j.spec.measured.step_time_s
        )
        if i < 4
    ]
    return jobs[4:], pools, running


def test_rounds_on_distinct_shapes_decide_alike_on_both_paths() -> None:
    """A sample of the distinct-shapes benchmark (every job its own model, measured step times, mixed
    markets, deadlines and budgets) with running jobs: cold and warm rounds on both paths."""
    jobs, pools, running = _distinct_round(90, 12)
    assert running
    cfg = SchedulerConfig(time_limit_s=5.0)  # room to prove optimality on a loaded machine: equal optima
    cache = CandidateCache()
    cold = both_paths(jobs, pools, running, 1800.0, cfg, cache=cache)
    warm = both_paths(jobs, pools, running, 1800.0, cfg, cache=cache)
    assert decisions(cold) == decisions(warm)
    assert len(cold.placements) > 20 and cold.unplaced
    # a later round on a cache the vectorised path filled, priced again on fresh caches both ways
    later = replace(cfg, vectorised_pricing=False)
    ref = schedule_round(jobs, pools, running, 5400.0, later, cache=CandidateCache())
    assert decisions(schedule_round(jobs, pools, running, 5400.0, cfg, cache=cache)) == decisions(ref)


def _assert_close(got: list[Candidate], want: list[Candidate], rel: float) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        for f in fields(Candidate):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if isinstance(y, float):
                assert math.isclose(x, y, rel_tol=rel, abs_tol=1e-12), (f.name, a, b)
            else:
                assert x == y, (f.name, a, b)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec_list=st.lists(specs(), min_size=1, max_size=4),
    pools=pool_lists(),
    progress=st.sampled_from([0.0, 0.4]),
)
def test_a_rounds_batch_predictions_price_and_decide_as_the_scalar_reference(
    spec_list: list[Any], pools: list[Pool], progress: float
) -> None:
    """The round's fast path (every spec's predictions from one batch pass per accelerator and topology,
    ``predict_grouped(lazy=True)``, then array pricing) gives the scalar reference's candidates (one
    ``predict`` per device count, one quote per option), its chosen plans, and the same decisions. Batch
    evaluation across specs may differ from one spec alone in the last bits (``test_predict_batch``), so
    numbers are compared within 1e-9."""
    cfg = SchedulerConfig()
    cache = CandidateCache()
    work = []
    for s in spec_list:
        counts = [(p, device_counts(s, p, cache)) for p in pools if not eligibility(s, p, cache)]
        work.append((s, [(p, c) for p, c in counts if c]))
    prefetch_predictions_many(work, cache)
    for s in spec_list:
        got = spec_candidates(s, pools, cfg, cache, progress, prefetched=True)
        _assert_close(got, _reference(s, pools, cfg, progress), 1e-9)
    # the chosen plans: each batch prediction, built in full when read, is the scalar predictor's
    for s, pools_counts in work:
        for p, counts in pools_counts:
            acc, topology, gk = cache.pool_topology(p)
            for d in counts:
                got_p = cache.predictions.get((cache.shape(s), gk[0], gk[1], d, *gk[2:]))
                if got_p is None:  # the batch refused the group: priced one by one above
                    continue
                want_p = predict(s, acc, d, **topology)
                assert got_p.plan == want_p.plan and got_p.fits == want_p.fits
                assert got_p.reason == want_p.reason and got_p.notes == want_p.notes
                assert math.isclose(got_p.memory_per_device_gib, want_p.memory_per_device_gib, rel_tol=1e-9)
    # a round decides alike on the batch path and on predictions made one by one (the calibration hook)
    jobs = [
        QueuedJob(job_id=f"j{i}", tenant=f"t{i % 2}", spec=s, submit_s=-600.0 * i)
        for i, s in enumerate(spec_list)
    ]

    def one_by_one(s: Any, acc: Any, d: int, topology: Any) -> Any:
        return predict(s, acc, d, **topology)

    fast = schedule_round(jobs, pools, now_s=0.0, config=cfg, cache=CandidateCache())
    ref = schedule_round(jobs, pools, now_s=0.0, config=cfg, cache=CandidateCache(calibrated=one_by_one))
    assert [(p.job_id, p.pool, p.devices) for p in fast.placements] == [
        (p.job_id, p.pool, p.devices) for p in ref.placements
    ]
    assert [u.job_id for u in fast.unplaced] == [u.job_id for u in ref.unplaced]
    assert math.isclose(fast.objective_usd, ref.objective_usd, rel_tol=1e-9, abs_tol=1e-9)
