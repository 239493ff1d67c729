"""Re-planning: price changes, preemptions, deadline pressure, migration hysteresis, the debouncer."""

from __future__ import annotations

from dataclasses import replace

import pytest
from scheduler_paths import both_pricing_paths  # noqa: F401
from test_scheduler_round import job, pool, spec

from trainyard.schedule import (
    CandidateCache,
    EventKind,
    Replanner,
    RunningJob,
    SchedulerConfig,
    SchedulerEvent,
    schedule_round,
)
from trainyard.schedule.candidates import candidates_for
from trainyard.schedule.migration import migration_cost, uniform_progress

# every round runs on the vectorised pricing and on the scalar reference, which must decide alike
pytestmark = pytest.mark.usefixtures("both_pricing_paths")

CFG = SchedulerConfig(time_limit_s=0.2)
LONG = {"steps": 20000}


def running(s, pool_name: str, *, market: str = "on_demand", placed_s: float = 0.0, progress: float = 0.1,
            submit_s: float = 0.0, devices: int = 1) -> RunningJob:  # fmt: skip
    return RunningJob(
        job_id=s.name,
        tenant="t",
        spec=s,
        submit_s=submit_s,
        pool=pool_name,
        devices=devices,
        market=market,
        placed_s=placed_s,
        progress_fraction=progress,
    )


def long_spec(name: str = "r", **over):
    return spec(name, workload=LONG, measured={"step_time_s": {"a100-80gb": 1.0, "h100": 0.6}}, **over)


def test_price_drop_elsewhere_moves_a_running_job_when_savings_beat_migration_cost() -> None:
    s = long_spec()
    pools = [pool("dear", "a100-80gb", 4.0, available=3), pool("cheap", "a100-80gb", 1.0)]
    r = schedule_round([], pools, [running(s, "dear")], now_s=7200.0, config=CFG)
    (p,) = r.placements
    assert p.migration and p.from_pool == "dear" and p.pool == "cheap"
    assert "migration $" in p.reason
    # the move's expected cost includes the migration cost and is still below staying
    assert p.expected_cost_usd < 4.0 * 20000 * 0.9 / 3600


def test_small_price_difference_does_not_move_the_job() -> None:
    s = long_spec()
    # 5 % cheaper: savings over the remaining work do not beat the migration cost × (1 + margin) + floor
    pools = [pool("dear", "a100-80gb", 1.00, available=3), pool("cheap", "a100-80gb", 0.95)]
    r = schedule_round([], pools, [running(s, "dear")], now_s=7200.0, config=CFG)
    assert not r.placements and r.kept == ("r",)


def test_minimum_dwell_time_prevents_flapping() -> None:
    s = long_spec()
    pools = [pool("dear", "a100-80gb", 4.0, available=3), pool("cheap", "a100-80gb", 1.0)]
    r = schedule_round([], pools, [running(s, "dear", placed_s=7000.0)], now_s=7200.0, config=CFG)
    assert not r.placements and r.kept == ("r",)
    # and once moved, moving back for a tiny gain is refused again by the hysteresis
    pools = [pool("dear", "a100-80gb", 0.98, available=3), pool("cheap", "a100-80gb", 1.0)]
    r = schedule_round([], pools, [running(s, "cheap", placed_s=0.0)], now_s=9000.0, config=CFG)
    assert not r.placements


def test_cross_family_move_pays_for_conversion_and_recompile() -> None:
    s = long_spec()
    to_tpu = next(
        c
        for c in candidates_for(
            job_id="r",
            tenant="t",
            spec=s,
            pools=[pool("tpu", "tpu-v4", 1.0)],
            now_s=0.0,
            deadline_abs_s=None,
            config=CFG,
            cache=CandidateCache(),
        )
    )
    same = replace(to_tpu, accelerator="a100-80gb")
    common = dict(from_accelerator="a100-80gb", from_devices=1, from_price_usd_per_hour=2.0, restart_s=200.0,
                  config=CFG)  # fmt: skip
    cross = migration_cost(s, to=to_tpu, compile_s=300.0, **common)
    within = migration_cost(s, to=same, compile_s=0.0, **common)
    assert cross.cross_family and not within.cross_family
    assert cross.parts["conversion"] == CFG.conversion_s and cross.parts["recompile"] == 300.0
    assert within.parts["conversion"] == 0.0
    assert cross.usd > within.usd


def test_preempted_job_is_requeued_and_placed_on_remaining_capacity() -> None:
    s = long_spec("p", objective={"deadline": "12h"})
    spot = pool("spot", "a100-80gb", 0.7, market="spot", interruption_rate_per_hour=0.05)
    od = pool("od", "a100-80gb", 2.5)
    before = schedule_round([job(s)], [spot, od], now_s=0.0, config=CFG)
    assert before.placements[0].pool == "spot"
    # the spot pool was reclaimed: no devices left there; the job is queued again (it keeps its submit time)
    planner = Replanner(debounce_s=5.0)
    planner.planned(0.0)
    assert planner.observe(SchedulerEvent(EventKind.PREEMPTION, 3600.0, job_id="p", pool="spot"))
    assert planner.due(3600.0)  # preemptions are urgent: no debounce
    reclaimed = spot.model_copy(update={"available_devices": 0})
    after = schedule_round([job(s)], [reclaimed, od], now_s=3600.0, config=CFG)
    (p,) = after.placements
    # with a deadline 11 h away and ~6 h of work, waiting for spot is not worth the risk: on-demand now
    assert p.pool == "od"
    # the same job without a deadline waits for the (4× cheaper) spot capacity, and says so
    relaxed = long_spec("p")
    after = schedule_round([job(relaxed)], [reclaimed, od], now_s=3600.0, config=CFG)
    (u,) = after.unplaced
    assert u.reason.startswith("waiting is cheaper") and "spot on spot" in u.reason
    # ... but not forever: the waiting cost grows with time in the queue
    later = schedule_round([job(relaxed)], [reclaimed, od], now_s=24 * 3600.0, config=CFG)
    assert later.placements[0].pool == "od"


def test_spot_job_behind_its_deadline_moves_to_on_demand() -> None:
    s = long_spec("d", objective={"deadline": "12h"})
    pools = [pool("spot", "a100-80gb", 0.7, market="spot", available=3), pool("od", "a100-80gb", 2.5)]
    # halfway through the window with only 20 % done: behind the Uniform Progress line
    behind = running(s, "spot", market="spot", progress=0.2, placed_s=20000.0)
    r = schedule_round([], pools, [behind], now_s=6 * 3600.0, config=CFG)
    (p,) = r.placements
    assert p.pool == "od" and p.market == "on_demand" and p.migration
    assert "uniform progress" in p.reason or "slack" in p.reason
    # ahead of the line: stays on spot (on-demand is dearer)
    ahead = running(s, "spot", market="spot", progress=0.6, placed_s=0.0)
    r = schedule_round([], pools, [ahead], now_s=6 * 3600.0, config=CFG)
    assert not r.placements and r.kept == ("d",)
    # behind but no on-demand capacity: it keeps its spot allocation rather than stopping
    r = schedule_round(
        [],
        [pools[0], pools[1].model_copy(update={"available_devices": 0})],
        [behind],
        now_s=6 * 3600.0,
        config=CFG,
    )
    assert not r.placements and r.kept == ("d",)


def test_uniform_progress_slack_rule() -> None:
    s = long_spec("d", objective={"deadline": "10h"})
    rj = running(s, "spot", market="spot", progress=0.5)
    # 5 h spent of 10 with half done is on the line; on-demand needs 4.8 h of the 5 h left: slack < safety
    check = uniform_progress(rj, 5 * 3600.0, remaining_on_demand_s=4.8 * 3600.0, config=CFG)
    assert check.behind and "slack" in check.reason
    check = uniform_progress(rj, 5 * 3600.0, remaining_on_demand_s=2.0 * 3600.0, config=CFG)
    assert not check.behind


def test_replanner_debounces_bursts_and_ignores_tiny_price_moves() -> None:
    rp = Replanner(debounce_s=5.0, max_delay_s=30.0, period_s=300.0, min_price_change=0.05)
    assert rp.due(0.0)  # never planned
    rp.planned(0.0)
    assert not rp.due(1.0)
    tiny = SchedulerEvent(
        EventKind.PRICE_CHANGE, 10.0, pool="a", old_price_usd_per_hour=1.0, new_price_usd_per_hour=1.01
    )
    assert not rp.observe(tiny) and not rp.due(20.0)
    for t in (10.0, 13.0, 16.0, 19.0, 22.0, 25.0, 28.0, 31.0, 34.0, 37.0, 40.0):
        rp.observe(SchedulerEvent(EventKind.ARRIVAL, t, job_id=f"j{t}"))
        if t < 40.0:
            assert not rp.due(t + 1.0), t
    assert rp.due(41.0)  # the burst is capped at max_delay_s after its first event
    covered = rp.planned(41.0)
    assert len(covered) == 11 and not rp.due(42.0)
    big = SchedulerEvent(
        EventKind.PRICE_CHANGE, 50.0, pool="a", old_price_usd_per_hour=1.0, new_price_usd_per_hour=0.5
    )
    assert rp.observe(big)
    assert not rp.due(52.0) and rp.due(55.0)
    assert rp.next_due_s() == pytest.approx(55.0)
    rp.planned(55.0)
    assert rp.due(55.0 + 300.0)  # periodic round


def test_price_change_replans_new_arrivals_onto_the_new_cheapest_pool() -> None:
    s = long_spec("n")
    a, b = pool("a", "a100-80gb", 2.0), pool("b", "a100-80gb", 2.5)
    assert schedule_round([job(s)], [a, b], config=CFG).placements[0].pool == "a"
    b2 = b.model_copy(update={"price_usd_per_device_hour": 1.5})
    assert schedule_round([job(s)], [a, b2], config=CFG).placements[0].pool == "b"


def test_a_moves_reason_prices_the_rest_here_and_there_and_the_migration() -> None:
    from trainyard.schedule.candidates import price_option
    from trainyard.schedule.round import _fmt_usd
    from trainyard.schedule.types import Alternative

    s = long_spec()
    dear, cheap = pool("dear", "a100-80gb", 4.0, available=3), pool("cheap", "a100-80gb", 1.0)
    r = schedule_round([], [dear, cheap], [running(s, "dear", progress=0.25)], now_s=7200.0, config=CFG)
    (p,) = r.placements
    # the remaining three quarters, priced on both pools, and the move's own cost on top of the new one
    cache = CandidateCache()
    stay, there = price_option(s, dear, 1, 0.25, cache), price_option(s, cheap, 1, 0.25, cache)
    (to,) = candidates_for(job_id="r", tenant="t", spec=s, pools=[cheap], now_s=7200.0, deadline_abs_s=None,
                           config=CFG, cache=cache, elapsed_fraction=0.25)  # fmt: skip
    mc = migration_cost(s, from_accelerator="a100-80gb", from_devices=1, from_price_usd_per_hour=4.0, to=to,
                        restart_s=there.restart_s, compile_s=there.compile_s, config=CFG)  # fmt: skip
    assert mc.usd > 0
    assert (p.pool, p.devices, p.nodes, p.market) == ("cheap", 1, 1, "on_demand")
    assert p.migration and p.from_pool == "dear"
    assert p.expected_cost_usd == there.expected_cost_usd + mc.usd
    assert p.reason == (
        "move dear → 1 × a100-80gb on_demand on cheap: remaining work "
        f"{_fmt_usd(stay.expected_cost_usd)} here vs {_fmt_usd(there.expected_cost_usd)} there, "
        f"migration {_fmt_usd(mc.usd)}"
    )
    # the other option named is staying
    assert p.alternatives == (
        Alternative("dear", 1, "on_demand", stay.expected_cost_usd, stay.expected_hours),
    )


def test_a_running_job_on_a_pool_outside_the_round_keeps_its_allocation() -> None:
    s = long_spec()
    r = schedule_round([], [pool("cheap", "a100-80gb", 1.0)], [running(s, "gone")], now_s=7200.0, config=CFG)
    assert not r.placements and r.kept == ("r",)


def test_a_forced_move_off_spot_names_the_deadline_rule() -> None:
    s = long_spec("d", objective={"deadline": "12h"})
    pools = [pool("spot", "a100-80gb", 0.7, market="spot", available=3), pool("od", "a100-80gb", 2.5)]
    behind = running(s, "spot", market="spot", progress=0.2, placed_s=20000.0)
    (p,) = schedule_round([], pools, [behind], now_s=6 * 3600.0, config=CFG).placements
    assert p.reason.startswith("move spot → 1 × a100-80gb on_demand on od: ")
    assert p.reason.endswith("; moving to on-demand capacity to meet the deadline")
    check = uniform_progress(behind, 6 * 3600.0, None, CFG)
    assert check.behind and check.reason in p.reason


def test_a_running_jobs_model_is_staying_and_the_moves_that_pay_with_their_costs() -> None:
    from trainyard.schedule.candidates import price_option, to_candidate
    from trainyard.schedule.round import _running_problem

    s = long_spec()
    dear, cheap = pool("dear", "a100-80gb", 4.0, available=3), pool("cheap", "a100-80gb", 1.0)
    full = pool("full", "a100-80gb", 0.5, available=0)  # cheapest but full: not even priced
    pools = [dear, cheap, full]
    by_name = {p.name: p for p in pools}
    rj = running(s, "dear", progress=0.25)
    cache, forced = CandidateCache(), {}
    pj = _running_problem(rj, by_name, pools, 7200.0, CFG, cache, forced)
    assert pj is not None and forced == {}
    assert (pj.job_id, pj.tenant, pj.unplaced_usd, pj.rank_usd, pj.current_devices) == (
        "r",
        "t",
        None,
        0.0,
        1,
    )
    stay_q, there = price_option(s, dear, 1, 0.25, cache), price_option(s, cheap, 1, 0.25, cache)
    (to,) = candidates_for(job_id="r", tenant="t", spec=s, pools=[cheap], now_s=7200.0, deadline_abs_s=None,
                           config=CFG, cache=cache, elapsed_fraction=0.25)  # fmt: skip
    mc = migration_cost(s, from_accelerator="a100-80gb", from_devices=1, from_price_usd_per_hour=4.0, to=to,
                        restart_s=there.restart_s, compile_s=there.compile_s, config=CFG)  # fmt: skip
    stay = to_candidate(job_id="r", tenant="t", spec=s, pool=dear, option=stay_q, now_s=7200.0,
                        deadline_abs_s=None, config=CFG)  # fmt: skip
    # the move costs the rest there plus the migration, and enters the objective with the hysteresis on top
    assert pj.options == (
        replace(to, expected_cost_usd=to.expected_cost_usd + mc.usd, migration_cost_usd=mc.usd,
                objective_usd=to.objective_usd + mc.usd * (1.0 + CFG.migration_margin)
                + CFG.migration_min_savings_usd),
        replace(stay, is_stay=True, capacity_devices=0, feasible=True, reasons=()),
    )  # fmt: skip
    assert not any(k[1] == cache.pool_key(full) for k in cache.options)
    # a job that minimises time weighs its hours in the stay too
    fast = long_spec("f", objective={"minimize": "time"})
    tj = _running_problem(running(fast, "dear", progress=0.25), by_name, pools, 7200.0, CFG, cache, {})
    assert tj is not None
    (kept,) = [o for o in tj.options if o.is_stay]
    assert kept.objective_usd == kept.expected_cost_usd + CFG.time_value_usd_per_hour * kept.expected_hours
    # the minimum dwell, at and just short of it; progress is clamped into [0, 0.999]
    assert _running_problem(running(s, "dear", placed_s=5400.0), by_name, pools, 7200.0, CFG, cache, {})
    assert (
        _running_problem(running(s, "dear", placed_s=5401.0), by_name, pools, 7200.0, CFG, cache, {}) is None
    )
    low = _running_problem(running(s, "dear", progress=-0.5), by_name, pools, 7200.0, CFG, cache, {})
    assert low is not None
    (st,) = [o for o in low.options if o.is_stay]
    assert st.expected_cost_usd == price_option(s, dear, 1, 0.0, cache).expected_cost_usd
    done = _running_problem(running(s, "dear", progress=1.0), by_name, pools, 7200.0, CFG, cache, {})
    assert done is None  # 0.1 % left: nothing saved by moving it
    assert price_option(s, dear, 1, 0.999, cache).feasible


def test_a_spot_job_behind_its_deadline_may_stay_only_as_a_last_resort() -> None:
    from trainyard.schedule.candidates import price_option
    from trainyard.schedule.round import _running_problem

    s = long_spec("d", objective={"deadline": "12h"})
    spot = pool("spot", "a100-80gb", 0.7, market="spot", available=3)
    spot2 = pool("spot2", "a100-80gb", 0.3, market="spot")  # cheaper spot: no way to catch up there
    od = pool("od", "a100-80gb", 2.5)
    od_full = pool("odfull", "a100-80gb", 2.0, available=0)  # full, but its time counts for the deadline
    pools = [spot, spot2, od, od_full]
    by_name = {p.name: p for p in pools}
    behind = running(s, "spot", market="spot", progress=0.2, placed_s=20000.0)
    cache, forced = CandidateCache(), {}
    pj = _running_problem(behind, by_name, pools, 6 * 3600.0, CFG, cache, forced)
    assert pj is not None and pj.rank_usd == 1e12
    non_spot = candidates_for(job_id="d", tenant="t", spec=s, pools=[od, od_full], now_s=6 * 3600.0,
                              deadline_abs_s=behind.deadline_abs_s, config=CFG, cache=cache,
                              elapsed_fraction=0.2)  # fmt: skip
    left_s = min(c.expected_hours_p90 * 3600.0 for c in non_spot if c.feasible)
    assert forced == {"d": uniform_progress(behind, 6 * 3600.0, left_s, CFG).reason}
    move, stay = pj.options
    assert (move.pool, move.market, stay.pool, stay.is_stay) == ("od", "on_demand", "spot", True)
    # the move's objective is its whole cost, without the hysteresis; staying costs a large penalty
    assert (
        move.objective_usd
        == move.expected_cost_usd
        == non_spot[0].expected_cost_usd + move.migration_cost_usd
    )
    stay_usd = price_option(s, spot, 1, 0.2, cache).expected_cost_usd
    assert stay.expected_cost_usd == stay_usd
    assert stay.objective_usd == stay_usd + 10.0 * (stay_usd + 1.0) + 1e4


def test_a_move_across_families_prices_the_target_pools_restart_and_recompile() -> None:
    from trainyard.schedule.candidates import price_option, to_candidate
    from trainyard.schedule.round import _running_problem

    s = long_spec()
    dear, tpu = pool("dear", "a100-80gb", 4.0, available=3), pool("tpu", "tpu-v4", 0.5)
    by_name = {p.name: p for p in (dear, tpu)}
    cache = CandidateCache()
    pj = _running_problem(running(s, "dear", progress=0.25), by_name, [dear, tpu], 7200.0, CFG, cache, {})
    assert pj is not None
    (move,) = [o for o in pj.options if not o.is_stay]
    stay_q, there = price_option(s, dear, 1, 0.25, cache), price_option(s, tpu, 1, 0.25, cache)
    # the move to the TPU restarts and compiles there: its own times, not the A100's
    assert there.compile_s > 0 and there.restart_s != stay_q.restart_s
    (to,) = candidates_for(job_id="r", tenant="t", spec=s, pools=[tpu], now_s=7200.0, deadline_abs_s=None,
                           config=CFG, cache=cache, elapsed_fraction=0.25)  # fmt: skip
    stay = to_candidate(job_id="r", tenant="t", spec=s, pool=dear, option=stay_q, now_s=7200.0,
                        deadline_abs_s=None, config=CFG)  # fmt: skip
    mc = migration_cost(s, from_accelerator="a100-80gb", from_devices=1,
                        from_price_usd_per_hour=stay.price_usd_per_hour, to=to, restart_s=there.restart_s,
                        compile_s=there.compile_s, config=CFG)  # fmt: skip
    assert mc.cross_family and mc.parts["recompile"] == there.compile_s
    assert move.migration_cost_usd == mc.usd and move.expected_cost_usd == to.expected_cost_usd + mc.usd


def test_a_running_job_that_minimises_time_weighs_its_hours_in_every_move() -> None:
    from trainyard.schedule.round import _running_problem

    fast = long_spec("f", objective={"minimize": "time"})
    dear, cheap = pool("dear", "a100-80gb", 4.0, available=3), pool("cheap", "a100-80gb", 1.0)
    by_name = {p.name: p for p in (dear, cheap)}
    pj = _running_problem(running(fast, "dear", progress=0.25), by_name, [dear, cheap], 7200.0, CFG,
                          CandidateCache(), {})  # fmt: skip
    assert pj is not None
    (move,) = [o for o in pj.options if not o.is_stay]
    hysteresis = move.migration_cost_usd * CFG.migration_margin + CFG.migration_min_savings_usd
    assert move.objective_usd == pytest.approx(
        move.expected_cost_usd + CFG.time_value_usd_per_hour * move.expected_hours + hysteresis, rel=1e-12
    )


def test_a_spot_job_without_a_deadline_does_not_price_full_pools() -> None:
    from trainyard.schedule.round import _running_problem

    s = long_spec()
    spot, cheap = pool("spot", "a100-80gb", 4.0, market="spot", available=3), pool("cheap", "a100-80gb", 1.0)
    full = pool("full", "a100-80gb", 0.5, available=0)
    pools = [spot, cheap, full]
    cache = CandidateCache()
    pj = _running_problem(running(s, "spot", market="spot", progress=0.25), {p.name: p for p in pools}, pools,
                          7200.0, CFG, cache, {})  # fmt: skip
    assert pj is not None
    assert not any(k[1] == cache.pool_key(full) for k in cache.options)


def test_a_spot_job_ahead_of_the_line_but_short_of_slack_moves_to_on_demand() -> None:
    from trainyard.schedule.round import _running_problem

    s = long_spec("d", objective={"deadline": "6h"})
    spot = pool("spot", "a100-80gb", 0.7, market="spot", available=3)
    spot2 = pool("spot2", "a100-80gb", 0.3, market="spot", interruption_rate_per_hour=0.5)
    fast_spot = pool("spot-h100", "h100", 2.0, market="spot")  # faster, but spot: not the deadline's time
    od = pool("od", "a100-80gb", 2.5)
    pools = [spot, spot2, fast_spot, od]
    ahead = running(s, "spot", market="spot", progress=0.55, placed_s=0.0)
    now = 3 * 3600.0
    forced: dict[str, str] = {}
    pj = _running_problem(ahead, {p.name: p for p in pools}, pools, now, CFG, CandidateCache(), forced)
    (od_c,) = candidates_for(job_id="d", tenant="t", spec=s, pools=[od], now_s=now,
                             deadline_abs_s=ahead.deadline_abs_s, config=CFG, cache=CandidateCache(),
                             elapsed_fraction=0.55)  # fmt: skip
    check = uniform_progress(ahead, now, od_c.expected_hours_p90 * 3600.0, CFG)
    assert check.behind and check.reason.startswith("deadline slack on on-demand is ")
    assert forced == {"d": check.reason}
    assert pj is not None and [o.pool for o in pj.options if not o.is_stay] == ["od"]


def test_every_running_job_that_moves_is_placed_after_one_that_stays() -> None:
    # one free device on the cheap pool: the job with more work left takes it, the other stays
    dear, cheap = pool("dear", "a100-80gb", 4.0, available=0), pool("cheap", "a100-80gb", 1.0, nodes=1)
    rs = [running(long_spec("r1"), "dear", progress=0.6), running(long_spec("r2"), "dear", progress=0.1)]
    r = schedule_round([], [dear, cheap], rs, now_s=7200.0, config=CFG)
    assert [(p.job_id, p.pool) for p in r.placements] == [("r2", "cheap")]
    assert r.kept == ("r1",)


def test_a_move_to_another_accelerator_recompiles_for_the_time_the_target_quotes() -> None:
    from trainyard.schedule.candidates import price_option
    from trainyard.schedule.round import _running_problem

    s = long_spec()
    dear, h100 = pool("dear", "a100-80gb", 4.0, available=3), pool("h100", "h100", 1.0)
    cache = CandidateCache()
    pj = _running_problem(running(s, "dear", progress=0.25), {"dear": dear, "h100": h100}, [dear, h100],
                          7200.0, CFG, cache, {})  # fmt: skip
    assert pj is not None
    (move,) = [o for o in pj.options if not o.is_stay]
    there = price_option(s, h100, 1, 0.25, cache)
    (to,) = candidates_for(job_id="r", tenant="t", spec=s, pools=[h100], now_s=7200.0, deadline_abs_s=None,
                           config=CFG, cache=cache, elapsed_fraction=0.25)  # fmt: skip
    mc = migration_cost(s, from_accelerator="a100-80gb", from_devices=1, from_price_usd_per_hour=4.0, to=to,
                        restart_s=there.restart_s, compile_s=there.compile_s, config=CFG)  # fmt: skip
    assert mc.parts["recompile"] == there.compile_s
    assert move.migration_cost_usd == mc.usd


def test_a_spot_job_with_no_on_demand_pool_is_checked_on_the_progress_line_alone() -> None:
    from trainyard.schedule.round import _running_problem

    s = long_spec("d", objective={"deadline": "12h"})
    spot, spot2 = (
        pool("spot", "a100-80gb", 0.7, market="spot"),
        pool("spot2", "a100-80gb", 0.3, market="spot"),
    )
    pools = [spot, spot2]
    now = 6 * 3600.0
    forced: dict[str, str] = {}
    behind = running(s, "spot", market="spot", progress=0.2, placed_s=0.0)
    assert (
        _running_problem(behind, {p.name: p for p in pools}, pools, now, CFG, CandidateCache(), forced)
        is None
    )
    assert forced == {"d": uniform_progress(behind, now, None, CFG).reason}
    assert forced["d"].startswith("behind uniform progress: 20% done")


def test_a_running_job_on_reserved_capacity_stays_on_it() -> None:
    from trainyard.schedule.candidates import price_option
    from trainyard.schedule.round import _running_problem

    # reserved capacity is already paid for: even 4× cheaper on-demand capacity elsewhere is no saving
    s = long_spec()
    res = pool("res", "a100-80gb", 4.0, market="reserved", available=3)
    cheap = pool("cheap", "a100-80gb", 1.0)
    rj = running(s, "res", market="reserved", progress=0.25)
    r = schedule_round([], [res, cheap], [rj], now_s=7200.0, config=CFG)
    assert not r.placements and r.kept == ("r",)
    # its stay is priced as reserved (the token share of the objective) against a move that does pay off
    dear = pool("dear", "a100-80gb", 8.0, market="reserved", available=3)
    cfg = replace(CFG, reserved_cost_factor=1.0)
    cache = CandidateCache()
    rd = running(s, "dear", market="reserved", progress=0.25)
    pj = _running_problem(rd, {"dear": dear, "cheap": cheap}, [dear, cheap], 7200.0, cfg, cache, {})
    assert pj is not None
    (stay,) = [o for o in pj.options if o.is_stay]
    q = price_option(s, dear, 1, 0.25, cache)
    assert stay.objective_usd == q.expected_cost_usd * 1.0 + 1e-3 * q.expected_hours * 1


def test_a_running_job_moves_onto_free_reserved_capacity_at_the_same_list_price() -> None:
    s = long_spec()
    # the same price per device-hour, but the reserved devices are already paid for: the move pays off
    od, res = pool("od", "a100-80gb", 4.0, available=3), pool("res", "a100-80gb", 4.0, market="reserved")
    r = schedule_round([], [od, res], [running(s, "od")], now_s=7200.0, config=CFG)
    (p,) = r.placements
    assert (p.job_id, p.pool, p.market, p.from_pool) == ("r", "res", "reserved", "od")


def test_a_running_job_does_not_move_where_it_would_miss_its_deadline() -> None:
    def with_deadline(deadline: str):
        return long_spec(objective={"deadline": deadline})

    # on the H100 at $4/h, 2.5 h of work left; the A100 at $1/h is cheaper but needs over 4 h
    dear, cheap = pool("dear", "h100", 4.0, available=3), pool("cheap", "a100-80gb", 1.0)
    rj = running(with_deadline("6h"), "dear", progress=0.25)
    r = schedule_round([], [dear, cheap], [rj], now_s=7200.0, config=CFG)
    assert not r.placements and r.kept == ("r",)
    # with time to spare the same move is taken
    relaxed = replace(rj, spec=with_deadline("12h"))
    (p,) = schedule_round([], [dear, cheap], [relaxed], now_s=7200.0, config=CFG).placements
    assert (p.pool, p.from_pool) == ("cheap", "dear")


def test_the_deadline_slack_rule_counts_the_on_demand_p90_hours_in_seconds() -> None:
    from trainyard.schedule.round import _running_problem

    s = long_spec("d", objective={"deadline": "6h"})
    spot, od = pool("spot", "a100-80gb", 0.7, market="spot", available=3), pool("od", "a100-80gb", 2.5)
    pools = [spot, od]
    now = 3 * 3600.0
    (od_c,) = candidates_for(job_id="d", tenant="t", spec=s, pools=[od], now_s=now, deadline_abs_s=None,
                             config=CFG, cache=CandidateCache(), elapsed_fraction=0.9)  # fmt: skip
    left_s = od_c.expected_hours_p90 * 3600.0
    assert od_c.expected_hours_p90 > 0.1  # so an hour's worth of seconds off would show
    for margin, behind in ((0.05, False), (-0.05, True)):
        # the deadline falls so that the on-demand slack is the safety margin give or take 0.05 s; placed
        # just now, so only the deadline rule can make it move; well ahead of the progress line
        submit = now + left_s + CFG.deadline_safety_s + margin - 6 * 3600.0
        rj = running(s, "spot", market="spot", progress=0.9, placed_s=now - 60.0, submit_s=submit)
        forced: dict[str, str] = {}
        pj = _running_problem(rj, {p.name: p for p in pools}, pools, now, CFG, CandidateCache(), forced)
        assert (pj is not None, "d" in forced) == (behind, behind)
