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
import pytest
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
from trainyard.schedule.grid import (
    CandidateGrid,
    Rows,
    _market,
    _never_memo,
    poisson_quantiles,
    pool_markets,
    spec_candidates,
    spec_grid,
)
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
        [[0.0, 1e-9, 0.1, 0.105, 1.0, 2.3, 499.9, 500.0, 500.1, 500.71, 2e4], 10 ** rng.uniform(-4, 3.2, 400)]
    )
    for q in (0.5, 0.9, 0.99):
        got = poisson_quantiles(means, q).tolist()
        assert got == [poisson_quantile(float(m), q) for m in means]
        assert all(type(k) is int for k in got)  # counts, as the scalar quantile gives them
    # a first term exactly at q is enough: P(N = 0) = 0.5 at mean ln 2 gives the median 0
    assert (
        poisson_quantiles(np.array([math.log(2)]), 0.5).tolist()
        == [poisson_quantile(math.log(2), 0.5)]
        == [0]
    )
    # a later running sum exactly at q is enough too: P(N <= 1) at mean 1 is 2 / e, the median there is 1
    q1 = math.exp(-1.0) + math.exp(-1.0)
    assert poisson_quantiles(np.array([1.0]), q1).tolist() == [poisson_quantile(1.0, q1)] == [1]
    # just above 500 the normal approximation is the scalar's answer, not the exact sum's (553 at 0.99)
    assert poisson_quantiles(np.array([500.71]), 0.99).tolist() == [poisson_quantile(500.71, 0.99)] == [554]


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


# --- the grid as a data structure: its columns, its rows, repricing, rows priced one by one -------------


def _grid_spec(**extra: Any) -> Any:
    doc: dict[str, Any] = {
        "name": "g",
        "model": {"architecture": "custom", "params_b": 13.0},
        "workload": {"seq_len": 2048, "global_batch": 64, "steps": 20_000, "method": "full"},
        "resources": {"min_devices": 1, "max_devices": 16},
        "objective": {"markets": ["spot", "on_demand", "reserved"]},
    }
    for k, v in extra.items():
        doc[k] = {**doc.get(k, {}), **v}
    return spec_from_dict(doc)


def _grid_pools() -> list[Pool]:
    """Pools with every kind of row: feasible on each market, rows that do not fit in memory (t4), rows
    spanning nodes, a pool priced at zero and one of another accelerator family (Trainium)."""

    def pool(name: str, acc: str, market: str, price: float, **kw: Any) -> Pool:
        return Pool(
            name=name, accelerator=acc, devices_per_node=kw.pop("dpn", 8), nodes=kw.pop("nodes", 2),
            available_devices=None, market=market, price_usd_per_device_hour=price, region="us-east-1",
            cloud="aws", **kw,
        )  # fmt: skip

    return [
        pool("od-a100", "a100-80gb", "on_demand", 2.0, inter_node_gbps=400.0),
        pool("spot-h100", "h100", "spot", 1.5, interruption_rate_per_hour=0.05, inter_node_gbps=400.0),
        pool("res-a100", "a100-80gb", "reserved", 1.2),
        pool("od-t4", "t4", "on_demand", 0.3, dpn=4),
        pool("free-l4", "l4", "on_demand", 0.0, dpn=4, nodes=1),
        pool("od-trn1", "trn1", "on_demand", 1.0, dpn=16, nodes=1),
    ]


def test_a_grids_columns_hold_its_feasible_candidates_and_its_pool_index_points_into_its_pools() -> None:
    """The documented layout: ``pool`` indexes ``pools``, and for every feasible row the numeric columns are
    the row's candidate, whichever path made it (arrays, the scalar path for an interconnect spec, or a
    list of candidates through ``CandidateGrid.of``)."""
    pools = _grid_pools()
    cfg = SchedulerConfig(reserved_cost_factor=0.5)
    cache = CandidateCache()
    plain = _grid_spec()
    wired = _grid_spec(resources={"min_interconnect_gbps": 100.0})  # priced the scalar way, row by row
    markets = pool_markets(pools, cache)
    grids = [spec_grid(plain, pools, cfg, cache), spec_grid(wired, pools, cfg, cache)]
    grids.append(CandidateGrid.of(spec_candidates(plain, pools, cfg, CandidateCache()), pools, markets))
    for g in grids:
        cands = g.candidates()
        assert g.n == len(cands) and any(c.feasible for c in cands) and not all(c.feasible for c in cands)
        assert g.pools is pools
        for i, c in enumerate(cands):
            assert g.pools[int(g.pool[i])].name == c.pool
            assert bool(g.feasible[i]) == c.feasible
            if not c.feasible:
                continue
            assert (int(g.devices[i]), int(g.nodes[i]), int(g.capacity[i])) == (
                c.devices, c.nodes, c.capacity_devices,
            )  # fmt: skip
            assert [float(g.cost[i]), float(g.hours[i]), float(g.p90[i]), float(g.finish[i])] == [
                c.expected_cost_usd, c.expected_hours, c.expected_hours_p90, c.finish_s,
            ]  # fmt: skip
            assert [float(g.step[i]), float(g.price_h[i]), float(g.interval[i]), float(g.objective[i])] == [
                c.step_time_s, c.price_usd_per_hour, c.checkpoint_interval_s, c.objective_usd,
            ]  # fmt: skip
    # the scalar path's rows went into the columns too (interconnect: every feasible row is scalar)
    assert any(grids[1].feasible) and all(isinstance(m, Candidate) for m in grids[1].made)


def _repriced(pools: list[Pool]) -> tuple[list[Pool], list[int]]:
    new = list(pools)
    new[1] = pools[1].model_copy(update={"price_usd_per_device_hour": 9.0})
    new[3] = pools[3].model_copy(update={"price_usd_per_device_hour": 0.05})
    return new, [1, 3]


def test_a_repriced_grid_is_the_grid_priced_from_scratch_on_the_new_prices() -> None:
    """``with_pools_repriced`` takes the moved pools' rows from their own grid and keeps the others: row
    for row (feasible, not fitting in memory, never usable) it equals a grid priced afresh on the new
    pools, for a grid of arrays and for one made from a list of candidates."""
    pools = _grid_pools()
    new, changed = _repriced(pools)
    cfg = SchedulerConfig()
    for spec in (_grid_spec(), _grid_spec(objective={"markets": ["on_demand"], "minimize": "time"})):
        cache = CandidateCache()
        want = spec_candidates(spec, new, cfg, CandidateCache())
        assert any(c.feasible for c in want) and any(not c.feasible for c in want)
        sub = spec_grid(
            spec,
            [new[i] for i in changed],
            cfg,
            cache,
            markets=pool_markets([new[i] for i in changed], cache),
        )
        olds = [
            spec_grid(spec, pools, cfg, cache),
            CandidateGrid.of(spec_candidates(spec, pools, cfg, cache), pools, pool_markets(pools, cache)),
        ]
        for old in olds:
            before = old.candidates()
            got = old.with_pools_repriced(new, changed, sub)
            assert got.pools is new and got.n == old.n
            _assert_same(got.candidates(), want)
            fresh = spec_grid(spec, new, cfg, CandidateCache())
            for name in ("pool", "feasible", "devices", "nodes", "capacity", "cost", "hours", "p90", "step",
                         "price_h", "interval", "finish", "objective"):  # fmt: skip
                a, b = getattr(got, name), getattr(fresh, name)
                f = fresh.feasible
                assert np.allclose(a[f], b[f], rtol=1e-12, atol=1e-12), name
            # the rows of the pools that kept their price are the old grid's own candidates
            for i, c in enumerate(got.candidates()):
                if int(got.pool[i]) not in changed:
                    assert c is before[i]
            assert old.candidates() == before  # the old grid is left as it was


def test_a_repriced_grid_refuses_rows_that_are_not_the_moved_pools() -> None:
    pools = _grid_pools()
    new, _ = _repriced(pools)
    cfg = SchedulerConfig()
    cache = CandidateCache()
    spec = _grid_spec()
    old = spec_grid(spec, pools, cfg, cache)
    sub = spec_grid(spec, [new[1], new[3]], cfg, cache)
    with pytest.raises(ValueError, match=r"^the repriced pools' rows do not match the grid's$"):
        old.with_pools_repriced(new, [1], sub)


def test_rows_are_a_sequence_of_the_grids_candidates_in_their_order() -> None:
    pools = _grid_pools()
    cfg = SchedulerConfig()
    cache = CandidateCache()
    grid = spec_grid(_grid_spec(), pools, cfg, cache)
    other = spec_grid(_grid_spec(), pools, cfg, cache)
    idx = [int(i) for i in np.flatnonzero(grid.feasible)[::-1][:4]]
    rows = Rows(grid, idx)
    want = [grid.candidate(i) for i in idx]
    assert len(rows) == 4 and list(rows) == want and rows[0] is want[0] and rows[-1] is want[-1]
    assert rows[1:3] == want[1:3] and rows[::2] == want[::2] and rows[5:] == []
    assert rows == Rows(grid, list(idx))
    assert rows != Rows(grid, idx[::-1]) and rows != Rows(grid, idx[:3])
    assert rows != Rows(other, list(idx))  # the same numbers on another grid are other rows
    assert rows != want  # a list is not rows
    with pytest.raises(TypeError):
        hash(rows)


def _refusing(accelerator: str, calls: list[tuple[str, int]]) -> Any:
    """A calibration hook that cannot model ``accelerator`` (``ValueError``) and declines the others."""

    def hook(spec: Any, acc: Any, devices: int, topology: Any) -> Any:
        if acc.name == accelerator:
            calls.append((acc.name, devices))
            raise ValueError(f"no model of {acc.name} on {devices}")
        return None

    return hook


def test_rows_the_predictor_cannot_model_are_the_scalar_paths_refusals() -> None:
    """A count the predictor cannot model (the calibration hook raises ``ValueError``) is refused with the
    predictor's words and priced at the pool's own price per hour (zero when the pool's price is zero),
    as the scalar path prices it, whether the round prefetched the spec's predictions or not."""
    pools = _grid_pools()
    free = next(p for p in pools if p.name == "free-l4")
    pools.append(free.model_copy(update={"name": "paid-l4", "price_usd_per_device_hour": 0.7}))
    cfg = SchedulerConfig()
    spec = _grid_spec(model={"params_b": 0.7})
    for refused in ("l4", "h100"):
        raw = candidates_for(
            job_id="", tenant="", spec=spec, pools=pools, now_s=0.0, deadline_abs_s=None, config=cfg,
            cache=CandidateCache(calibrated=_refusing(refused, [])),
        )  # fmt: skip
        want = [_objective_for_job(c, spec.objective.minimize, cfg) for c in raw]
        no_model = [c for c in want if not c.feasible and c.reasons[0].startswith("predictor: no model")]
        assert len(no_model) >= 4 and any(c.price_usd_per_hour > 0 for c in no_model)
        for prefetched in (False, True):
            cache = CandidateCache(calibrated=_refusing(refused, []))
            _assert_same(spec_candidates(spec, pools, cfg, cache, prefetched=prefetched), want)


def test_a_count_the_predictor_cannot_model_is_asked_once_per_spec_pool_class_and_count() -> None:
    """The allocation times of such a count are memoised like the others: two pools of one class (they
    differ only in region and price) and pricing the spec again ask the hook nothing more."""
    spec = _grid_spec(model={"params_b": 0.7})
    one = _grid_pools()[1]
    pools = [
        one,
        one.model_copy(
            update={"name": "spot-h100-eu", "region": "eu-west-1", "price_usd_per_device_hour": 1.1}
        ),
    ]
    calls: list[tuple[str, int]] = []
    cache = CandidateCache(calibrated=_refusing("h100", calls))
    cfg = SchedulerConfig()
    first = spec_candidates(spec, pools, cfg, cache, prefetched=True)
    counts = device_counts(spec, pools[0], cache)
    assert len(counts) > 1 and sorted(calls) == [("h100", d) for d in counts]
    assert all(not c.feasible and c.reasons[0].startswith("predictor: no model") for c in first)
    again = spec_candidates(spec, pools, cfg, cache, prefetched=True)
    _assert_same(again, first)
    assert len(calls) == len(counts)


def test_a_prediction_without_a_finite_step_time_is_refused_with_no_step_time() -> None:
    """A prediction that says it fits but has no finite step time (a calibration hook's answer) is refused
    as not fitting, with a step time of 0 and the allocation's price per hour, as the scalar path says."""

    def endless(spec: Any, acc: Any, devices: int, topology: Any) -> Any:
        if acc.name == "h100" or devices == 4:
            return replace(predict(spec, acc, devices, **topology), step_time_s=math.inf, fits=True)
        return None

    pools = _grid_pools()
    cfg = SchedulerConfig()
    spec = _grid_spec(model={"params_b": 0.7})
    raw = candidates_for(
        job_id="", tenant="", spec=spec, pools=pools, now_s=0.0, deadline_abs_s=None, config=cfg,
        cache=CandidateCache(calibrated=endless),
    )  # fmt: skip
    want = [_objective_for_job(c, spec.objective.minimize, cfg) for c in raw]
    endless_rows = [c for c in want if c.accelerator == "h100" or c.devices == 4]
    assert len(endless_rows) > 3 and not any(c.feasible or c.step_time_s for c in endless_rows)
    assert all(c.price_usd_per_hour > 0 for c in endless_rows if c.pool != "free-l4")
    for prefetched in (False, True):
        got = spec_candidates(spec, pools, cfg, CandidateCache(calibrated=endless), prefetched=prefetched)
        _assert_same(got, want)


def test_a_callers_screen_decides_which_counts_are_priced() -> None:
    """``screened`` (each pool's device counts and eligibility, as a round found them) is what is priced:
    given only each pool's first count, the candidates are those rows of the full list."""
    pools = _grid_pools()
    cfg = SchedulerConfig()
    spec = _grid_spec()
    cache = CandidateCache()
    screened = [(p, device_counts(spec, p, cache)[:1], eligibility(spec, p, cache)) for p in pools]
    keep = {(p.name, counts[0] if counts else p.devices_per_node) for p, counts, _why in screened}
    full = spec_candidates(spec, pools, cfg, CandidateCache())
    want = [c for c in full if (c.pool, c.devices) in keep]
    assert len(want) == len(pools) < len(full)
    _assert_same(spec_candidates(spec, pools, cfg, cache, screened=screened), want)


def test_the_grids_memos_are_bounded_and_never_take_another_object_for_their_key() -> None:
    """The per-pool market memo is cleared past 4096 pools, the memo of refusals shared across specs past
    65536 entries; an entry whose id is now another object's (the old one freed) is not taken for it."""
    base = _grid_pools()[0]
    pools = [base.model_copy(update={"name": f"p{i}"}) for i in range(4098)]
    cache = CandidateCache()
    assert pool_markets(pools[:4097], cache) == ["on_demand"] * 4097 and len(cache._markets) == 4097
    assert _market(cache, pools[0]) == "on_demand" and len(cache._markets) == 4097  # answered from it
    assert _market(cache, pools[4097]) == "on_demand" and len(cache._markets) == 1
    spot = _grid_pools()[1]
    cache._markets[id(pools[5])] = (spot, "spot")  # a stale entry: another object under this id
    assert _market(cache, pools[5]) == "on_demand" and cache._markets[id(pools[5])][0] is pools[5]

    od_only = _grid_spec(objective={"markets": ["on_demand"]})
    why = eligibility(od_only, spot, cache)
    counts = device_counts(od_only, spot, cache)
    assert why and counts
    first = _never_memo(od_only, spot, counts, why, cache)
    assert (first.feasible, first.reasons, first.devices) == (False, (why,), counts[0])
    assert _never_memo(_grid_spec(objective={"markets": ["reserved"]}), spot, counts, why, cache) is first
    cache._nevers[(id(spot), counts[0], why)] = (base, first)  # a stale entry: another pool under this id
    again = _never_memo(od_only, spot, counts, why, cache)
    assert again is not first and again == first
    cache._nevers.clear()
    cache._nevers.update({("filler", i, ""): (base, first) for i in range(65536)})
    _never_memo(od_only, spot, counts, why, cache)
    assert len(cache._nevers) == 65537  # at the bound: kept
    _never_memo(od_only, spot, [2], why, cache)
    assert len(cache._nevers) == 1  # past it: cleared
    # a pool with no count for the spec: one refusal on a whole node, in the device range's words
    none = _never_memo(od_only, base, [], "", cache)
    assert none.devices == base.devices_per_node and none.reasons and not none.feasible


def test_a_shorter_or_longer_pool_list_is_priced_on_its_own_pools() -> None:
    """The pools' prices and classes are memoised for the last pool list seen, object by object: a list
    that is a prefix of it, or that it is a prefix of, is priced on its own pools."""
    pools = _grid_pools()
    cfg = SchedulerConfig()
    spec = _grid_spec()
    cache = CandidateCache()
    for some in (pools[:2], pools, pools[:3], pools[1:]):
        _assert_same(
            spec_candidates(spec, some, cfg, cache), spec_candidates(spec, some, cfg, CandidateCache())
        )


def test_preemptions_that_cost_as_much_as_they_train_are_refused_in_words_within_budget_and_hours() -> None:
    """A spot row whose preemptions lose at least as much wall time as it trains (``preemption_frac >= 1``)
    is the scalar path's refusal in words even when the spec's budget and device-hour limit would take
    it: at 30 interruptions an hour, and at the rate where the fraction is exactly 1 (a 5-minute interval
    pinned, a restart of 183.27 s: 10.80216... an hour)."""
    spec = _grid_spec(
        model={"params_b": 0.7},
        resources={"max_devices": 8, "accelerator_hours": 1e6},
        checkpoint={"interval": "5m"},
        objective={"markets": ["spot"], "budget_usd": 1e6},
    )
    base = _grid_pools()[1].model_copy(update={"nodes": 1, "inter_node_gbps": None})
    cfg = SchedulerConfig()
    for rate in (30.0, 10.802160432086419, 10.8):
        pools = [base.model_copy(update={"interruption_rate_per_hour": rate})]
        want = _reference(spec, pools, cfg, 0.0)
        refused = [c for c in want if c.reasons and c.reasons[0].startswith("preemptions every")]
        assert len(refused) == (len(want) if rate != 10.8 else 0) and want, rate
        _assert_same(spec_candidates(spec, pools, cfg, CandidateCache()), want)
        grid = spec_grid(spec, pools, cfg, CandidateCache())  # its feasibility column says so too
        assert [bool(f) for f in grid.feasible] == [c.feasible for c in want]


def test_a_pool_without_a_price_and_a_cache_the_scalar_path_filled_are_priced_as_the_reference() -> None:
    """A pool with neither a price nor an instance type is refused in the scalar path's words; a cache whose
    allocation times the scalar path memoised (a round on it, or a spec priced one option at a time) gives
    the array path the same candidates."""
    pools = _grid_pools()
    pools.append(pools[0].model_copy(update={"name": "unpriced", "price_usd_per_device_hour": None}))
    cfg = SchedulerConfig()
    spec = _grid_spec()
    want = _reference(spec, pools, cfg, 0.0)
    assert [c.feasible for c in want if c.pool == "unpriced"] == [False] * sum(
        c.pool == "unpriced" for c in want
    )
    assert any(c.pool == "unpriced" for c in want)
    _assert_same(spec_candidates(spec, pools, cfg, CandidateCache()), want)
    cache = CandidateCache()
    candidates_for(
        job_id="", tenant="", spec=spec, pools=pools, now_s=0.0, deadline_abs_s=None, config=cfg, cache=cache
    )
    assert cache.times and not cache.time_rows
    _assert_same(spec_candidates(spec, pools, cfg, cache), want)
    _assert_same(spec_candidates(spec, pools, cfg, cache), want)  # and again, from the rows it memoised


def test_a_grid_is_refused_for_work_already_done() -> None:
    pools = _grid_pools()
    for bad in (1.0, 1.5, -0.1):
        with pytest.raises(ValueError, match=rf"^elapsed_fraction must be in \[0, 1\), got {bad}$"):
            spec_grid(_grid_spec(), pools, SchedulerConfig(), CandidateCache(), bad)


def test_a_reserved_pool_priced_from_the_catalog_gets_the_reserved_discount() -> None:
    """A pool with an instance type and no price of its own is priced from the catalog, reserved at the cost
    model's discount, as the scalar path prices it; a budget that refuses some rows marks them infeasible
    in the grid's feasibility column too."""

    def p4de(name: str, market: str) -> Pool:
        return Pool(
            name=name, accelerator="a100-80gb", devices_per_node=8, nodes=2, available_devices=None,
            market=market, instance_type="p4de.24xlarge", region="us-east-1", cloud="aws",
        )  # fmt: skip

    pools = [p4de("res-p4de", "reserved"), p4de("od-p4de", "on_demand")]
    cfg = SchedulerConfig()
    spec = _grid_spec(model={"params_b": 0.7}, objective={"budget_usd": 60.0})
    want = _reference(spec, pools, cfg, 0.0)
    res = [c for c in want if c.pool == "res-p4de" and c.price_usd_per_hour]
    od = {c.devices: c.price_usd_per_hour for c in want if c.pool == "od-p4de"}
    assert res and all(math.isclose(c.price_usd_per_hour, 0.65 * od[c.devices]) for c in res)
    assert any(c.feasible for c in want) and any(c.reasons[:1] and "budget" in c.reasons[0] for c in want)
    _assert_same(spec_candidates(spec, pools, cfg, CandidateCache()), want)
    grid = spec_grid(spec, pools, cfg, CandidateCache())
    assert [bool(f) for f in grid.feasible] == [c.feasible for c in want]


def test_a_pessimistic_finish_of_exactly_one_hour_is_kept() -> None:
    """``to_candidate`` falls back to the expected hours only when the pessimistic hours are 0: a p90 of
    exactly 1.0 h (a measured step time of 3.2047978259851004 s over 1000 steps) is kept as it is."""
    spec = _grid_spec(
        model={"params_b": 0.7},
        resources={"min_devices": 1, "max_devices": 1},
        workload={"steps": 1000},
        checkpoint={"interval": "5m"},
        objective={"markets": ["on_demand"]},
        measured={"step_time_s": {"a100-80gb": 3.2047978259851004}},
    )
    pools = [_grid_pools()[0].model_copy(update={"nodes": 1})]
    cfg = SchedulerConfig()
    want = _reference(spec, pools, cfg, 0.0)
    assert [(c.expected_hours_p90, c.finish_s) for c in want] == [(1.0, 3600.0)] and want[
        0
    ].expected_hours < 1.0
    _assert_same(spec_candidates(spec, pools, cfg, CandidateCache()), want)
