"""Rounds on a cache kept across rounds re-plan only what changed, and decide exactly as a round priced from
scratch: a moved price re-prices the pools whose price moved (and moves the decision where it should), a
round whose model is unchanged reuses the last answer, and a change of free capacity or of the clock is
never answered from a stale memo."""

from __future__ import annotations

import random
import sys
from dataclasses import replace
from pathlib import Path

from scheduler_paths import decisions
from test_scheduler_round import job, pool, spec

from trainyard.schedule import CandidateCache, SchedulerConfig, schedule_round

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_scheduler
import bench_scheduler_distinct

CFG = SchedulerConfig(time_limit_s=0.2)


def _fresh(jobs, pools, now_s=0.0, cfg=CFG):
    """The round priced from scratch, on both pricing paths (they must agree)."""
    ref = schedule_round(jobs, pools, now_s=now_s, config=replace(cfg, vectorised_pricing=False))
    got = schedule_round(jobs, pools, now_s=now_s, config=cfg, cache=CandidateCache())
    assert decisions(got) == decisions(ref)
    return got


def test_a_price_change_moves_the_job_to_the_pool_that_became_cheaper() -> None:
    s = spec("j", measured={"step_time_s": {"a100-80gb": 1.0, "h100": 0.6}})
    pools = [pool("a100", "a100-80gb", 2.0), pool("h100", "h100", 4.0)]
    cache = CandidateCache()
    first = schedule_round([job(s)], pools, config=CFG, cache=cache)
    assert [p.pool for p in first.placements] == ["a100"]
    # a100 doubles its price: 1.0 s at $4.40/h now costs more than 0.6 s at $4.00/h
    dearer = [pools[0].model_copy(update={"price_usd_per_device_hour": 4.4}), pools[1]]
    moved = schedule_round([job(s)], dearer, config=CFG, cache=cache)
    assert [p.pool for p in moved.placements] == ["h100"]
    assert decisions(moved) == decisions(_fresh([job(s)], dearer))
    # and back: the cache holds no stale prices either way
    back = schedule_round([job(s)], pools, config=CFG, cache=cache)
    assert decisions(back) == decisions(first)


def test_moved_prices_on_the_distinct_shapes_queue_decide_as_a_fresh_round() -> None:
    rng = random.Random(7)
    pools = bench_scheduler.make_pools(40, rng)
    pools = [
        p.model_copy(update={"available_devices": min(p.free_devices, 2 * p.devices_per_node)}) for p in pools
    ]
    jobs = bench_scheduler_distinct.make_distinct_jobs(60, rng)
    cache = CandidateCache()
    schedule_round(jobs, pools, now_s=0.0, config=CFG, cache=cache)
    changed_somewhere = False
    for step in range(4):
        at = rng.sample(range(len(pools)), rng.choice([1, 2, 5]))
        for i in at:  # cheaper or dearer, by up to 3x: some decisions must move
            price = pools[i].price_usd_per_device_hour * rng.choice([0.3, 0.6, 1.7, 3.0])
            pools[i] = pools[i].model_copy(update={"price_usd_per_device_hour": round(price, 4)})
        before = schedule_round(jobs, pools, now_s=0.0, config=CFG, cache=CandidateCache())
        warm = schedule_round(jobs, pools, now_s=0.0, config=CFG, cache=cache)
        assert decisions(warm) == decisions(before), step
        assert decisions(warm) == decisions(_fresh(jobs, pools)), step
        changed_somewhere |= bool(warm.placements)
    assert changed_somewhere


def test_an_unchanged_round_reuses_the_answer_and_a_changed_one_does_not() -> None:
    rng = random.Random(3)
    pools = bench_scheduler.make_pools(30, rng)
    jobs = bench_scheduler_distinct.make_distinct_jobs(40, rng)
    cache = CandidateCache()
    first = schedule_round(jobs, pools, now_s=0.0, config=CFG, cache=cache)
    again = schedule_round(jobs, pools, now_s=0.0, config=CFG, cache=cache)
    assert decisions(again) == decisions(first)
    assert again.solve_time_s == 0.0  # nothing the model reads changed: not searched again
    # free capacity moves: the round is planned again, as a fresh round would plan it
    full = next(i for i, p in enumerate(pools) if any(pl.pool == p.name for pl in first.placements))
    pools[full] = pools[full].model_copy(update={"available_devices": 0})
    fewer = schedule_round(jobs, pools, now_s=0.0, config=CFG, cache=cache)
    assert decisions(fewer) == decisions(_fresh(jobs, pools))
    assert all(p.pool != pools[full].name for p in fewer.placements)
    # the clock moves: waiting costs and deadlines change, and the round follows
    later = schedule_round(jobs, pools, now_s=5400.0, config=CFG, cache=cache)
    assert decisions(later) == decisions(_fresh(jobs, pools, 5400.0))
    # another configuration is never answered from the last one's memo
    other = replace(CFG, max_options_per_job=2, max_options_per_pool=1)
    assert decisions(schedule_round(jobs, pools, now_s=5400.0, config=other, cache=cache)) == decisions(
        _fresh(jobs, pools, 5400.0, other)
    )
