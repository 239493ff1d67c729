"""Candidate pricing: predictions shared per workload shape, the pool's topology, queued progress."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from scheduler_paths import both_pricing_paths  # noqa: F401
from test_scheduler_round import CFG, job, pool, spec

from trainyard.cost.quote import AllocationTimes, QuoteOption, option_for
from trainyard.schedule import CandidateCache, QueuedJob, SchedulerConfig, schedule_round
from trainyard.schedule.candidates import (
    candidates_for,
    capacity_reason,
    device_counts,
    eligibility,
    fits_now,
    price_option,
    screen_key,
    to_candidate,
)
from trainyard.schedule.types import Candidate

# every round runs on the vectorised pricing and on the scalar reference, which must decide alike
pytestmark = pytest.mark.usefixtures("both_pricing_paths")

BIG = {
    "model": {"n_layers": 32, "d_model": 4096, "n_heads": 32, "vocab_size": 32000},
    "workload": {"seq_len": 2048, "global_batch": 64, "steps": 1000},
    "resources": {"min_devices": 16, "max_devices": 16},
}


def test_predictions_are_shared_by_jobs_of_one_shape() -> None:
    pools = [pool("a", "a100-80gb", 2.0), pool("h", "h100-80gb", 3.5)]
    cache = CandidateCache()
    schedule_round([job(spec("one"))], pools, config=CFG, cache=cache)
    n = len(cache.predictions)
    assert n > 0
    # other name, length, deadline and budget: same shape, no new prediction
    other = spec("two", workload={"steps": 7000}, objective={"deadline": "48h", "budget_usd": 500.0})
    schedule_round([job(other)], pools, config=CFG, cache=cache)
    assert len(cache.predictions) == n
    from trainyard.schedule.candidates import shape_key

    assert shape_key(other) == shape_key(spec("one"))
    # a different shape (batch) is predicted anew
    wider = spec("three", workload={"global_batch": 16})
    assert shape_key(wider) != shape_key(spec("one"))
    schedule_round([job(wider)], pools, config=CFG, cache=cache)
    assert len(cache.predictions) > n


def test_step_times_use_the_pools_topology_as_quotes_do() -> None:
    s = spec("big", **BIG)
    cache = CandidateCache()  # one cache for both pools: the topology is part of the key
    slow = pool("slow", "h100-80gb", 3.0, per_node=8, nodes=2, inter_node_gbps=10.0)
    fast = pool("fast", "h100-80gb", 3.0, per_node=8, nodes=2, inter_node_gbps=400.0)
    for p in (fast, slow, fast):
        ours = price_option(s, p, 16, 0.0, cache)
        assert ours.step_time_s == option_for(s, p, 16).step_time_s
        assert ours.expected_cost_usd == option_for(s, p, 16).expected_cost_usd
    # the slow network does make a difference (so the comparison above can fail)
    assert (
        price_option(s, slow, 16, 0.0, cache).step_time_s > price_option(s, fast, 16, 0.0, cache).step_time_s
    )


def test_a_requeued_job_is_priced_for_its_remaining_work() -> None:
    s = spec("resume")
    pools = [pool("a", "a100-80gb", 2.0)]
    cache = CandidateCache()
    fresh = schedule_round([job(s)], pools, config=CFG, cache=cache).placements[0]
    half = QueuedJob(job_id="resume", tenant="t", spec=s, submit_s=0.0, progress_fraction=0.5)
    again = schedule_round([half], pools, config=CFG, cache=cache).placements[0]
    want = option_for(s, pools[0], 1, elapsed_fraction=0.5)
    assert again.expected_cost_usd == want.expected_cost_usd
    assert again.expected_cost_usd < 0.6 * fresh.expected_cost_usd
    assert QueuedJob(job_id="x", tenant="t", spec=s, submit_s=0.0).progress_fraction == 0.0


def test_spec_and_pool_keys_are_memoised_per_object() -> None:
    from trainyard.schedule.candidates import base_key, pool_price_key, shape_key, spec_key

    cache = CandidateCache()
    one, same = spec("one"), spec("one")
    p = pool("a", "a100-80gb", 2.0)
    for _ in range(2):
        assert cache.key(one) == cache.key(same) == spec_key(one)
        assert cache.base(one) == base_key(one) and cache.shape(one) == shape_key(one)
        assert cache.pool_key(p) == pool_price_key(p)
        assert cache.facts(one) is cache.facts(one)
    # one entry per object, not per call; an equal spec that is another object has its own
    assert len(cache._keys) == 2 and len(cache._bases) == 1 and len(cache._pool_keys) == 1
    assert cache.facts(one) is not cache.facts(same)


def test_free_room_decides_fits_now_alike() -> None:
    """The round reads each pool's room once (``free_room``); it must say what ``fits_now`` says."""
    from dataclasses import replace as dc_replace

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from trainyard.schedule.round import free_room

    sp = spec("room")
    base = CandidateCache()
    template_pool = pool("p", "a100-40gb", 1.0, per_node=8, nodes=2)
    opt = price_option(sp, template_pool, 1, 0.0, base)
    cand = to_candidate(job_id="j", tenant="t", spec=sp, pool=template_pool, option=opt, now_s=0.0,
                        deadline_abs_s=None, config=CFG)  # fmt: skip

    @settings(max_examples=200, deadline=None)
    @given(per_node=st.integers(1, 16), nodes=st.integers(1, 8), free=st.integers(0, 128),
           devices=st.integers(1, 128))  # fmt: skip
    def check(per_node: int, nodes: int, free: int, devices: int) -> None:
        p = template_pool.model_copy(
            update={"devices_per_node": per_node, "nodes": nodes,
                    "available_devices": min(free, per_node * nodes)}
        )  # fmt: skip
        n = max(1, -(-devices // per_node))
        c = dc_replace(cand, devices=devices, nodes=n, devices_per_node=per_node)
        whole, single = free_room(p)
        assert fits_now(c, p) == (c.nodes <= whole if c.nodes > 1 else c.devices <= single)

    check()


# ---- one option as the scheduler sees it (``to_candidate``) ----------------------------------------------
GANG = {"resources": {"min_devices": 16, "max_devices": 16}}


def _quote(s, p, devices: int, **over: Any) -> QuoteOption:
    opt = price_option(s, p, devices, 0.0, CandidateCache())
    assert opt.feasible, opt.reason
    return replace(opt, **over)


def _candidate(s, p, opt, *, now_s: float = 0.0, deadline: float | None = None, config=CFG) -> Candidate:
    return to_candidate(job_id="j", tenant="t", spec=s, pool=p, option=opt, now_s=now_s,
                        deadline_abs_s=deadline, config=config)  # fmt: skip


def test_a_candidate_is_its_quote_on_the_pools_shape() -> None:
    s = spec("gang", **GANG)
    p = pool("h", "h100", 4.0, per_node=8, nodes=2, inter_node_gbps=400.0)
    opt = _quote(s, p, 16)
    # the p90 differs from the mean, so a candidate that took one for the other would show
    assert opt.expected_hours_p90 > opt.expected_hours > 0
    c = _candidate(s, p, opt, now_s=100.0)
    assert c == Candidate(
        job_id="j", tenant="t", pool="h", accelerator=p.accelerator, devices=16, nodes=2, devices_per_node=8,
        market="on_demand", expected_cost_usd=opt.expected_cost_usd, expected_hours=opt.expected_hours,
        expected_hours_p90=opt.expected_hours_p90, step_time_s=opt.step_time_s,
        price_usd_per_hour=opt.price_usd_per_hour, checkpoint_interval_s=opt.checkpoint_interval_s,
        finish_s=100.0 + opt.expected_hours_p90 * 3600.0, feasible=True, reasons=(), capacity_devices=16,
        objective_usd=opt.expected_cost_usd,
    )  # fmt: skip
    # a gang of 12 on 8-device nodes takes two whole nodes; a share of one node takes only its devices
    twelve = _candidate(s, p, replace(opt, devices=12))
    assert (twelve.devices, twelve.nodes, twelve.capacity_devices) == (12, 2, 16)
    one = spec("one", resources={"min_devices": 1, "max_devices": 8})
    share = _candidate(one, p, _quote(one, p, 2))
    assert (share.devices, share.nodes, share.devices_per_node, share.capacity_devices) == (2, 1, 8, 2)
    # a quote without a pessimistic time finishes at its expected time; no checkpoints is 0, not None
    flat = _candidate(s, p, replace(opt, expected_hours_p90=0.0, checkpoint_interval_s=0.0), now_s=100.0)
    assert flat.expected_hours_p90 == opt.expected_hours
    assert flat.finish_s == 100.0 + opt.expected_hours * 3600.0
    assert flat.checkpoint_interval_s == 0.0


def test_a_candidate_names_the_first_thing_that_rules_it_out() -> None:
    s = spec("gang", **GANG)
    p = pool("h", "h100", 4.0, per_node=8, nodes=2, inter_node_gbps=100.0)
    opt = _quote(s, p, 16)
    rejected = _candidate(s, p, replace(opt, feasible=False, reason="the model does not fit"))
    assert not rejected.feasible and rejected.reasons == ("the model does not fit",)
    silent = _candidate(s, p, replace(opt, feasible=False, reason=""))
    assert silent.reasons == ("the cost model rejected this option",)
    # a market the job does not allow, with two allowed
    od = spec("od", objective={"markets": ["on_demand", "reserved"]}, **GANG)
    spot = _candidate(od, p, replace(opt, market="spot"))
    assert spot.reasons == ("objective.markets: spot is not in on_demand, reserved",) and not spot.feasible
    assert spot.market == "spot"
    # more nodes than the pool has (two are all it has, and fit)
    assert _candidate(s, p, replace(opt, devices=24)).reasons == ("needs 3 nodes of 8 × h100; h has 2",)
    assert _candidate(s, p, opt).feasible
    # the inter-node network, below, at and (on one node) not needed
    fast = spec("fast", resources={"min_devices": 16, "max_devices": 16, "min_interconnect_gbps": 200})
    assert _candidate(fast, p, opt).reasons == (
        "spans 2 nodes but h's inter-node network gives 100 Gbps per device < "
        "resources.min_interconnect_gbps 200",
    )
    at = spec("at", resources={"min_devices": 16, "max_devices": 16, "min_interconnect_gbps": 100})
    assert _candidate(at, p, opt).feasible
    assert _candidate(fast, p, replace(opt, devices=8)).feasible
    # a pool that states no network has its accelerator's (A100: 50 Gbit/s per device)
    a100 = pool("a", "a100-80gb", 2.0, per_node=8, nodes=2)
    slow = _candidate(fast, a100, _quote(s, a100, 16))
    assert slow.reasons == (
        "spans 2 nodes but a's inter-node network gives 50 Gbps per device < "
        "resources.min_interconnect_gbps 200",
    )
    at50 = spec("at50", resources={"min_devices": 16, "max_devices": 16, "min_interconnect_gbps": 50})
    assert _candidate(at50, a100, _quote(s, a100, 16)).feasible
    # only the first reason is given: a rejected quote on the wrong market, past its deadline
    first = _candidate(od, p, replace(opt, feasible=False, reason="no", market="spot"), deadline=1.0)
    assert first.reasons == ("no",)
    assert _candidate(od, p, replace(opt, market="spot", devices=24)).reasons == spot.reasons
    assert _candidate(fast, p, replace(opt, devices=24), deadline=1.0).reasons == (
        "needs 3 nodes of 8 × h100; h has 2",
    )
    assert _candidate(s, p, opt, deadline=1.0).reasons[0].startswith("would finish in")


def test_a_candidate_that_finishes_after_its_deadline_says_by_how_much() -> None:
    s = spec("dl")
    p = pool("a", "a100-80gb", 2.0)
    opt = _quote(s, p, 1, expected_hours_p90=2.5)
    now = 1000.0
    late = _candidate(s, p, opt, now_s=now, deadline=now + 7200.0)
    assert late.finish_s == now + 9000.0 and not late.feasible
    assert late.reasons == ("would finish in ~2.5 h (p90) but the deadline is 2.0 h away",)
    assert _candidate(s, p, opt, now_s=now, deadline=now + 9000.0).feasible  # finishing at it is in time
    assert _candidate(s, p, opt, now_s=now, deadline=None).feasible
    # under an hour in minutes, an hour and more in hours; a deadline already past is 0 min away
    short = _quote(s, p, 1, expected_hours_p90=0.9)
    assert _candidate(s, p, short, now_s=now, deadline=now + 3030.5).reasons == (
        "would finish in ~54 min (p90) but the deadline is 51 min away",
    )
    hour = _quote(s, p, 1, expected_hours_p90=1.0)
    assert _candidate(s, p, hour, now_s=now, deadline=now - 60.0).reasons == (
        "would finish in ~1.0 h (p90) but the deadline is 0 min away",
    )


def test_reserved_capacity_enters_the_objective_at_its_share_plus_a_token_per_device_hour() -> None:
    s = spec("r", resources={"min_devices": 2, "max_devices": 2})
    p = pool("res", "a100-80gb", 3.0, per_node=2, market="reserved")
    opt = _quote(s, p, 2)
    assert opt.market == "reserved"
    cfg = SchedulerConfig(time_limit_s=0.2, reserved_cost_factor=0.25)
    c = _candidate(s, p, opt, config=cfg)
    assert c.objective_usd == opt.expected_cost_usd * 0.25 + 1e-3 * opt.expected_hours * 2
    assert c.expected_cost_usd == opt.expected_cost_usd  # the quote's dollars are unchanged
    assert _candidate(s, p, opt).objective_usd == 1e-3 * opt.expected_hours * 2  # the default: free


# ---- pools that can never serve a job (``candidates_for``) -----------------------------------------------
def test_a_pool_that_can_never_serve_the_job_is_one_infeasible_candidate_with_the_reason() -> None:
    cache = CandidateCache()
    cuda = spec("cuda", requirements={"frameworks": ["cuda-kernels"]})
    tpu = pool("tpu", "tpu-v4", 3.0, per_node=4, nodes=2)
    a100 = pool("a", "a100-80gb", 2.0)
    got = candidates_for(job_id="j", tenant="t", spec=cuda, pools=[tpu, a100], now_s=0.0,
                         deadline_abs_s=None, config=CFG, cache=cache)  # fmt: skip
    assert [(c.pool, c.feasible) for c in got] == [("tpu", False), ("a", True)]
    # only the pool it can use was predicted (and priced)
    assert {k[1] for k in cache.predictions} == {"a100-80gb"}
    why = eligibility(cuda, tpu, cache)
    assert why.startswith("requirements.frameworks: cuda-kernels needs")
    assert got[0] == Candidate(
        job_id="j", tenant="t", pool="tpu", accelerator=tpu.accelerator, devices=1, nodes=1,
        devices_per_node=4, market="on_demand", expected_cost_usd=0.0, expected_hours=0.0,
        expected_hours_p90=0.0, step_time_s=0.0, price_usd_per_hour=0.0, checkpoint_interval_s=0.0,
        finish_s=math.inf, feasible=False, reasons=(why,), capacity_devices=1,
    )  # fmt: skip
    # a gang of two nodes on it: the first device count it would have had, its whole nodes
    wide = spec(
        "wide", requirements={"frameworks": ["cuda-kernels"]}, resources={"min_devices": 8, "max_devices": 8}
    )
    (never,) = candidates_for(job_id="w", tenant="u", spec=wide, pools=[tpu], now_s=0.0,
                              deadline_abs_s=None, config=CFG, cache=cache)  # fmt: skip
    assert (never.job_id, never.tenant, never.devices, never.nodes, never.capacity_devices) == (
        "w",
        "u",
        8,
        2,
        8,
    )
    # a spot pool's never-candidate is on spot
    spot = pool("s", "tpu-v4", 1.0, market="spot", per_node=4, nodes=2)
    (on_spot,) = candidates_for(job_id="j", tenant="t", spec=cuda, pools=[spot], now_s=0.0,
                                deadline_abs_s=None, config=CFG, cache=cache)  # fmt: skip
    assert on_spot.market == "spot" and not on_spot.feasible


def test_a_pool_without_a_device_count_the_job_can_use_says_what_it_offers() -> None:
    cache = CandidateCache()
    small = pool("small", "a100-80gb", 2.0, per_node=8, nodes=1)

    def only(s) -> Candidate:
        (c,) = candidates_for(job_id="j", tenant="t", spec=s, pools=[small], now_s=0.0, deadline_abs_s=None,
                              config=CFG, cache=cache)  # fmt: skip
        return c

    c = only(spec("g", resources={"min_devices": 16, "max_devices": 16}))
    assert c.reasons == ("resources: the job needs 16..16 devices; small offers 8 per node × 1 node(s)",)
    assert (c.devices, c.nodes, c.capacity_devices, c.feasible) == (8, 1, 8, False)
    open_ended = only(spec("o", resources={"min_devices": 16, "max_devices": None}))
    assert open_ended.reasons == ("resources: the job needs at least 16 devices; small offers 8 per node × 1 "
                                  "node(s)",)  # fmt: skip
    whole = pool("whole", "a100-80gb", 2.0, per_node=8, nodes=1, whole_nodes_only=True)
    (up_to_4,) = candidates_for(job_id="j", tenant="t", spec=spec("u", resources={"min_devices": None,
                                "max_devices": 4}), pools=[whole], now_s=0.0, deadline_abs_s=None,
                                config=CFG, cache=cache)  # fmt: skip
    assert up_to_4.reasons == ("resources: the job needs 1..4 devices; whole offers 8 per node × 1 node(s)",)


def test_capacity_reasons_name_the_shape_the_option_needs_and_what_is_free() -> None:
    gang = spec("gang", **GANG)
    h = pool("h", "h100", 4.0, per_node=8, nodes=4, available=12, inter_node_gbps=400.0)
    c = _candidate(gang, h, _quote(gang, h, 16))
    assert not fits_now(c, h)
    assert (
        capacity_reason(c, h)
        == "needs 2 whole 8-device nodes on h; 1 whole node(s) free (12 devices available)"
    )
    assert fits_now(c, h.model_copy(update={"available_devices": 16}))
    one = spec("one", resources={"min_devices": 1, "max_devices": 8})
    a = pool("a", "a100-80gb", 2.0, per_node=8, nodes=2, available=1)
    two = _candidate(one, a, _quote(one, a, 2))
    assert not fits_now(two, a)
    assert capacity_reason(two, a) == f"needs 2 × {a.accelerator} in one node on a; 1 available"
    # 9 free on 8-device nodes: a whole node and one more, so 8 fit in one node and 2 do too
    nine = a.model_copy(update={"available_devices": 9})
    assert fits_now(two, nine) and fits_now(_candidate(one, a, _quote(one, a, 8)), nine)


# ---- pricing memo ---------------------------------------------------------------------------------------
def test_price_option_refuses_progress_outside_0_to_1_and_memoises_per_progress() -> None:
    s = spec("p")
    p = pool("a", "a100-80gb", 2.0)
    cheap = pool("b", "a100-80gb", 1.0)  # the same class of pool at another price
    cache = CandidateCache()
    for bad in (1.0, -0.01):
        with pytest.raises(ValueError, match=rf"elapsed_fraction must be in \[0, 1\), got {bad}"):
            price_option(s, p, 1, bad, cache)
    first = price_option(s, p, 1, 0.0, cache)
    assert price_option(s, p, 1, 0.0, cache) is first
    half = price_option(s, p, 1, 0.5, cache)
    assert half.expected_cost_usd < first.expected_cost_usd
    other = price_option(s, cheap, 1, 0.0, cache)
    assert other.expected_cost_usd == pytest.approx(first.expected_cost_usd / 2)
    assert other == option_for(s, cheap, 1)
    # one allocation-times entry serves both pools and both progresses
    assert len(cache.times) == 1 and all(isinstance(t, AllocationTimes) for t in cache.times.values())
    assert len(cache.options) == 3


def test_the_memo_is_dropped_once_past_its_bound_and_pool_tokens_past_1024() -> None:
    def filled(options: int, views: int, keys: int, times: int, tokens: int, bound: int) -> CandidateCache:
        c = CandidateCache(max_entries=bound)
        c.options.update({(str(i), (), 1, 0.0): None for i in range(options)})
        c.views.update({(i,): None for i in range(views)})
        c._keys.update({i: None for i in range(keys)})
        c.times.update({(i,): None for i in range(times)})
        c.predictions[("x",)] = None
        for i in range(tokens):
            c.pools_token((i,))
        c.trim()
        return c

    kept = filled(3, 2, 1, 1, 1025, bound=7)
    assert (len(kept.options), len(kept.views), len(kept._keys), len(kept.times)) == (3, 2, 1, 1)
    assert len(kept.predictions) == 1 and len(kept._pool_tokens) == 1025
    for dropped in (filled(3, 2, 1, 1, 1025, bound=6), filled(1, 2, 3, 1, 1025, bound=6),
                    filled(1, 1, 1, 4, 1025, bound=6)):  # fmt: skip
        assert not (dropped.options or dropped.views or dropped._keys or dropped.times or dropped.predictions)
        assert not dropped._pool_tokens
    assert len(filled(3, 2, 1, 1, 1024, bound=6)._pool_tokens) == 1024
    # tokens: equal keys share one, a new key gets the next
    c = CandidateCache()
    assert [c.pools_token(("a",)), c.pools_token(("b",)), c.pools_token(("a",))] == [0, 1, 0]


def test_per_pool_memos_are_cleared_past_4096_pools() -> None:
    base = pool("p", "a100-80gb", 2.0)
    pools = [base.model_copy(update={"name": f"p{i}"}) for i in range(4098)]
    for memo, call in (("_pool_keys", CandidateCache.pool_key), ("_pool_classes", CandidateCache.pool_class),
                       ("_pool_topologies", CandidateCache.pool_topology)):  # fmt: skip
        cache = CandidateCache()
        for p in pools[:4097]:
            call(cache, p)
        assert len(getattr(cache, memo)) == 4097
        call(cache, pools[0])  # a pool it holds is answered from it
        assert len(getattr(cache, memo)) == 4097
        call(cache, pools[4097])
        assert len(getattr(cache, memo)) == 1, memo
    assert cache.pool_topology(base)[2] == (
        "a100-80gb",
        80.0,
        ("devices_per_node", 1),
        ("inter_node_gbps", None),
    )


def test_screening_is_memoised_by_what_it_reads_of_the_spec() -> None:
    cache = CandidateCache()
    spot = pool("s", "a100-40gb", 1.0, market="spot", per_node=8, nodes=1)
    both = spec("both", objective={"markets": ["on_demand", "spot"]})
    od = spec("od", objective={"markets": ["on_demand"]})
    big = spec("big", resources={"min_memory_per_device_gib": 80}, objective={"markets": ["spot"]})
    nocuda = spec("nc", requirements={"deny": ["a100-40gb"]}, objective={"markets": ["spot"]})
    assert eligibility(both, spot, cache) == ""
    assert eligibility(od, spot, cache) == "objective.markets: spot is not in on_demand"
    assert eligibility(big, spot, cache).startswith("resources.min_memory_per_device_gib")
    assert eligibility(nocuda, spot, cache).startswith("requirements.deny")
    assert eligibility(both, spot, cache) == "" and "" in cache.eligible.values()
    assert screen_key(both, cache) != screen_key(od, cache)
    assert screen_key(both, cache) == screen_key(
        spec("other", objective={"markets": ["on_demand", "spot"]}), cache
    )
    # device counts per device range and the pool's shape
    assert device_counts(spec("1", resources={"min_devices": 1, "max_devices": 8}), spot, cache) == [
        1,
        2,
        4,
        8,
    ]
    assert device_counts(spec("2", resources={"min_devices": 2, "max_devices": 8}), spot, cache) == [2, 4, 8]
    assert device_counts(spec("3", resources={"min_devices": 2, "max_devices": 4}), spot, cache) == [2, 4]
    whole = spot.model_copy(update={"whole_nodes_only": True})
    assert device_counts(spec("4", resources={"min_devices": 1, "max_devices": 8}), whole, cache) == [8]
    two = spot.model_copy(update={"nodes": 2})
    assert device_counts(spec("5", resources={"min_devices": 8, "max_devices": 16}), two, cache) == [8, 16]
    assert [8, 16] in cache.device_counts.values()
    assert screen_key(spec("6", resources={"min_devices": 2, "max_devices": 4}), cache) != screen_key(
        spec("7", resources={"min_devices": 2, "max_devices": 8}), cache
    )


# ---- predictions ----------------------------------------------------------------------------------------
def _predicted(cache: CandidateCache) -> dict[tuple[str, int], Any]:
    """The memoised predictions by (accelerator, device count)."""
    return {(k[1], k[3]): v for k, v in cache.predictions.items()}


def test_prefetch_predicts_each_device_count_once_and_the_measured_reference() -> None:
    from trainyard.cost.quote import pool_accelerator, predict_kwargs
    from trainyard.predict import predict
    from trainyard.schedule.candidates import prefetch_predictions

    # 4-device nodes on a slow network: 8 devices span two nodes, so the topology shows in the step time
    a = pool("a", "a100-80gb", 2.0, per_node=4, nodes=4, inter_node_gbps=10.0)
    a2 = pool("a2", "a100-80gb", 1.0, per_node=4, nodes=4, inter_node_gbps=10.0)  # the same topology
    acc = pool_accelerator(a)
    plain = spec("plain", resources={"min_devices": 2, "max_devices": 16})
    cache = CandidateCache()
    prefetch_predictions(plain, [(a, [4, 8]), (a2, [8, 16])], cache)
    got = _predicted(cache)
    assert sorted(got) == [(acc.name, 4), (acc.name, 8), (acc.name, 16)]
    for (_, d), p in got.items():
        assert p == predict(plain, acc, d, **predict_kwargs(a, acc))
    assert got[(acc.name, 8)] != predict(plain, acc, 8)  # the catalog's own topology predicts otherwise
    # pricing reads them: it predicts nothing more
    for p, d in ((a, 4), (a, 8), (a2, 16)):
        price_option(plain, p, d, 0.0, cache)
    assert len(cache.predictions) == 3
    # a measured step time on the accelerator is scaled from its reference count (min_devices, 1 when
    # unset): it is predicted too, and a count already there is not predicted again
    measured = spec("m", resources={"min_devices": None, "max_devices": 16},
                    measured={"step_time_s": {acc.name: 1.0}})  # fmt: skip
    cache = CandidateCache()
    prefetch_predictions(measured, [(a, [4, 8])], cache)
    assert sorted(_predicted(cache)) == [(acc.name, 1), (acc.name, 4), (acc.name, 8)]
    before = dict(cache.predictions)
    prefetch_predictions(measured, [(a, [1, 4, 8])], cache)
    assert all(cache.predictions[k] is v for k, v in before.items()) and len(cache.predictions) == 3
    assert price_option(measured, a, 4, 0.0, cache) == option_for(measured, a, 4)
    assert len(cache.predictions) == 3


def test_prefetching_many_specs_predicts_each_spec_and_group_once() -> None:
    from trainyard.cost.quote import pool_accelerator, predict_kwargs
    from trainyard.predict import predict
    from trainyard.schedule import candidates as cands

    a = pool("a", "a100-80gb", 2.0, per_node=4, nodes=4, inter_node_gbps=10.0)
    h = pool("h", "h100", 3.0, per_node=4, nodes=4, inter_node_gbps=10.0)
    one = spec("one", resources={"min_devices": 1, "max_devices": 8})
    other = spec("other", resources={"min_devices": 1, "max_devices": 8}, workload={"global_batch": 16})
    third = spec("third", resources={"min_devices": 1, "max_devices": 8}, workload={"global_batch": 32})
    twin = spec("twin", resources={"min_devices": 1, "max_devices": 8}, workload={"steps": 9})  # one's shape
    cache = CandidateCache()
    cands.prefetch_predictions(one, [(a, [1])], cache)  # one's A100 group is already there
    asked: list[tuple[str, list[int]]] = []
    real = cands.predict_grouped

    def grouped(items: Any, acc: Any, **kw: Any) -> Any:
        asked.extend((s.name, list(c)) for s, c in items)
        return real(items, acc, **kw)

    mp = pytest.MonkeyPatch()
    mp.setattr(cands, "predict_grouped", grouped)
    try:
        cands.prefetch_predictions_many(
            [
                (one, [(a, [1]), (h, [1, 8])]),
                (other, [(a, [1, 8])]),
                (third, [(h, [8])]),
                (twin, [(h, [1, 8])]),
            ],
            cache,
        )
    finally:
        mp.undo()
    # the twin shares one's shape: nothing is asked for it
    assert sorted(asked) == [("one", [1, 8]), ("other", [1, 8]), ("third", [8])]
    n = len(cache.predictions)
    assert n == 6
    for s, p, d in ((one, a, 1), (one, h, 1), (one, h, 8), (other, a, 1), (other, a, 8), (third, h, 8),
                    (twin, h, 8)):  # fmt: skip
        price_option(s, p, d, 0.0, cache)
    assert len(cache.predictions) == n  # pricing found every one of them
    acc = pool_accelerator(h)
    key = cands._prediction_key(cache.shape(third), acc, 8, predict_kwargs(h, acc))
    assert cache.predictions[key] == predict(third, acc, 8, **predict_kwargs(h, acc))


def test_the_calibration_hook_answers_before_the_predictor_and_its_errors_become_the_reason() -> None:
    from trainyard.cost.quote import pool_accelerator
    from trainyard.predict import predict
    from trainyard.schedule.candidates import prefetch_predictions, prefetch_predictions_many

    a = pool("a", "a100-80gb", 2.0, per_node=8, nodes=1)
    acc = pool_accelerator(a)
    s = spec("h", resources={"min_devices": 1, "max_devices": 8})
    seen: list[int] = []

    def hook(sp: Any, accelerator: Any, devices: int, topology: Any) -> Any:
        seen.append(devices)
        if devices == 2:
            raise ValueError("no calibration for 2 devices")
        if devices == 4:
            p = predict(sp, accelerator, devices, **topology)
            return replace(p, step_time_s=2 * p.step_time_s, step_time_p90_s=2 * p.step_time_p90_s)
        return None

    for prefetch in (prefetch_predictions, lambda sp, pc, c: prefetch_predictions_many([(sp, pc)], c)):
        seen.clear()
        cache = CandidateCache(calibrated=hook)
        prefetch(s, [(a, [1, 2, 4])], cache)
        assert sorted(seen) == [1, 2, 4]
        got = _predicted(cache)
        # the hook's answer for 4, the packaged predictor's for 1 (the hook declined), none for 2 (it failed)
        assert sorted(got) == [(acc.name, 1), (acc.name, 4)]
        assert got[(acc.name, 1)] == predict(s, acc, 1, devices_per_node=8, inter_node_gbps=None)
        assert got[(acc.name, 4)].step_time_s == 2 * predict(s, acc, 4, devices_per_node=8,
                                                             inter_node_gbps=None).step_time_s  # fmt: skip
        # pricing asks the hook again for 2, and the error is the predictor's reason on that option
        failed = price_option(s, a, 2, 0.0, cache)
        assert not failed.feasible and "no calibration for 2 devices" in failed.reason
    # without a prefetch, pricing asks the hook with the spec, the pool's accelerator and its topology
    asked: list[tuple[Any, ...]] = []

    def recording(sp: Any, accelerator: Any, devices: int, topology: Any) -> Any:
        asked.append((sp, accelerator, devices, dict(topology)))
        return hook(sp, accelerator, devices, topology)

    hooked = price_option(s, a, 4, 0.0, CandidateCache(calibrated=recording))
    assert asked == [(s, acc, 4, {"devices_per_node": 8, "inter_node_gbps": None})]
    assert hooked.step_time_s == 2 * price_option(s, a, 4, 0.0, CandidateCache()).step_time_s


def test_a_batch_the_predictor_rejects_is_predicted_spec_by_spec() -> None:
    from trainyard.schedule.candidates import prefetch_predictions, prefetch_predictions_many

    a = pool("a", "a100-80gb", 2.0, per_node=8, nodes=1)
    ok = spec("ok", resources={"min_devices": 1, "max_devices": 8})
    bad = spec("bad", workload={"global_batch": 16})  # another shape, asked for a count of 0
    # the predictor refuses a count of 0 (devices must be >= 1); the batch with it is not lost for the
    # other spec, and the error is not raised here (pricing turns it into the option's reason)
    h = pool("h", "h100", 3.0, per_node=8, nodes=1)
    cache = CandidateCache()
    prefetch_predictions_many([(bad, [(a, [0])]), (ok, [(a, [1, 2]), (h, [1])])], cache)
    assert sorted(_predicted(cache)) == [("a100-80gb", 1), ("a100-80gb", 2), ("h100", 1)]
    cache = CandidateCache()
    prefetch_predictions(bad, [(a, [0, 1])], cache)
    assert cache.predictions == {}


def test_the_predictor_for_a_pool_memoises_per_accelerator_and_topology() -> None:
    from trainyard.catalog.accelerators import get_accelerator
    from trainyard.cost.quote import pool_accelerator, predict_kwargs
    from trainyard.predict import predict
    from trainyard.schedule.candidates import _predict_fn, _prediction_key

    s = spec("f")
    p = pool("h", "h100", 3.0, per_node=8, nodes=2, inter_node_gbps=100.0, memory_per_device_gib=94.0)
    own = pool_accelerator(p)
    other = get_accelerator("a100-80gb")
    cache = CandidateCache()
    fn = _predict_fn(cache, s, p)
    assert fn(s, own, 8) == predict(s, own, 8, **predict_kwargs(p, own))
    # another accelerator (and the catalog's 80 GiB H100) on the pool's topology, under its own key
    for acc in (other, get_accelerator("h100")):
        want = predict(s, acc, 8, **predict_kwargs(p, acc))
        assert fn(s, acc, 8) == want
        assert cache.predictions[_prediction_key(cache.shape(s), acc, 8, predict_kwargs(p, acc))] == want
    assert len(cache.predictions) == 3
    assert fn(s, own, 8) is cache.predictions[_prediction_key(cache.shape(s), own, 8, predict_kwargs(p, own))]
    # an A100 with the pool's 94 GiB is not the pool's H100, and a TPU-family device gets a TPU's topology
    # (its slice) under its own key
    for acc in (replace(other, memory_gib=94.0), replace(own, family="google-tpu")):
        topology = predict_kwargs(p, acc)
        want = predict(s, acc, 8, **topology)
        assert fn(s, acc, 8) == want
        assert cache.predictions[_prediction_key(cache.shape(s), acc, 8, topology)] == want
    assert len(cache.predictions) == 5


def test_jobs_that_differ_only_in_name_and_tags_share_their_quotes() -> None:
    from trainyard.schedule.candidates import spec_key

    a, b = spec("a", tags={"team": "x"}), spec("b")
    assert spec_key(a) == spec_key(b) != spec_key(spec("c", workload={"steps": 7}))
    cache = CandidateCache()
    p = pool("p", "a100-80gb", 2.0)
    assert price_option(a, p, 1, 0.0, cache) is price_option(b, p, 1, 0.0, cache)
    # the catalog accelerator is looked up once per name
    assert cache.accelerator(p) is cache.accelerator(pool("q", "a100-80gb", 1.0))
    assert cache._accelerators.keys() == {"a100-80gb"}


def test_each_memo_computes_what_it_keys_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pricing is memoised per what each step reads: the catalog row per accelerator name, eligibility per
    spec and pool, device counts per range and shape, allocation times per base spec, pool class and count
    (shared by pools that differ in price, by specs that differ in length), predictions per shape,
    accelerator, count and topology (shared by pools of another class on the same topology)."""
    import trainyard.schedule.candidates as cands

    calls: Counter[str] = Counter()
    for name in ("get_accelerator", "eligibility_reason", "candidate_device_counts", "allocation_times",
                 "predict"):  # fmt: skip
        real = getattr(cands, name)

        def counting(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            calls[_name] += 1
            return _real(*args, **kw)

        monkeypatch.setattr(cands, name, counting)
    short = spec("short", resources={"min_devices": 1, "max_devices": 2})
    long = spec("long", resources={"min_devices": 1, "max_devices": 2}, workload={"steps": 7000})
    a, b = pool("a", "a100-80gb", 2.0, per_node=2), pool("b", "a100-80gb", 1.0, per_node=2)
    c = pool("c", "a100-80gb", 0.5, per_node=2, market="spot", interruption_rate_per_hour=0.1)
    cache = CandidateCache()
    for _ in range(2):
        for s in (short, long):
            for p in (a, b, c):
                assert eligibility(s, p, cache) == ""
                for d in device_counts(s, p, cache):
                    price_option(s, p, d, 0.0, cache)
    assert calls == {"get_accelerator": 1, "eligibility_reason": 3, "candidate_device_counts": 1,
                     "allocation_times": 4, "predict": 2}  # fmt: skip
    assert cache.accelerator(a) == cands.get_accelerator("a100-80gb")


def test_options_of_other_specs_or_rejected_by_the_screen_are_their_own() -> None:
    cache = CandidateCache()
    p = pool("a", "a100-80gb", 2.0)
    short, long = spec("s"), spec("l", workload={"steps": 7000})
    assert (
        price_option(short, p, 1, 0.0, cache).expected_cost_usd
        < price_option(long, p, 1, 0.0, cache).expected_cost_usd
    )
    cuda, tpu = spec("cuda", requirements={"frameworks": ["cuda-kernels"]}), pool("tpu", "tpu-v4", 3.0)
    rejected = price_option(cuda, tpu, 1, 0.0, cache)
    assert rejected == option_for(cuda, tpu, 1) and not rejected.feasible
    assert rejected.reason.startswith("requirements.frameworks")
    # priced candidates carry the job and the clock's deadline check too
    (c,) = candidates_for(job_id="j", tenant="t", spec=short, pools=[p], now_s=10.0, deadline_abs_s=20.0,
                          config=CFG, cache=cache)  # fmt: skip
    assert (c.job_id, c.tenant, c.feasible) == ("j", "t", False) and c.reasons[0].startswith("would finish")
