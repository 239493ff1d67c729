"""Scheduling rounds with the real cost model: golden hand-checked instances and explanations."""

from __future__ import annotations

from typing import Any

import pytest
from scheduler_paths import both_pricing_paths  # noqa: F401

from trainyard.catalog.pools import Pool, load_pools
from trainyard.schedule import (
    CandidateCache,
    JobsFileError,
    QueuedJob,
    SchedulerConfig,
    TenantQuota,
    parse_jobs,
    schedule_round,
)
from trainyard.spec import spec_from_dict

# every round runs on the vectorised pricing and on the scalar reference, which must decide alike
pytestmark = pytest.mark.usefixtures("both_pricing_paths")

CFG = SchedulerConfig(time_limit_s=0.2)


def spec(name: str, **over: Any):
    doc: dict[str, Any] = {
        "name": name,
        "model": {"n_layers": 16, "d_model": 2048, "n_heads": 16, "vocab_size": 32000},
        "workload": {"seq_len": 2048, "global_batch": 8, "steps": 2000},
        "resources": {"min_devices": 1, "max_devices": 1},
    }
    for section, values in over.items():
        doc.setdefault(section, {})
        doc[section] = {**doc[section], **values} if isinstance(values, dict) else values
    return spec_from_dict(doc)


def pool(name: str, accelerator: str, price: float, *, market: str = "on_demand", per_node: int = 1,
         nodes: int = 4, available: int | None = None, **extra: Any) -> Pool:  # fmt: skip
    return Pool(
        name=name,
        accelerator=accelerator,
        devices_per_node=per_node,
        nodes=nodes,
        available_devices=available,
        market=market,
        price_usd_per_device_hour=price,
        region="us-east-1",
        cloud="aws",
        **extra,
    )


def job(s, tenant: str = "t", submit_s: float = 0.0, priority: int = 0) -> QueuedJob:
    return QueuedJob(job_id=s.name, tenant=tenant, spec=s, submit_s=submit_s, priority=priority)


def test_seed_example_goes_to_spot_a100_with_15_minute_checkpoints(examples_dir) -> None:
    jobs = parse_jobs((examples_dir / "seed-jobs.jsonl").read_text(), "seed-jobs.jsonl")
    pools = load_pools(examples_dir / "seed-pools.yaml")
    assert next(p for p in pools if p.name == "trainium").free_devices == 0
    r = schedule_round(jobs, pools, now_s=0.0, config=CFG)
    assert not r.unplaced
    (p,) = r.placements
    assert (p.job_id, p.pool, p.market, p.devices) == ("seed-example", "a100-spot", "spot", 1)
    assert p.checkpoint_interval_s == pytest.approx(900.0)
    assert "checkpoint every 15 min" in p.reason
    assert len(p.alternatives) == 2
    # the two best alternatives, cheapest first, with their costs
    assert p.alternatives[0].expected_cost_usd <= p.alternatives[1].expected_cost_usd
    assert p.expected_cost_usd < p.alternatives[0].expected_cost_usd


def test_cheapest_per_hour_is_the_most_expensive_per_job() -> None:
    # T4 is 10× cheaper per hour but 40× slower per step for this job: the H100 costs least per job.
    s = spec(
        "j",
        measured={"step_time_s": {"t4": 8.0, "a100-80gb": 0.5, "h100": 0.2}},
        objective={"markets": ["on_demand"]},
    )
    pools = [pool("t4", "t4", 0.40), pool("a100", "a100-80gb", 2.0), pool("h100", "h100", 4.0)]
    r = schedule_round([job(s)], pools, config=CFG)
    (p,) = r.placements
    assert p.pool == "h100"
    by_pool = {a.pool: a.expected_cost_usd for a in p.alternatives}
    assert set(by_pool) == {"a100", "t4"}
    assert by_pool["t4"] > by_pool["a100"] > p.expected_cost_usd


def test_model_that_runs_slower_on_the_newer_gpu_stays_on_the_older_one() -> None:
    s = spec("j", measured={"step_time_s": {"a100-80gb": 1.0, "h100": 2.5}})
    pools = [pool("a100", "a100-80gb", 2.0), pool("h100", "h100", 3.0)]
    r = schedule_round([job(s)], pools, config=CFG)
    assert r.placements[0].pool == "a100"


def test_occupied_big_memory_pool_gives_a_capacity_reason_and_the_cheapest_later_option() -> None:
    s = spec(
        "big",
        resources={"min_devices": 8, "max_devices": 8, "min_memory_per_device_gib": 80},
        measured={"step_time_s": {"h100": 1.0}},
    )
    pools = [
        pool("h100", "h100", 4.0, per_node=8, nodes=2, available=0),
        pool("a100-40", "a100-40gb", 1.0, per_node=8),
    ]
    r = schedule_round([job(s)], pools, config=CFG)
    assert not r.placements
    (u,) = r.unplaced
    assert "no capacity now: needs 8 × h100 in one node" in u.reason
    assert "the only pool that can run it, h100, has 0 of 16 devices available" in u.reason
    assert "cheapest feasible later: 8 × h100 on_demand on h100" in u.reason


def test_infeasible_everywhere_names_the_constraint() -> None:
    s = spec("cuda", requirements={"frameworks": ["cuda-kernels"]})
    pools = [pool("tpu", "tpu-v4", 3.0), pool("trn", "trn1", 1.2)]
    r = schedule_round([job(s)], pools, config=CFG)
    (u,) = r.unplaced
    assert "requirements.frameworks" in u.reason and "tpu" in u.reason


def test_multi_node_gang_needs_the_interconnect() -> None:
    s = spec(
        "wide",
        resources={"min_devices": 16, "max_devices": 16, "min_interconnect_gbps": 200},
        measured={"step_time_s": {"a100-80gb": 0.5, "h100": 0.4}},
    )
    pools = [
        pool("a100", "a100-80gb", 1.0, per_node=8, nodes=4),
        pool("h100", "h100", 4.0, per_node=8, nodes=4),
    ]
    r = schedule_round([job(s)], pools, config=CFG)
    (p,) = r.placements
    assert (p.pool, p.devices, p.nodes) == ("h100", 16, 2)
    # A100 nodes talk at 50 Gbit/s per device: too slow for this job across nodes
    assert all(a.pool != "a100" for a in p.alternatives)


def test_tenant_quotas_and_reason() -> None:
    jobs = [job(spec(f"j{i}"), tenant="team") for i in range(3)]
    pools = [pool("a100", "a100-80gb", 2.0, nodes=8)]
    cfg = SchedulerConfig(time_limit_s=0.2, quotas={"team": TenantQuota(max_jobs=2)})
    r = schedule_round(jobs, pools, config=cfg)
    assert len(r.placements) == 2
    (u,) = r.unplaced
    assert "quota" in u.reason
    cfg = SchedulerConfig(time_limit_s=0.2, quotas={"team": TenantQuota(max_devices=1)})
    r = schedule_round(jobs, pools, config=cfg)
    assert len(r.placements) == 1
    assert all("device quota" in u.reason for u in r.unplaced)


def test_reserved_capacity_is_filled_first() -> None:
    s = spec("j", measured={"step_time_s": {"a100-80gb": 1.0}})
    pools = [pool("od", "a100-80gb", 1.0), pool("res", "a100-80gb", 3.0, market="reserved")]
    r = schedule_round([job(s)], pools, config=CFG)
    (p,) = r.placements
    assert p.pool == "res" and "reserved capacity" in p.reason


def test_scarce_capacity_goes_to_the_higher_priority_job() -> None:
    pools = [pool("a100", "a100-80gb", 2.0, nodes=1), pool("slow", "t4", 1.0, nodes=1)]
    lo = job(spec("lo", measured={"step_time_s": {"a100-80gb": 1.0, "t4": 6.0}}), priority=0)
    hi = job(spec("hi", measured={"step_time_s": {"a100-80gb": 1.0, "t4": 6.0}}), priority=3)
    r = schedule_round([lo, hi], pools, config=CFG)
    where = {p.job_id: p.pool for p in r.placements}
    assert where["hi"] == "a100"


def test_deadline_rules_out_slow_options() -> None:
    # 2000 steps × 8 s on T4 ≈ 4.4 h; the deadline is 3 h away
    s = spec("dl", measured={"step_time_s": {"t4": 8.0, "a100-80gb": 1.0}}, objective={"deadline": "3h"})
    pools = [pool("t4", "t4", 0.2), pool("a100", "a100-80gb", 3.0)]
    r = schedule_round([job(s)], pools, config=CFG)
    assert r.placements[0].pool == "a100"
    # while the fast option can still make it but is full, the job waits for it rather than start late
    busy = [pools[0], pool("a100", "a100-80gb", 3.0, available=0)]
    r = schedule_round([job(s)], busy, config=CFG)
    assert not r.placements and "a100" in r.unplaced[0].reason


def test_a_job_that_can_no_longer_meet_its_deadline_is_still_placed() -> None:
    # an hour later (it waited), even the fast option cannot make it: placed anyway, the miss named
    s2 = spec("dl2", measured={"step_time_s": {"a100-80gb": 4.0}}, objective={"deadline": "3h"})
    pools = [pool("t4", "t4", 0.2), pool("a100", "a100-80gb", 3.0)]
    r = schedule_round([job(s2, submit_s=0.0)], pools[1:], now_s=3600.0, config=CFG)
    (p,) = r.placements
    assert p.pool == "a100" and not r.unplaced
    assert "misses its deadline" in p.reason
    # long past the deadline (e.g. re-queued after a preemption): cheapest per the objective ...
    m = {"step_time_s": {"t4": 8.0, "a100-80gb": 1.0}}
    late = spec("late", measured=m, objective={"deadline": "3h"})
    r = schedule_round([job(late, submit_s=0.0)], pools, now_s=10 * 3600.0, config=CFG)
    assert [p.pool for p in r.placements] == ["t4"]  # 4.4 h × $0.2 < 0.6 h × $3
    # ... or soonest when the job minimises time
    fast = spec("fast", measured=m, objective={"deadline": "3h", "minimize": "time"})
    r = schedule_round([job(fast, submit_s=0.0)], pools, now_s=10 * 3600.0, config=CFG)
    assert [p.pool for p in r.placements] == ["a100"]
    # a deadline shorter than any option's run time from the start is no reason to strand the job either
    tight = spec("tight", measured=m, objective={"deadline": "10m"})
    r = schedule_round([job(tight)], pools, config=CFG)
    assert [p.pool for p in r.placements] == ["t4"] and "misses its deadline" in r.placements[0].reason


def test_duplicate_names_get_line_ids_and_rounds_are_deterministic(examples_dir) -> None:
    line = (examples_dir / "seed-jobs.jsonl").read_text().strip()
    jobs = parse_jobs("\n".join([line, line, "", line]), "q.jsonl")
    assert [j.job_id for j in jobs] == ["seed-example", "seed-example#2", "seed-example#4"]
    pools = load_pools(examples_dir / "seed-pools.yaml")
    cache = CandidateCache()
    a = schedule_round(jobs, pools, config=CFG, cache=cache)
    b = schedule_round(jobs, pools, config=CFG)
    strip = lambda r: [(p.job_id, p.pool, p.devices) for p in r.placements]  # noqa: E731
    assert strip(a) == strip(b)
    # spot A100 holds 4 single-device nodes: all three fit there
    assert {p.pool for p in a.placements} == {"a100-spot"}


def test_jobs_file_errors_name_the_line() -> None:
    cases = {
        "": "no jobs",
        '{"submit_s": 0, "tenant": "t"}': "missing 'spec'",
        '{"submit_s": "x", "tenant": "t", "spec": {}}': "submit_s must be",
        '{"submit_s": 0, "tenant": "", "spec": {}}': "tenant must be",
        '{"submit_s": 0, "tenant": "t", "spec": {}, "extra": 1}': "unknown key 'extra'",
        "[1, 2]": "expected a JSON object",
        '{"submit_s": 0, "tenant": "t", "spec": {"name": "x"}}': "q.jsonl:1: spec.",
    }
    for text, needle in cases.items():
        with pytest.raises(JobsFileError) as err:
            parse_jobs(text, "q.jsonl")
        assert needle in err.value.message, (text, err.value.message)
        assert err.value.exit_code == 2


def test_minimize_time_trades_dollars_for_hours() -> None:
    measured = {"step_time_s": {"t4": 4.0, "h100": 0.5}}
    pools = [pool("t4", "t4", 0.40), pool("h100", "h100", 4.0)]
    cheap = schedule_round([job(spec("c", measured=measured))], pools, config=CFG)
    fast = schedule_round(
        [job(spec("f", measured=measured, objective={"minimize": "time"}))], pools, config=CFG
    )
    assert cheap.placements[0].pool == "t4"
    assert fast.placements[0].pool == "h100"
    assert fast.placements[0].expected_cost_usd > cheap.placements[0].expected_cost_usd


def test_candidate_cache_stays_bounded_across_rounds(examples_dir) -> None:
    pools = load_pools(examples_dir / "seed-pools.yaml")
    cache = CandidateCache(max_entries=50)
    for i in range(8):
        # a fresh spec object per round, as a service reading jobs from its store would have
        s = spec(f"j{i}", workload={"steps": 1000 + i})
        schedule_round([job(s)], pools, now_s=float(i), config=CFG, cache=cache)
        assert len(cache.options) + len(cache.views) + len(cache._keys) <= 50 + 20
