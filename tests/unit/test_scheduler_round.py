"""Scheduling rounds with the real cost model: golden hand-checked instances and explanations."""

from __future__ import annotations

import math
from dataclasses import replace
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
from trainyard.schedule.round import (
    _alternatives,
    _fmt_dur,
    _fmt_usd,
    _group_reason,
    _group_usage,
    _infeasible_reason,
    _placement_reason,
    _tenant_limits,
    _tenant_usage,
    _unplaced_reason,
    free_room,
    priority_weight,
    prune,
    queued_progress,
    waiting_cost_usd,
)
from trainyard.schedule.solver import ProblemJob, Solution, TenantLimit
from trainyard.schedule.types import Alternative, Candidate, JobGroup, RunningJob
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


# ---- the round's arithmetic and explanations, one rule at a time ----------------------------------------
def _c(pool_name: str, devices: int = 1, *, cost: float = 10.0, hours: float = 2.0, feasible: bool = True,
       reasons: tuple[str, ...] = (), market: str = "on_demand", nodes: int = 1, per_node: int = 8,
       objective: float | None = None, ckpt: float = 0.0) -> Candidate:  # fmt: skip
    """A hand-made option: ``cost`` dollars over ``hours`` on ``pool_name``."""
    return Candidate(
        job_id="j", tenant="t", pool=pool_name, accelerator="a100-80gb", devices=devices, nodes=nodes,
        devices_per_node=per_node, market=market, expected_cost_usd=cost, expected_hours=hours,
        expected_hours_p90=hours, step_time_s=1.0, price_usd_per_hour=cost / hours,
        checkpoint_interval_s=ckpt, finish_s=hours * 3600.0, feasible=feasible, reasons=reasons,
        capacity_devices=devices * nodes,
        objective_usd=cost if objective is None else objective,
    )  # fmt: skip


def test_priority_weights_double_per_level_within_minus_3_and_6() -> None:
    assert [priority_weight(p) for p in (-9, -3, -2, 0, 1, 3, 6, 7)] == [
        0.125, 0.125, 0.25, 1.0, 2.0, 8.0, 64.0, 64.0
    ]  # fmt: skip


def test_dollars_and_durations_read_as_in_the_reasons() -> None:
    # from 0.995 up amounts read in cents (0.995 itself, a float just below it, reads as $0.99)
    assert [_fmt_usd(x) for x in (1234.5, 1.0, 0.996, 0.995, 0.994, 0.5, 0.1234, 0.0)] == [
        "$1,234.50", "$1.00", "$1.00", "$0.99", "$0.994", "$0.5", "$0.1234", "$0"
    ]  # fmt: skip
    assert [_fmt_dur(s) for s in (59.0, 1800.0, 3599.0, 3600.0, 5400.0)] == [
        "1 min", "30 min", "60 min", "1.0 h", "1.5 h"
    ]  # fmt: skip


def test_the_waiting_cost_grows_with_time_queued_urgency_and_priority() -> None:
    cfg = SchedulerConfig(wait_base_usd=2.0, wait_cost_share=0.1, wait_growth_h=2.0, deadline_urgency=3.0,
                          max_urgency=20.0)  # fmt: skip

    def wait(priority: int = 0, queued_s: float = 0.0, deadline: float | None = None, needed_s: float = 0.0,
             now_s: float = 1000.0) -> float:  # fmt: skip
        return waiting_cost_usd(priority=priority, reference_usd=50.0, queued_s=queued_s, now_s=now_s,
                                deadline_abs_s=deadline, needed_s=needed_s, config=cfg)  # fmt: skip

    # base $2 + 10 % of the $50 reference = $7; doubling per priority level; +1/2 per hour queued
    assert wait() == 7.0
    assert wait(priority=1, queued_s=7200.0) == 2 * 7.0 * 2.0
    assert wait(queued_s=-100.0) == 7.0  # a job submitted "in the future" has not waited
    # needed a quarter of the time left: urgency 1 + 3 × 0.25 / (0.75 + 0.05)
    assert wait(deadline=5000.0, needed_s=1000.0) == pytest.approx(7.0 * (1 + 3 * 0.25 / 0.8), rel=1e-12)
    # needing all of it or more, or a deadline already here: the cap
    assert wait(deadline=5000.0, needed_s=9000.0) == 7.0 * 20.0
    assert wait(deadline=1000.0, needed_s=1.5) == 7.0 * 20.0  # time left counts as at least 1 s
    assert wait(deadline=1000.5, needed_s=0.9) == pytest.approx(7.0 * (1 + 3 * 0.9 / 0.15), rel=1e-12)


def test_prune_keeps_the_cheapest_few_per_pool_and_per_job() -> None:
    opts = [_c("a", 1), _c("a", 2), _c("a", 4), _c("b", 1), _c("b", 2), _c("c", 1)]
    cfg = SchedulerConfig(max_options_per_pool=2, max_options_per_job=3)
    key = lambda cs: [(c.pool, c.devices) for c in cs]  # noqa: E731
    assert key(prune(opts, cfg)) == [("a", 1), ("a", 2), ("b", 1)]
    assert key(prune(opts, cfg, limit=5)) == [("a", 1), ("a", 2), ("b", 1), ("b", 2), ("c", 1)]
    assert key(prune(opts, cfg, limit=1)) == [("a", 1)]


def test_an_infeasible_job_is_told_why_on_up_to_three_pools() -> None:
    p = pool("a", "a100-80gb", 1.0)
    assert _infeasible_reason([], []) == "no pools to run on"
    assert _infeasible_reason([], [p]) == "no pool offers a device count this job can use"
    # per pool, its most generous option's reason (the first of equals)
    cands = [_c("a", 1, reasons=("a1",)), _c("a", 4, reasons=("a4",)), _c("a", 4, reasons=("a4 again",)),
             _c("a", 2, reasons=("a2",)), _c("b", 1, reasons=("b1", "b1 second"))]  # fmt: skip
    assert _infeasible_reason(cands, [p]) == "no feasible option on any of 2 pools — a: a4; b: b1"
    more = [*cands, _c("c", 1, reasons=("c1",)), _c("d", 1, reasons=("d1",)), _c("e", 1, reasons=("e1",))]
    assert _infeasible_reason(more, [p]) == (
        "no feasible option on any of 5 pools — a: a4; b: b1; c: c1 (+2 more pools)"
    )
    assert _infeasible_reason([*cands, _c("c", 1, reasons=("c1",)), _c("d", 1)], [p]) == (
        "no feasible option on any of 4 pools — a: a4; b: b1; c: c1 (+1 more pools)"
    )
    assert _infeasible_reason([_c("a", 1, reasons=("x",)), _c("b", 1)], [p]) == (
        "no feasible option on any of 2 pools — a: x (+1 more pools)"
    )


def test_a_placement_explains_its_choice_against_the_others() -> None:
    free = {"a": pool("a", "a100-80gb", 1.0, per_node=8), "b": pool("b", "a100-80gb", 1.0, per_node=8),
            "full": pool("full", "a100-80gb", 1.0, per_node=8, available=0)}  # fmt: skip
    chosen = _c("a", 1, cost=12.346, hours=2.0)
    b = _c("b", 1, cost=13.0)
    a2 = _c("a", 2, cost=14.0)
    by_cost = [chosen, b, a2, _c("b", 2, cost=15.0)]
    assert _alternatives(chosen, by_cost) == (
        Alternative("b", 1, "on_demand", 13.0, 2.0), Alternative("a", 2, "on_demand", 14.0, 2.0)
    )  # fmt: skip
    head = "1 × a100-80gb on_demand on a: $12.35, ~2.0 h — "
    nxt = "; next: 1 × b $13.00, 2 × a $14.00"
    assert _placement_reason(chosen, [chosen], [chosen], [chosen], free) == (
        "1 × a100-80gb on_demand on a: $12.35, ~2.0 h — the only feasible option"
    )
    assert _placement_reason(chosen, [chosen, b], [chosen, b, a2], by_cost, free) == (
        head + "cheapest of 3 feasible options" + nxt
    )
    cheaper = _c("full", 1, cost=5.0)
    assert _placement_reason(chosen, [chosen, b], [cheaper, chosen, b], by_cost, free) == (
        head + "cheaper 1 × a100-80gb on_demand on full is full (needs 1 × a100-80gb in one node on full; "
        "0 available)" + nxt
    )
    assert _placement_reason(chosen, [b, chosen], [b, chosen], by_cost, free) == (
        head + "cheaper options taken by higher-value jobs this round" + nxt
    )
    assert _placement_reason(chosen, [chosen], [b, chosen], by_cost, free) == (
        head + "best trade of cost and time" + nxt
    )
    assert (
        _placement_reason(chosen, [], [b, chosen], by_cost, free)
        == head + "best trade of cost and time" + nxt
    )
    reserved = _c("a", 1, cost=12.346, market="reserved")
    assert _placement_reason(reserved, [reserved], [reserved], [reserved], free) == (
        "1 × a100-80gb reserved on a: $12.35, ~2.0 h — reserved capacity (already paid for) fits it"
    )
    spot = _c("a", 1, cost=0.5, hours=0.5, market="spot", ckpt=900.0)
    assert _placement_reason(spot, [spot], [spot], [spot], free) == (
        "1 × a100-80gb spot on a: $0.5, ~30 min — the only feasible option; checkpoint every 15 min"
    )
    # however short the interval (the cost model's floor is a parameter), a spot job that checkpoints says so
    often = replace(spot, checkpoint_interval_s=1.0)
    assert _placement_reason(often, [often], [often], [often], free).endswith("; checkpoint every 0 min")
    unsaved = replace(spot, checkpoint_interval_s=0.0)
    assert _placement_reason(unsaved, [unsaved], [unsaved], [unsaved], free).endswith(
        "the only feasible option"
    )
    od = replace(spot, market="on_demand")
    assert _placement_reason(od, [od], [od], [od], free).endswith("the only feasible option")


def _pj(options: Any = (), *, tenant: str = "t", unplaced: float | None = 100.0, group: str | None = None,
        job_id: str = "j", current: int = 0) -> ProblemJob:  # fmt: skip
    return ProblemJob(job_id=job_id, tenant=tenant, options=tuple(options), unplaced_usd=unplaced,
                      group=group, current_devices=current)  # fmt: skip


def test_an_unplaced_job_is_told_what_held_it_back() -> None:
    pools_ = {
        "a": pool("a", "a100-80gb", 1.0, per_node=8, nodes=2, available=1),
        "b": pool("b", "a100-80gb", 1.0, per_node=8, nodes=4, available=12),
        "c": pool("c", "a100-80gb", 1.0, available=0),
        "d": pool("d", "a100-80gb", 1.0, available=0),
    }
    later = "cheapest feasible later: 2 × a100-80gb on_demand on a at $10.00"
    a2 = _c("a", 2)
    # nothing fits now, one pool: its shape and free devices
    assert _unplaced_reason(_pj(), [a2, _c("a", 4)], [], {}, pools_, {}) == (
        "no capacity now: needs 2 × a100-80gb in one node; the only pool that can run it, a, has 1 of 16 "
        f"devices available; {later}"
    )
    gang = _c("b", 16, nodes=2)
    assert _unplaced_reason(_pj(), [gang], [], {}, pools_, {}) == (
        "no capacity now: needs 2 whole 8-device nodes; the only pool that can run it, b, has 12 of 32 "
        "devices available; cheapest feasible later: 16 × a100-80gb on_demand on b at $10.00"
    )
    # several pools: the first two named, with how many more
    two = [a2, _c("a", 4), gang]
    assert _unplaced_reason(_pj(), two, [], {}, pools_, {}) == (
        "no capacity now on the 2 pools that can run it: needs 2 × a100-80gb in one node on a; 1 available; "
        f"needs 2 whole 8-device nodes on b; 1 whole node(s) free (12 devices available); {later}"
    )
    four = [*two, _c("c", 1), _c("d", 1)]
    assert _unplaced_reason(_pj(), four, [], {}, pools_, {}).endswith(
        "1 whole node(s) free (12 devices available) (and 2 more pools); " + later
    )
    # tenant quotas: jobs, then devices (what is left after this round's placements)
    fit = [_c("b", 4), _c("b", 2)]
    jobs_quota = {"t": TenantLimit(devices_left=None, jobs_left=1)}
    assert _unplaced_reason(_pj(), [a2], fit, {"t": (0, 1)}, pools_, jobs_quota) == (
        f"tenant t is at its concurrent-job quota; {later}"
    )
    dev_quota = {"t": TenantLimit(devices_left=5, jobs_left=3)}
    assert _unplaced_reason(_pj(), [a2], fit, {"t": (4, 1)}, pools_, dev_quota) == (
        f"tenant t device quota: 1 devices left, the smallest option needs 2; {later}"
    )
    assert _unplaced_reason(_pj(), [a2], fit, {"t": (7, 1)}, pools_, dev_quota).startswith(
        "tenant t device quota: 0 devices left"
    )
    # within its quota (2 + 3 = 5 devices, 1 of 2 jobs): the round's other reasons
    room = {"t": TenantLimit(devices_left=5, jobs_left=2)}
    best = _c("b", 4, cost=20.0, objective=100.0)
    assert _unplaced_reason(_pj([best], unplaced=100.0), [a2], [best], {"t": (1, 1)}, pools_, room) == (
        f"waiting is cheaper: best option available now is 4 × a100-80gb on_demand on b at $20.00; {later} "
        "(full now)"
    )
    cheap = replace(best, objective_usd=99.0)
    taken = [cheap, _c("c", 1), _c("d", 1), _c("a", 1), _c("e", 1)]
    assert _unplaced_reason(_pj(taken, unplaced=100.0), [a2], [cheap], {}, pools_, room) == (
        "the pools that fit it now (a, b, c, d) are taken by this round's higher-value placements; " + later
    )
    # another tenant's quota does not hold this one back
    other = {"u": TenantLimit(devices_left=0, jobs_left=0)}
    assert _unplaced_reason(_pj([cheap]), [a2], [cheap], {}, pools_, other).startswith("the pools that fit")


def test_a_group_member_is_told_which_group_limit_held_it_back() -> None:
    fit = [_c("a", 1, cost=2.5), _c("b", 1, cost=1.5)]
    member = _pj(group="g")
    assert _group_reason(_pj(), fit, {}, {}) is None  # not in a group
    assert _group_reason(member, [], {}, {}) is None  # nothing fits anyway: the capacity reason says so
    starts = {"g": JobGroup(max_starts=2)}
    assert _group_reason(member, fit, {"g": ("a", 2, 0)}, starts) == (
        "its group g may start 2 more member(s) now (its parallelism less its running members), and this "
        "round started them"
    )
    assert _group_reason(member, fit, {}, {"g": JobGroup(max_starts=0)}) == (
        "its group g may start 0 more member(s) now (its parallelism less its running members), none left"
    )
    assert _group_reason(member, fit, {}, {"g": JobGroup(max_starts=-1)}).startswith(
        "its group g may start 0 more member(s)"
    )
    assert _group_reason(member, fit, {"g": ("a", 1, 0)}, starts) is None
    assert _group_reason(member, fit, {"g": ("c", 1, 0)}, {}) == (
        "its group g shares c this round, which has no room left for it"
    )
    # the budget left after this round's members against the cheapest option here
    budget = {"g": JobGroup(budget_usd=5.0)}
    assert _group_reason(member, fit, {"g": ("a", 1, 3_000_000)}, budget) == (
        "its group g has $2.00 of its budget left for new members; the cheapest option that fits now is "
        "expected to cost $2.50"
    )
    assert _group_reason(member, fit, {"g": ("a", 1, 2_500_000)}, budget) is None  # exactly enough
    assert _group_reason(member, fit, {}, {"g": JobGroup(budget_usd=1.0)}) == (
        "its group g has $1.00 of its budget left for new members; the cheapest option that fits now is "
        "expected to cost $1.50"
    )
    assert _group_reason(member, fit, {"g": ("b", 1, 6_000_000)}, budget).startswith(
        "its group g has $0 of its budget left"
    )


def test_tenant_and_group_usage_count_this_rounds_starts() -> None:
    choice: dict[str, int | None] = {"q1": 1, "q2": 0, "r": 0, "out": None}
    sol = Solution(choice=choice, objective_usd=0.0, greedy_objective_usd=0.0, status="optimal",
                   wall_time_s=0.0, lower_bound_usd=None)  # fmt: skip
    problem = [
        _pj([_c("a", 1)], job_id="out", tenant="v"),
        _pj([_c("a", 1), _c("b", 4, cost=2.0)], job_id="q1", group="g"),
        _pj([_c("b", 2, cost=1.25)], job_id="q2", group="g"),
        _pj([_c("a", 8)], job_id="r", unplaced=None, current=2, tenant="u"),
    ]
    assert _tenant_usage(problem, sol) == {"t": (6, 2), "u": (6, 0)}
    assert _group_usage(problem, sol) == {"g": ("b", 2, 3_250_000)}
    running = [RunningJob(job_id="r1", tenant="t", spec=spec("r1"), submit_s=0.0, pool="a", devices=3,
                          market="on_demand", placed_s=0.0) for _ in range(2)]  # fmt: skip
    cfg = SchedulerConfig(quotas={"t": TenantQuota(max_devices=8, max_jobs=3), "u": TenantQuota(max_jobs=1),
                                  "w": TenantQuota(max_devices=2)})  # fmt: skip
    assert _tenant_limits(cfg, running) == {
        "t": TenantLimit(2, 1), "u": TenantLimit(None, 1), "w": TenantLimit(2, None)
    }  # fmt: skip


def test_queued_progress_and_free_room() -> None:
    s = spec("q")
    assert [queued_progress(QueuedJob("q", "t", s, 0.0, progress_fraction=f)) for f in (-0.5, 0.25, 1.0)] == [
        0.0, 0.25, 0.999
    ]  # fmt: skip
    assert free_room(pool("p", "a100-80gb", 1.0, per_node=8, nodes=4, available=20)) == (2, 8)
    assert free_room(pool("p", "a100-80gb", 1.0, per_node=8, nodes=4, available=5)) == (0, 5)


def test_a_late_job_is_told_how_far_past_its_deadline_it_will_finish() -> None:
    from trainyard.schedule.candidates import price_option

    s = spec("dl2", measured={"step_time_s": {"a100-80gb": 4.0}}, objective={"deadline": "3h"})
    a100 = pool("a100", "a100-80gb", 3.0)
    (p,) = schedule_round([job(s, submit_s=0.0)], [a100], now_s=3600.0, config=CFG).placements
    p90_h = price_option(s, a100, 1, 0.0, CandidateCache()).expected_hours_p90
    over_s = 3600.0 + p90_h * 3600.0 - 3 * 3600.0
    assert over_s > 0
    assert p.reason.endswith(
        f"; misses its deadline: no option finishes by it any more (p90 finish {_fmt_dur(over_s)} after it)"
    )
    # 29 min 29 s after it reads as 29 min: the p90 run counts 3600 s an hour (a second more per hour of a
    # run over an hour long would make it past 29.5 min, read as 30)
    now = 3 * 3600.0 + 1769.0 - p90_h * 3600.0
    (p,) = schedule_round([job(s, submit_s=0.0)], [a100], now_s=now, config=CFG).placements
    assert p.reason.endswith("(p90 finish 29 min after it)") and p90_h > 1.0


def test_a_price_move_on_a_quarter_of_the_pools_reprices_only_those(monkeypatch: pytest.MonkeyPatch) -> None:
    from scheduler_paths import decisions

    import trainyard.schedule.round as rnd

    priced: list[list[str]] = []
    real = rnd.spec_grid

    def recording(s: Any, pools: Any, *args: Any, **kw: Any) -> Any:
        priced.append([p.name for p in pools])
        return real(s, pools, *args, **kw)

    monkeypatch.setattr(rnd, "spec_grid", recording)
    pools = [pool(n, "a100-80gb", price) for n, price in (("a", 2.0), ("b", 2.2), ("c", 2.4), ("d", 2.6))]
    jobs = [job(spec("j"))]
    cache = CandidateCache()

    def warm_and_fresh(ps: list[Pool]) -> Any:
        warm = rnd.schedule_round(jobs, ps, config=CFG, cache=cache)
        assert decisions(warm) == decisions(rnd.schedule_round(jobs, ps, config=CFG, cache=CandidateCache()))
        return warm

    assert warm_and_fresh(pools).placements[0].pool == "a" and priced == [["a", "b", "c", "d"]] * 2
    priced.clear()
    rnd.schedule_round(jobs, pools, config=CFG, cache=cache)  # nothing moved: nothing priced again
    assert priced == []
    # one of four prices moved (a quarter): only that pool is priced again, and the job follows it
    pools[2] = pools[2].model_copy(update={"price_usd_per_device_hour": 1.0})
    priced.clear()
    assert warm_and_fresh(pools).placements[0].pool == "c"
    assert priced == [["c"], ["a", "b", "c", "d"]]
    # two of four moved: everything is priced again
    pools[0] = pools[0].model_copy(update={"price_usd_per_device_hour": 0.5})
    pools[3] = pools[3].model_copy(update={"price_usd_per_device_hour": 3.0})
    priced.clear()
    assert warm_and_fresh(pools).placements[0].pool == "a"
    assert priced == [["a", "b", "c", "d"]] * 2
    # other pools (one more) are never answered from the four pools' prices
    more = [*pools, pool("e", "a100-80gb", 0.4)]
    assert warm_and_fresh(more).placements[0].pool == "e"
    assert warm_and_fresh(pools[:3]).placements[0].pool == "a"


def test_a_waiting_job_costs_the_objective_its_cheapest_later_price_and_its_wait() -> None:
    from trainyard.schedule.candidates import candidates_for

    m = {"step_time_s": {"a100-80gb": 1.0}}
    spot = pool("spot", "a100-80gb", 0.7, market="spot", available=0)  # reclaimed: cheapest, but full
    od = pool("od", "a100-80gb", 2.8)
    now = 1800.0

    def objective(s: Any, priority: int, deadline: float | None) -> tuple[float, float]:
        r = schedule_round([job(s, submit_s=600.0, priority=priority)], [spot, od], now_s=now, config=CFG)
        assert not r.placements and r.unplaced[0].job_id == s.name
        assert r.solver_status and r.greedy_objective_usd == pytest.approx(r.objective_usd)
        cands = [c for c in candidates_for(job_id="", tenant="", spec=s, pools=[spot, od], now_s=0.0,
                                           deadline_abs_s=None, config=CFG, cache=CandidateCache())
                 if c.feasible]  # fmt: skip
        if s.objective.minimize == "time":
            ref = min(c.expected_cost_usd + CFG.time_value_usd_per_hour * c.expected_hours for c in cands)
        else:
            ref = min(c.expected_cost_usd for c in cands)
        needed = min(c.expected_hours_p90 for c in cands) * 3600.0
        wait = waiting_cost_usd(priority=priority, reference_usd=ref, queued_s=now - 600.0, now_s=now,
                                deadline_abs_s=deadline, needed_s=needed, config=CFG)  # fmt: skip
        return r.objective_usd, ref + wait

    got, want = objective(spec("w", workload={"steps": 20000}, measured=m), 1, None)
    assert got == pytest.approx(want, rel=1e-12)
    got, want = objective(spec("d", workload={"steps": 20000}, measured=m, objective={"deadline": "48h"}), 0,
                          600.0 + 48 * 3600.0)  # fmt: skip
    assert got == pytest.approx(want, rel=1e-12)
    # a job that minimises time, with nothing free: its reference weighs the hours at the time value
    od = od.model_copy(update={"available_devices": 0})
    got, want = objective(spec("t", workload={"steps": 20000}, measured=m, objective={"minimize": "time"}), 0,
                          None)  # fmt: skip
    assert got == pytest.approx(want, rel=1e-12)


def _brute_dominators(grid: Any, order: Any) -> tuple[list[bool], list[float]]:
    """``dominators`` by its definition: an earlier row of the same pool taking no more devices, capacity
    or whole nodes, and the earliest finish among those."""
    has, first = [], []
    span = [int(n) if n > 1 else 0 for n in grid.nodes[order]]
    for j, rj in enumerate(order):
        fins = [
            float(grid.finish[ri])
            for i, ri in enumerate(order[:j])
            if grid.pool[ri] == grid.pool[rj]
            and grid.devices[ri] <= grid.devices[rj]
            and grid.capacity[ri] <= grid.capacity[rj]
            and span[i] <= span[j]
        ]
        has.append(bool(fins))
        first.append(min(fins, default=math.inf))
    return has, first


def test_an_option_is_dominated_by_an_earlier_one_of_its_pool_that_takes_no_more() -> None:
    import random

    import numpy as np

    from trainyard.schedule.grid import CandidateGrid
    from trainyard.schedule.round import _static, dominators, pareto_rows

    ps = [pool("a", "a100-80gb", 1.0, per_node=8), pool("b", "a100-80gb", 1.0, per_node=8)]
    rows = [  # (pool, devices, nodes, capacity, finish), cheapest first
        ("a", 1, 1, 1, 100.0), ("a", 2, 1, 2, 50.0), ("b", 2, 2, 2, 80.0), ("a", 1, 1, 1, 30.0),
        ("a", 16, 2, 16, 10.0), ("a", 8, 1, 8, 20.0), ("a", 12, 2, 16, 5.0), ("b", 4, 1, 4, 60.0),
        ("b", 2, 2, 2, 40.0),
    ]  # fmt: skip

    def grid_of(rs: Any, pools: Any) -> Any:
        cands = [
            replace(_c(p, d, nodes=n, objective=float(k)), capacity_devices=cap, finish_s=f)
            for k, (p, d, n, cap, f) in enumerate(rs)
        ]
        return CandidateGrid.of(cands, pools, ["on_demand"] * len(pools))

    g = grid_of(rows, ps)
    has, first = dominators(g, np.arange(len(rows)))
    # a whole-node gang (b's 2 devices on 2 nodes) does not dominate one node's 4 devices
    assert has.tolist() == [False, True, False, True, True, True, True, False, True]
    assert first.tolist() == [math.inf, 100.0, math.inf, 100.0, 30.0, 30.0, 20.0, math.inf, 80.0]
    two = [a.tolist() for a in dominators(grid_of(rows[:2], ps), np.arange(2))]
    assert two == [[False, True], [math.inf, 100.0]]
    assert [a.tolist() for a in dominators(grid_of(rows[:1], ps), np.arange(1))] == [[False], [math.inf]]
    # a long grid of three pools agrees with the definition (the grouping by pool must keep each pool's
    # rows in their order)
    rng = random.Random(5)
    three = [*ps, pool("c", "a100-80gb", 1.0, per_node=8)]
    big = []
    for _ in range(90):
        n = rng.choice([1, 1, 2, 3])
        d = rng.choice([1, 2, 4, 8]) if n == 1 else 8 * n
        big.append((rng.choice("abc"), d, n, d, float(rng.randrange(1, 500))))
    g = grid_of(big, three)
    has, first = dominators(g, np.arange(len(big)))
    assert (has.tolist(), first.tolist()) == _brute_dominators(g, np.arange(len(big)))
    # the options worth a place: not dominated, or (with a deadline) dominated only by ones finishing
    # after it, among those finishing by it
    static = _static(grid_of(rows, ps), ps, np.arange(2), ["on_demand", "on_demand"])
    assert static.order.tolist() == list(range(len(rows)))
    assert pareto_rows(static, None).tolist() == [0, 2, 7]
    assert pareto_rows(static, 25.0).tolist() == [4, 5]
    assert pareto_rows(static, 30.0).tolist() == [3]
    assert pareto_rows(static, 100.0).tolist() == [0, 2, 7]
    ok = np.ones(len(rows), dtype=bool)
    ok[[0, 5]] = False
    assert pareto_rows(static, None, ok).tolist() == [2, 7]
    assert pareto_rows(static, 25.0, ok).tolist() == [4]


def test_the_model_keeps_the_cheapest_few_rows_per_pool_and_the_seed_list() -> None:
    import numpy as np

    from trainyard.schedule.grid import CandidateGrid
    from trainyard.schedule.round import _prune_rows, _seed_rows

    ps = [pool("a", "a100-80gb", 1.0, per_node=8), pool("b", "a100-80gb", 1.0, per_node=8)]
    rs = [("a", 1), ("a", 2), ("a", 4), ("b", 1), ("a", 8), ("b", 2), ("b", 4), ("b", 8)]
    g = CandidateGrid.of([_c(p, d, objective=float(k)) for k, (p, d) in enumerate(rs)], ps, ["on_demand"] * 2)
    rows = np.arange(len(rs))
    key = lambda cs: [(c.pool, c.devices) for c in cs]  # noqa: E731
    cfg = SchedulerConfig(max_options_per_pool=2, max_options_per_job=3)
    assert key(_prune_rows(g, rows, cfg)) == [("a", 1), ("a", 2), ("b", 1)]
    assert key(_prune_rows(g, rows, cfg, limit=4)) == [("a", 1), ("a", 2), ("b", 1), ("b", 2)]
    three = SchedulerConfig(max_options_per_pool=3, max_options_per_job=10)
    assert key(_prune_rows(g, rows, three)) == [("a", 1), ("a", 2), ("a", 4), ("b", 1), ("b", 2), ("b", 4)]
    assert key(_prune_rows(g, rows[::-1], cfg)) == [("b", 8), ("b", 4), ("a", 8)]
    # the greedy seed's wider list: every row, or the cheapest few of them
    assert key(_seed_rows(g, rows, cfg)) == key(rs_c := [g.candidate(k) for k in rows]) and len(rs_c) == 8
    seeded = replace(cfg, seed_options_per_job=4)
    assert key(_seed_rows(g, rows, seeded)) == [("a", 1), ("a", 2), ("b", 1), ("b", 2)]


def test_free_room_decides_which_gangs_and_shares_fit_now() -> None:
    gang = spec(
        "gang", resources={"min_devices": 16, "max_devices": 16}, measured={"step_time_s": {"h100": 1.0}}
    )
    exact = pool("h", "h100", 4.0, per_node=8, nodes=4, available=16, inter_node_gbps=400.0)
    (p,) = schedule_round([job(gang)], [exact], config=CFG).placements  # two free nodes, two needed
    assert (p.pool, p.devices, p.nodes) == ("h", 16, 2)
    short = exact.model_copy(update={"available_devices": 15})
    r = schedule_round([job(gang)], [short], config=CFG)
    assert not r.placements
    # one whole node free (15 devices): the gang does not fit now, and is told so
    assert r.unplaced[0].reason.startswith(
        "no capacity now: needs 2 whole 8-device nodes; the only pool that can run it, h, has 15 of 32 "
        "devices"
    )
    one = spec("one", resources={"min_devices": 2, "max_devices": 2})
    partly = pool("a", "a100-80gb", 2.0, per_node=8, nodes=1, available=5)  # no whole node, 5 devices free
    (p,) = schedule_round([job(one)], [partly], config=CFG).placements
    assert (p.pool, p.devices) == ("a", 2)


def test_a_pinned_group_member_with_a_deadline_uses_only_its_pool() -> None:
    m = {"step_time_s": {"a100-80gb": 1.0, "h100": 0.5}}
    pools = [pool("a100", "a100-80gb", 2.0), pool("h100", "h100", 4.0)]
    on_time = QueuedJob("m1", "t", spec("m1", measured=m, objective={"deadline": "24h"}), 0.0, group="g")
    r = schedule_round([on_time], pools, config=CFG, groups={"g": JobGroup(pool="h100")})
    (p,) = r.placements
    assert p.pool == "h100" and "misses its deadline" not in p.reason
    assert p.reason.startswith("1 × h100 on_demand on h100: ") and p.reason.endswith("; group g shares h100")
    # a deadline no option on its pool can meet any more: placed there anyway, the miss named
    late = QueuedJob("m2", "t", spec("m2", measured=m, objective={"deadline": "10m"}), 0.0, group="g")
    (p,) = schedule_round([late], pools, config=CFG, groups={"g": JobGroup(pool="h100")}).placements
    assert p.pool == "h100" and "misses its deadline" in p.reason
    # without the pin, the on-time job goes to the cheaper pool and its reason names no miss
    free = QueuedJob("m3", "t", spec("m3", measured=m, objective={"deadline": "24h"}), 0.0)
    (p,) = schedule_round([free], pools, config=CFG).placements
    assert p.pool == "a100" and "misses its deadline" not in p.reason


def test_rounds_without_pareto_pruning_decide_the_same() -> None:
    m = {"step_time_s": {"t4": 8.0, "a100-80gb": 1.0}}
    s = spec("dl", measured=m, objective={"deadline": "3h"})
    pools = [pool("t4", "t4", 0.2), pool("a100", "a100-80gb", 3.0, per_node=4, nodes=2, available=2)]
    plain = replace(CFG, pareto_pruning=False)
    for cfg in (CFG, plain):
        (p,) = schedule_round([job(s)], pools, config=cfg).placements
        assert (p.pool, p.devices) == ("a100", 1), cfg.pareto_pruning


def test_a_rounds_answers_come_in_the_order_of_its_jobs() -> None:
    from test_scheduler_replan import long_spec, running

    a100 = pool("a100", "a100-80gb", 2.0, per_node=2, nodes=1, available=1)
    tpu = pool("tpu", "tpu-v4", 3.0)
    cuda = spec("cuda", requirements={"frameworks": ["cuda-kernels"]})
    jobs = [
        QueuedJob("lost", "t", spec("lost"), 0.0, group="gone"),  # its group's pool is not in the round
        # only the A100 pool can run it, and it has 1 of its 2 devices free: unplaced after the solve
        job(
            spec("big", resources={"min_devices": 2, "max_devices": 2}, requirements={"allow": ["a100-80gb"]})
        ),
        QueuedJob("pinned", "u", cuda, 0.0, group="on-tpu"),  # its group's pool cannot run it
        job(spec("ok")),
    ]
    groups = {"gone": JobGroup(pool="nowhere"), "on-tpu": JobGroup(pool="tpu")}
    r = schedule_round(jobs, [a100, tpu], config=CFG, groups=groups)
    assert [(u.job_id, u.tenant) for u in r.unplaced] == [("lost", "t"), ("big", "t"), ("pinned", "u")]
    assert r.unplaced[2].reason.startswith(
        "its group on-tpu runs on pool tpu, which cannot run it: no feasible option on any of 2 pools — tpu: "
        "requirements.frameworks"
    )
    assert [p.job_id for p in r.placements] == ["ok"]
    assert r.placements[0].reason.startswith("1 × a100-80gb on_demand on a100: ")
    # running jobs: two that move, in their order, with at most two alternatives named; one whose pool is
    # gone; one that stays because a queued job that can run only there takes the room it would move to
    s1, s2 = long_spec("r1"), long_spec("r2")
    dear = pool("dear", "a100-80gb", 4.0, available=0)
    cheap = [pool(f"c{i}", "a100-80gb", 1.0 + i / 100, nodes=1) for i in range(3)]
    r = schedule_round(
        [], [dear, *cheap], [running(s1, "dear"), running(s2, "dear")], now_s=7200.0, config=CFG
    )
    assert [p.job_id for p in r.placements] == ["r1", "r2"] and all(p.migration for p in r.placements)
    assert all(len(p.alternatives) == 2 for p in r.placements)
    only = pool("only", "a100-80gb", 1.0, nodes=1)
    only_a100 = spec("q", requirements={"allow": ["a100-80gb"]}, workload={"steps": 20000},
                     measured={"step_time_s": {"a100-80gb": 1.0}})  # fmt: skip
    urgent = QueuedJob("q", "t", only_a100, 0.0, priority=6)
    rs = [running(s1, "dear"), running(s2, "gone")]
    r = schedule_round([urgent], [dear, only], rs, now_s=7200.0, config=CFG)
    assert [(p.job_id, p.pool) for p in r.placements] == [("q", "only")]
    assert r.kept == ("r1", "r2")


def test_a_deadline_job_is_reconsidered_as_its_deadline_nears_on_one_cache() -> None:
    m = {"step_time_s": {"t4": 8.0, "a100-80gb": 1.0}}
    pools = [pool("t4", "t4", 0.2), pool("a100", "a100-80gb", 3.0)]
    cache = CandidateCache()
    s = spec("dl", measured=m, objective={"deadline": "3h"})
    assert schedule_round([job(s)], pools, config=CFG, cache=cache).placements[0].pool == "a100"
    # an hour and a half later, the same spec submitted 3 h ago has no time left (its options are not the
    # ones of the job whose deadline plus clock was the same 3 h)
    (p,) = schedule_round([job(s, submit_s=-5400.0)], pools, now_s=5400.0, config=CFG, cache=cache).placements
    assert p.pool == "t4" and "misses its deadline" in p.reason
    # ten hours later (re-queued), nothing can make it any more: the cheapest option, the miss named
    (p,) = schedule_round([job(s)], pools, now_s=10 * 3600.0, config=CFG, cache=cache).placements
    assert p.pool == "t4" and "misses its deadline" in p.reason
    # two specs in one round are screened each on its own (the CUDA-only one cannot use the TPU)
    cuda = spec("cuda", requirements={"frameworks": ["cuda-kernels"]}, measured=m)
    tpu = pool("tpu", "tpu-v4", 0.1)
    r = schedule_round([job(spec("any")), job(cuda)], [tpu, *pools], config=CFG, cache=cache)
    where = {p.job_id: p.pool for p in r.placements}
    assert where["cuda"] != "tpu" and where["any"] == "tpu"


def test_hours_read_to_the_tenth() -> None:
    # 10.05 h (36,190 s) reads as 10.1 h, 10.049 h as 10.0 h
    assert _fmt_dur(36190.0) == "10.1 h"
    free = {"a": pool("a", "a100-80gb", 1.0, per_node=8)}
    long = _c("a", 1, cost=20.0, hours=10.049)
    assert _placement_reason(long, [long], [long], [long], free) == (
        "1 × a100-80gb on_demand on a: $20.00, ~10.0 h — the only feasible option"
    )


def test_a_placement_names_the_cheaper_option_that_is_full_and_why() -> None:
    # the cheaper option is a gang of 8 that the pool's 5 free devices cannot hold, though one device fits
    pools_ = {"a": pool("a", "a100-80gb", 1.0, per_node=8, nodes=1, available=5),
              "b": pool("b", "a100-80gb", 1.0, per_node=8)}  # fmt: skip
    gang = _c("a", 8, cost=5.0)
    one = _c("a", 1, cost=9.0)
    chosen = _c("b", 1, cost=10.0)
    assert _placement_reason(chosen, [one, chosen], [gang, one, chosen], [gang, one, chosen], pools_) == (
        "1 × a100-80gb on_demand on b: $10.00, ~2.0 h — cheaper 8 × a100-80gb on_demand on a is full "
        "(needs 8 × a100-80gb in one node on a; 5 available); next: 8 × a $5.00, 1 × a $9.00"
    )


def test_group_and_quota_limits_hold_a_job_back_only_once_reached() -> None:
    fit = [_c("a", 1, cost=2.5), _c("b", 1, cost=1.5)]
    member = _pj(group="g")
    # nothing fits now: the capacity reason says why, even when the group's starts are used up
    assert _group_reason(member, [], {"g": ("a", 2, 0)}, {"g": JobGroup(max_starts=2)}) is None
    # a budget of exactly the cheapest option, with no member started this round, still starts it
    assert _group_reason(member, fit, {}, {"g": JobGroup(budget_usd=1.5)}) is None
    pools_ = {n: pool(n, "a100-80gb", 1.0, available=0) for n in ("a", "b", "c")}
    later = "cheapest feasible later: 1 × a100-80gb on_demand on a at $10.00"
    three = [_c("a", 1), _c("b", 1), _c("c", 1)]
    assert _unplaced_reason(_pj(), three, [], {}, pools_, {}).endswith(
        "needs 1 × a100-80gb in one node on b; 0 available (and 1 more pools); " + later
    )
    # a tenant that took nothing this round has its whole quota: exactly the smallest option's devices, or
    # one job left, is room enough
    fits = [_c("a", 2, objective=99.0)]
    for quota in (TenantLimit(devices_left=2, jobs_left=None), TenantLimit(devices_left=None, jobs_left=1)):
        assert _unplaced_reason(_pj(fits), fits, fits, {}, pools_, {"t": quota}).startswith(
            "the pools that fit it now (a) are taken"
        ), quota
    # a job whose wait costs nothing: any option available now costs more than waiting
    free = [_c("a", 1, objective=0.5)]
    assert _unplaced_reason(_pj(free, unplaced=0.0), free, free, {}, pools_, {}).startswith(
        "waiting is cheaper: best option available now is 1 × a100-80gb on_demand on a at $10.00"
    )


def test_a_placement_carries_its_option_and_the_solvers_bound() -> None:
    s = spec("j", measured={"step_time_s": {"a100-80gb": 1.0}}, objective={"markets": ["on_demand"]})
    pools = [pool("a", "a100-80gb", 1.0), pool("b", "a100-80gb", 1.5), pool("c", "a100-80gb", 2.0)]
    r = schedule_round([job(s, tenant="team")], pools, config=CFG)
    (p,) = r.placements
    by_cost = {a.pool: a for a in p.alternatives}
    assert (p.job_id, p.tenant, p.pool, p.accelerator, p.devices, p.market) == (
        "j", "team", "a", "a100-80gb", 1, "on_demand"
    )  # fmt: skip
    assert p.expected_hours > 0 and p.expected_hours == pytest.approx(by_cost["b"].expected_hours)
    assert p.reason.startswith("1 × a100-80gb on_demand on a: ")
    assert " — cheapest of 3 feasible options; next: 1 × b " in p.reason
    assert r.lower_bound_usd is not None and r.lower_bound_usd <= r.objective_usd + 1e-6


def test_the_greedy_seed_keeps_a_second_option_for_the_job_that_loses_the_first() -> None:
    # one option per job in the model: both jobs' cheapest is the single free device of "one"; the greedy
    # seed over the wider list gives the lower-priority job the dearer pool, so it starts there this round
    m = {"step_time_s": {"a100-80gb": 1.0}}
    pools = [pool("one", "a100-80gb", 1.0, nodes=1), pool("dear", "a100-80gb", 1.1)]
    cfg = replace(CFG, max_options_per_job=1)
    lo = job(spec("lo", measured=m, workload={"steps": 20000}), priority=0)
    hi = job(spec("hi", measured=m, workload={"steps": 20000}), priority=3)
    r = schedule_round([lo, hi], pools, config=cfg)
    assert [(p.job_id, p.pool) for p in r.placements] == [("lo", "dear"), ("hi", "one")]
    assert not r.unplaced
    assert " — cheaper options taken by higher-value jobs this round" in r.placements[0].reason


def test_a_late_jobs_reason_is_its_placement_and_then_the_miss() -> None:
    s = spec("dl2", measured={"step_time_s": {"a100-80gb": 4.0}}, objective={"deadline": "3h"})
    (p,) = schedule_round([job(s, submit_s=0.0)], [pool("a100", "a100-80gb", 3.0)], now_s=3600.0,
                          config=CFG).placements  # fmt: skip
    assert p.reason.startswith("1 × a100-80gb on_demand on a100: $")
    assert " — the only feasible option; misses its deadline: " in p.reason


def test_the_rounds_clock_defaults_to_zero() -> None:
    import trainyard.schedule.round as rnd

    s = spec("j", workload={"steps": 20000}, measured={"step_time_s": {"a100-80gb": 1.0}})
    full = [pool("a", "a100-80gb", 1.0, available=0)]  # the job waits: its waiting cost is the objective
    queued = [job(s, submit_s=-7200.0)]
    at_zero = rnd.schedule_round(queued, full, now_s=0.0, config=CFG)
    assert rnd.schedule_round(queued, full, config=CFG).objective_usd == at_zero.objective_usd
    assert rnd.schedule_round(queued, full, now_s=1.0, config=CFG).objective_usd != at_zero.objective_usd


def test_a_deadline_or_pinned_job_is_explained_with_its_own_options() -> None:
    m = {"step_time_s": {"a100-80gb": 1.0, "h100": 0.5}}
    pools = [pool("a100", "a100-80gb", 2.0), pool("h100", "h100", 4.0)]
    # pinned to h100 with a deadline it meets: the other pool is neither counted nor named
    on_time = QueuedJob("m1", "t", spec("m1", measured=m, objective={"deadline": "24h"}), 0.0, group="g")
    (p,) = schedule_round([on_time], pools, config=CFG, groups={"g": JobGroup(pool="h100")}).placements
    assert p.pool == "h100" and all(a.pool == "h100" for a in p.alternatives)
    assert "a100" not in p.reason
    # deadline jobs held back by their tenant's job quota are told so (they do fit now)
    cfg = replace(CFG, quotas={"team": TenantQuota(max_jobs=1)})
    jobs = [job(spec(f"d{i}", measured=m, objective={"deadline": "24h"}), tenant="team") for i in range(2)]
    r = schedule_round(jobs, pools, config=cfg)
    assert len(r.placements) == 1
    (u,) = r.unplaced
    assert u.reason.startswith("tenant team is at its concurrent-job quota; ")


def test_kept_jobs_come_in_the_order_of_the_running_jobs() -> None:
    from test_scheduler_replan import long_spec, running

    dear = pool("dear", "a100-80gb", 4.0, available=0)
    only = pool("only", "a100-80gb", 1.0, nodes=1)
    only_a100 = spec("q", requirements={"allow": ["a100-80gb"]}, workload={"steps": 20000},
                     measured={"step_time_s": {"a100-80gb": 1.0}})  # fmt: skip
    urgent = QueuedJob("q", "t", only_a100, 0.0, priority=6)
    # "z" could move to "only" but the urgent job takes it; "a" runs on a pool outside the round
    rs = [running(long_spec("z"), "dear"), running(long_spec("a"), "gone")]
    r = schedule_round([urgent], [dear, only], rs, now_s=7200.0, config=CFG)
    assert [(p.job_id, p.pool) for p in r.placements] == [("q", "only")]
    assert r.kept == ("z", "a")


def test_a_requeued_job_is_priced_for_the_work_it_has_left() -> None:
    from trainyard.schedule.candidates import price_option

    s = spec("half", workload={"steps": 20000}, measured={"step_time_s": {"a100-80gb": 1.0}})
    a100 = pool("a100", "a100-80gb", 2.0)
    half = QueuedJob("half", "t", s, 0.0, progress_fraction=0.5)
    (p,) = schedule_round([half], [a100], config=CFG).placements
    left = price_option(s, a100, 1, 0.5, CandidateCache())
    assert p.expected_cost_usd == left.expected_cost_usd
    assert p.expected_cost_usd < price_option(s, a100, 1, 0.0, CandidateCache()).expected_cost_usd


def test_a_price_move_reprices_a_requeued_job_for_its_work_left_and_time_value() -> None:
    from trainyard.schedule.candidates import price_option

    s = spec("half", workload={"steps": 20000}, measured={"step_time_s": {"a100-80gb": 1.0}},
             objective={"minimize": "time"})  # fmt: skip
    half = QueuedJob("half", "t", s, 0.0, progress_fraction=0.5)
    pools = [pool(n, "a100-80gb", price) for n, price in (("a", 2.0), ("b", 2.2), ("c", 2.4), ("d", 2.6))]
    cfg = replace(CFG, time_value_usd_per_hour=10.0)
    cache = CandidateCache()
    assert schedule_round([half], pools, config=cfg, cache=cache).placements[0].pool == "a"
    # one price of four moves: only that pool is priced again, for the half left and at this time value
    pools[2] = pools[2].model_copy(update={"price_usd_per_device_hour": 1.0})
    r = schedule_round([half], pools, config=cfg, cache=cache)
    (p,) = r.placements
    left = price_option(s, pools[2], 1, 0.5, CandidateCache())
    assert (p.pool, p.expected_cost_usd) == ("c", left.expected_cost_usd)
    assert r.objective_usd == pytest.approx(left.expected_cost_usd + 10.0 * left.expected_hours, rel=1e-9)


def test_a_jobs_model_options_are_the_undominated_ones_that_fit_now() -> None:
    # one node of 2 free devices on "a"; "b" is dearer; two cheaper pools are full. Per job the model keeps
    # two options, and the greedy seed looks at two
    m = {"step_time_s": {"a100-80gb": 1.0}}
    jobs = [job(spec(n, resources={"min_devices": 1, "max_devices": 2}, measured=m)) for n in ("x", "y", "z")]
    pools = [pool("full1", "a100-80gb", 0.8, per_node=2, available=0),
             pool("full2", "a100-80gb", 0.85, per_node=2, available=0),
             pool("a", "a100-80gb", 1.0, per_node=2, nodes=1),
             pool("b", "a100-80gb", 1.12, per_node=2)]  # fmt: skip
    cfg = replace(CFG, max_options_per_job=2, seed_options_per_job=2)
    # the full pools take no place, nor does the 2-device option on "a" (it costs more and takes more than
    # the 1-device one): each job keeps 1 device on "a" and on "b", and the third job goes to "b"
    r = schedule_round(jobs, pools, config=cfg)
    placed = [(p.job_id, p.pool, p.devices) for p in r.placements]
    assert placed == [("x", "a", 1), ("y", "a", 1), ("z", "b", 1)]
    # without the pruning, the dominated 2 devices on "a" (dearer than 1, cheaper than "b") take the second
    # place: the third job has no option left that fits
    r = schedule_round(jobs, pools, config=replace(cfg, pareto_pruning=False))
    assert [(p.job_id, p.pool) for p in r.placements] == [("x", "a"), ("y", "a")]
    assert [u.job_id for u in r.unplaced] == ["z"]


def test_a_deadline_its_p90_run_meets_exactly_or_by_half_a_second_is_met() -> None:
    from trainyard.schedule.candidates import price_option

    s = spec("dl2", measured={"step_time_s": {"a100-80gb": 4.0}}, objective={"deadline": "3h"})
    a100 = pool("a100", "a100-80gb", 3.0)
    p90_s = price_option(s, a100, 1, 0.0, CandidateCache()).expected_hours_p90 * 3600.0
    assert p90_s < 3 * 3600.0
    exact = 3 * 3600.0 - p90_s
    while 3 * 3600.0 - exact > p90_s:  # the clock at which the time left is the p90 run to the last bit
        exact = math.nextafter(exact, math.inf)
    assert 3 * 3600.0 - exact == p90_s
    for now, misses in ((exact - 0.5, False), (exact, False), (exact + 0.5, True)):
        # submitted at 0: the deadline is at 3 h; alone, and as a member of a group pinned to the pool
        (p,) = schedule_round([job(s)], [a100], now_s=now, config=CFG).placements
        assert ("misses its deadline" in p.reason) is misses, now - exact
        member = QueuedJob("m", "t", s, 0.0, group="g")
        (p,) = schedule_round(
            [member], [a100], now_s=now, config=CFG, groups={"g": JobGroup(pool="a100")}
        ).placements
        assert ("misses its deadline" in p.reason) is misses, now - exact


def test_a_round_predicts_its_new_specs_in_one_batch_once_each(monkeypatch: pytest.MonkeyPatch) -> None:
    from collections import Counter

    from scheduler_paths import decisions

    import trainyard.schedule.candidates as cands
    import trainyard.schedule.round as rnd

    batches: list[list[str]] = []
    calls: Counter[str] = Counter()
    real_many = rnd.prefetch_predictions_many

    def batched(work: Any, cache: Any) -> Any:
        batches.append([s.name for s, _ in work])
        return real_many(work, cache)

    monkeypatch.setattr(rnd, "prefetch_predictions_many", batched)
    for name in ("predict", "predict_many"):  # the predictor called spec by spec
        real = getattr(cands, name)

        def counting(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            calls[_name] += 1
            return _real(*args, **kw)

        monkeypatch.setattr(cands, name, counting)
    pools = [pool(n, "a100-80gb", price) for n, price in (("a", 2.0), ("b", 2.2), ("c", 2.4), ("d", 2.6))]
    first = list(pools)
    sa, sb = spec("a"), spec("b", model={"d_model": 1024, "n_heads": 8})
    sc = spec("c", model={"d_model": 3072, "n_heads": 24})
    # "a2" is the spec of "a" under another name: one spec to price
    queue = [job(sa), QueuedJob("a2", "t", spec("a2"), 0.0), job(sb)]
    cache = CandidateCache()

    def round_(jobs: list[QueuedJob], ps: list[Pool]) -> None:
        warm = rnd.schedule_round(jobs, ps, config=CFG, cache=cache)
        batches.append(["(fresh)"])  # the same round on a fresh cache decides alike
        assert decisions(warm) == decisions(rnd.schedule_round(jobs, ps, config=CFG, cache=CandidateCache()))

    round_(queue, pools)
    assert batches[0] == ["a", "b"] and calls == {}
    batches.clear()
    round_(queue, pools)  # every spec's candidates are memoised: nothing to predict
    assert batches[0] == ["(fresh)"] and calls == {}
    # one price moved: the memoised specs are priced again on their predictions, the new one predicted
    pools[1] = pools[1].model_copy(update={"price_usd_per_device_hour": 1.0})
    batches.clear()
    round_([job(sa), job(sb), job(sc)], pools)
    assert batches[0] == ["c"] and calls == {}
    # three of four moved: every spec is priced again from its screening and predictions ...
    far = [
        p.model_copy(update={"price_usd_per_device_hour": 9.0}) if i != 2 else p for i, p in enumerate(pools)
    ]
    batches.clear()
    round_([job(sa), job(sb), job(sc)], far)
    assert batches[0] == ["a", "b", "c"] and calls == {}
    # ... and back at the first prices, the first round's candidates answer for "a" and "b" (never for "c")
    batches.clear()
    round_([job(sa), job(sb), job(sc)], first)
    assert batches[0] == ["c"] and calls == {}


def test_a_pinned_deadline_jobs_urgency_is_its_own_pools_fastest_run() -> None:
    from trainyard.schedule.candidates import candidates_for

    # pinned to the T4 pool (full now), with an A100 pool elsewhere twice as fast: its wait is as urgent
    # as the T4's run to the deadline, and the reference is the T4's cost
    m = {"step_time_s": {"t4": 2.0, "a100-80gb": 1.0}}
    s = spec("m", measured=m, objective={"deadline": "3h"})
    t4, a100 = pool("t4", "t4", 0.2, available=0), pool("a100", "a100-80gb", 3.0)
    member = QueuedJob("m", "t", s, 0.0, group="g")
    r = schedule_round([member], [t4, a100], config=CFG, groups={"g": JobGroup(pool="t4")})
    assert not r.placements and [u.job_id for u in r.unplaced] == ["m"]
    (c,) = candidates_for(job_id="", tenant="", spec=s, pools=[t4], now_s=0.0, deadline_abs_s=None,
                          config=CFG, cache=CandidateCache())  # fmt: skip
    wait = waiting_cost_usd(priority=0, reference_usd=c.expected_cost_usd, queued_s=0.0, now_s=0.0,
                            deadline_abs_s=3 * 3600.0, needed_s=c.expected_hours_p90 * 3600.0,
                            config=CFG)  # fmt: skip
    assert r.objective_usd == pytest.approx(c.expected_cost_usd + wait, rel=1e-12)


def test_the_greedy_pass_places_the_more_pressing_job_first() -> None:
    # one device for two jobs: the higher-priority "b" has the larger waiting cost, so the greedy pass
    # already gives it the device (and reaches the optimum); in name order "a" would come first
    m = {"step_time_s": {"a100-80gb": 1.0}}
    pools = [pool("a100", "a100-80gb", 2.0, nodes=1)]
    r = schedule_round(
        [job(spec("a", measured=m)), job(spec("b", measured=m), priority=3)], pools, config=CFG
    )
    assert [p.job_id for p in r.placements] == ["b"]
    assert r.greedy_objective_usd == pytest.approx(r.objective_usd, rel=1e-12)


def test_the_greedy_seed_keeps_within_a_groups_start_limit() -> None:
    # one job's option per model, plus the greedy seed's pick. Pools p (1 device) < q (2) < r in price; in
    # the order of their priorities y takes p, m1 starts its group on q, m2 may not start (one start), so x
    # is seeded with q's second device. A seed that let m2 start would have left x only r
    m = {"step_time_s": {"a100-80gb": 1.0}}
    s = spec("s", measured=m)
    pools = [pool("p", "a100-80gb", 1.0, nodes=1), pool("q", "a100-80gb", 1.1, nodes=2),
             pool("r", "a100-80gb", 1.2)]  # fmt: skip
    jobs = [QueuedJob("y", "t", s, 0.0, priority=3), QueuedJob("m1", "t", s, 0.0, priority=2, group="g"),
            QueuedJob("m2", "t", s, 0.0, priority=1, group="g"), QueuedJob("x", "t", s, 0.0)]  # fmt: skip
    r = schedule_round(jobs, pools, config=replace(CFG, max_options_per_job=1),
                       groups={"g": JobGroup(max_starts=1)})  # fmt: skip
    assert [(p.job_id, p.pool) for p in r.placements] == [("y", "p"), ("m1", "q"), ("x", "q")]
    assert [u.job_id for u in r.unplaced] == ["m2"]


def test_a_rounds_time_limit_is_its_searchs(monkeypatch: pytest.MonkeyPatch) -> None:
    import trainyard.schedule.round as rnd
    import trainyard.schedule.solver as solver

    limits: list[float] = []
    real = solver.set_parameters

    def recording(cp: Any, config: SchedulerConfig, limit_s: float) -> None:
        limits.append(limit_s)
        real(cp, config, limit_s)

    monkeypatch.setattr(solver, "set_parameters", recording)
    # three 2-device jobs, room for one on x (3 of its 4 devices free) and one on y: the LP bound does not
    # prove its rounding here, so the search runs, under the round's limit rather than the configuration's
    jobs = [job(spec(n, resources={"min_devices": 2, "max_devices": 2})) for n in ("a", "b", "c")]
    pools = [
        pool("x", "a100-80gb", 1.0, per_node=4, nodes=1, available=3),
        pool("y", "a100-80gb", 1.5, per_node=2, nodes=1),
    ]
    rnd.schedule_round(jobs, pools, config=CFG, cache=CandidateCache(), time_limit_s=0.05)
    rnd.schedule_round(jobs, pools, config=CFG, cache=CandidateCache())
    assert limits == [0.05, CFG.time_limit_s]


def test_a_round_predicts_nothing_on_a_pool_the_spec_cannot_use() -> None:
    import trainyard.schedule.round as rnd

    # a CUDA-only job and a TPU pool: the TPU is screened out, so nothing is predicted for it
    cuda = spec("cuda", requirements={"frameworks": ["cuda-kernels"]})
    cache = CandidateCache()
    pools = [pool("a100", "a100-80gb", 2.0), pool("tpu", "tpu-v4", 1.0)]
    (p,) = rnd.schedule_round([job(cuda)], pools, config=CFG, cache=cache).placements
    assert p.pool == "a100"
    assert [k[1] for k in cache.predictions] == ["a100-80gb"]
