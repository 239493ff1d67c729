"""Candidate pricing: predictions shared per workload shape, the pool's topology, queued progress."""

from __future__ import annotations

import pytest
from scheduler_paths import both_pricing_paths  # noqa: F401
from test_scheduler_round import CFG, job, pool, spec

from trainyard.cost.quote import option_for
from trainyard.schedule import CandidateCache, QueuedJob, schedule_round
from trainyard.schedule.candidates import price_option

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

    from trainyard.schedule.candidates import fits_now
    from trainyard.schedule.round import free_room

    sp = spec("room")
    base = CandidateCache()
    template_pool = pool("p", "a100-40gb", 1.0, per_node=8, nodes=2)
    opt = price_option(sp, template_pool, 1, 0.0, base)
    from trainyard.schedule.candidates import to_candidate

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
