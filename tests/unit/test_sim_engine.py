"""The simulator's event loop: hand-checked single jobs, conservation, determinism, baselines as named."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard.catalog.pools import Pool
from trainyard.cost import model as cm
from trainyard.sim import (
    PoolChange,
    SimConfig,
    Simulator,
    TraceJob,
    TraceMix,
    common_span_s,
    generate_trace,
    make_policy,
    run_policies,
    simulate,
    simulate_policies,
)
from trainyard.sim.policy import OptionBook, capacity_devices
from trainyard.spec import spec_from_dict

PRICE = 2.0  # $ per device-hour
STEP_S = 1.0  # measured step time on a100-80gb
STEPS = 3600
INTERVAL_S = 600.0  # pinned checkpoint interval
WRITE_S = 30.0  # checkpoint write time (SimConfig)
PROVISION_S = cm.PROVISIONING_S["nvidia"]


def one_job(**objective: object) -> TraceJob:
    doc = {
        "name": "hand",
        "model": {"architecture": "custom", "params_b": 0.5},
        "workload": {"seq_len": 1024, "global_batch": 8, "steps": STEPS},
        "resources": {"min_devices": 1, "max_devices": 1},
        "checkpoint": {"interval": "10m"},
        "measured": {"step_time_s": {"a100-80gb": STEP_S}},
    }
    if objective:
        doc["objective"] = objective
    return TraceJob(job_id="hand", submit_s=0.0, tenant="t", spec=spec_from_dict(doc))


def pool(market: str = "on_demand", **kw: object) -> Pool:
    base: dict[str, object] = {
        "name": f"a100-{market}",
        "accelerator": "a100-80gb",
        "devices_per_node": 1,
        "nodes": 1,
        "market": market,
        "price_usd_per_device_hour": PRICE,
        "cloud": "aws",
        "region": "us-east-1",
    }
    if market == "spot":
        base.update(interruption_rate_per_hour=0.0, notice_s=0.0)
    base.update(kw)
    return Pool.model_validate(base)


def cfg(**kw: object) -> SimConfig:
    return replace(SimConfig(seed=0, checkpoint_write_s=WRITE_S, step_time_error_sigma=0.0), **kw)  # type: ignore[arg-type]


def load_s(job: TraceJob) -> float:
    spec = job.spec
    return cm.checkpoint_load_s(
        cm.checkpoint_bytes(spec), 1, cm.storage_read_gb_per_s(spec.checkpoint.storage)
    )


@pytest.mark.parametrize("policy", ["cheapest-hourly", "fastest", "trainyard", "on-demand-only"])
def test_one_job_one_pool_by_hand(policy: str) -> None:
    job = one_job()
    r = simulate([job], [pool()], policy, cfg())
    # start-up (provisioning; nothing to load, nothing to compile on a GPU), then 3600 s of steps with a
    # checkpoint write after every 600 s of training except the last: 5 writes of 30 s.
    wall = PROVISION_S + STEPS * STEP_S + 5 * WRITE_S
    (out,) = r.jobs
    assert out.completion_s == pytest.approx(wall)
    assert out.cost_usd == pytest.approx(wall / 3600.0 * PRICE)
    assert r.total_cost_usd == pytest.approx(out.cost_usd)
    assert out.preemptions == 0 and out.lost_work_device_s == 0.0 and out.attempts == 1
    # lower bound: the job alone, no checkpoints, one start-up
    assert out.lower_bound_cost_usd == pytest.approx((PROVISION_S + STEPS * STEP_S) / 3600.0 * PRICE)
    s = r.summary()
    assert s["jobs_completed"] == 1 and s["mean_jct_s"] == pytest.approx(wall, abs=1e-3)


def test_reclaim_without_notice_loses_work_since_last_checkpoint() -> None:
    job = one_job()
    reclaim_at = PROVISION_S + 1000.0
    back_at = 2000.0
    changes = (PoolChange(reclaim_at, "a100-spot", available_devices=0), PoolChange(back_at, "a100-spot", 1))
    r = simulate([job], [pool("spot")], "cheapest-hourly", cfg(changes=changes))
    (out,) = r.jobs
    # 1000 s after start-up: one full cycle (600 s training + 30 s write) and 370 s more training -> the
    # 370 s since the checkpoint are lost (no notice, so no emergency checkpoint).
    assert out.preemptions == 1
    assert out.lost_work_device_s == pytest.approx(370.0)
    restart = PROVISION_S + load_s(job)  # provisioning + checkpoint load, no recompile on a GPU
    remaining = STEPS * STEP_S - 600.0
    second = restart + remaining + 4 * WRITE_S  # ceil(3000 / 600) - 1 = 4 writes
    assert out.completion_s == pytest.approx(back_at + second)
    held = reclaim_at + second  # devices held until the reclaim, then for the second attempt
    assert out.cost_usd == pytest.approx(held / 3600.0 * PRICE)
    assert r.billed_device_s == pytest.approx(r.held_device_s) == pytest.approx(held)


def test_notice_long_enough_for_an_emergency_checkpoint_loses_nothing() -> None:
    job = one_job()
    reclaim_at = PROVISION_S + 1000.0
    changes = (PoolChange(reclaim_at, "a100-spot", available_devices=0), PoolChange(2000.0, "a100-spot", 1))
    r = simulate([job], [pool("spot", notice_s=120.0)], "cheapest-hourly", cfg(changes=changes))
    (out,) = r.jobs
    assert out.preemptions == 1 and out.lost_work_device_s == 0.0
    # released once the emergency checkpoint is written; all 970 s of training survive
    remaining = STEPS * STEP_S - 970.0
    second = PROVISION_S + load_s(job) + remaining + (math.ceil(remaining / INTERVAL_S) - 1) * WRITE_S
    assert out.completion_s == pytest.approx(2000.0 + second)
    assert out.cost_usd == pytest.approx((reclaim_at + WRITE_S + second) / 3600.0 * PRICE)


def test_price_change_is_billed_piecewise() -> None:
    job = one_job()
    changes = (PoolChange(1000.0, "a100-on_demand", price_usd_per_device_hour=4.0),)
    r = simulate([job], [pool()], "fastest", cfg(changes=changes))
    wall = PROVISION_S + STEPS * STEP_S + 5 * WRITE_S
    assert r.total_cost_usd == pytest.approx(1000.0 / 3600 * PRICE + (wall - 1000.0) / 3600 * 4.0)


def test_truth_differs_from_belief_without_a_measurement() -> None:
    doc = one_job().spec.to_document()
    doc.pop("measured")
    spec = spec_from_dict(doc)
    job = TraceJob("p", 0.0, "t", spec)
    exact = simulate([job], [pool()], "fastest", cfg(step_time_error_sigma=0.0)).jobs[0]
    noisy = simulate([job], [pool()], "fastest", cfg(step_time_error_sigma=0.5, seed=3)).jobs[0]
    assert exact.completion_s is not None and noisy.completion_s is not None
    assert noisy.completion_s != pytest.approx(exact.completion_s)


def test_poisson_interruptions_are_seeded() -> None:
    job = one_job()
    spot = pool("spot", interruption_rate_per_hour=2.0, notice_s=0.0)
    outs = [simulate([job], [spot], "cheapest-hourly", cfg(seed=s)).jobs[0] for s in range(4)]
    again = [simulate([job], [spot], "cheapest-hourly", cfg(seed=s)).jobs[0] for s in range(4)]
    assert outs == again
    assert len({o.completion_s for o in outs}) > 1  # different seeds, different interruptions
    assert all(o.preemptions > 0 and o.completion_s is not None for o in outs)
    assert any(o.lost_work_device_s > 0 for o in outs)


def _small_trace(n: int = 16, seed: int = 2) -> list[TraceJob]:
    return generate_trace(TraceMix(n_jobs=n, span_s=n * 1200.0, job_hours=(0.3, 3.0)), seed=seed)


def _pools() -> list[Pool]:
    from tests.conftest import EXAMPLES

    from trainyard.catalog.pools import load_pools

    return load_pools(EXAMPLES / "sim-pools.yaml")


@pytest.fixture(scope="module")
def runs() -> dict[str, object]:
    jobs = _small_trace()
    pools = _pools()
    c = SimConfig(seed=7, spot_price_volatility=0.2)
    return {
        p: simulate(jobs, pools, p, c) for p in ("trainyard", "cheapest-hourly", "fastest", "on-demand-only")
    }


def test_conservation(runs: dict[str, object]) -> None:
    for r in runs.values():
        done = [j for j in r.jobs if j.completion_s is not None]  # type: ignore[attr-defined]
        assert len(done) == len(r.jobs)  # type: ignore[attr-defined]
        assert len({j.job_id for j in done}) == len(done)  # each exactly once
        assert r.billed_device_s == pytest.approx(r.held_device_s, rel=1e-9)  # type: ignore[attr-defined]
        usage = sum(j.cost_usd for j in r.jobs)  # type: ignore[attr-defined]
        assert usage == pytest.approx(r.usage_cost_usd, rel=1e-9)  # type: ignore[attr-defined]
        assert r.total_cost_usd == pytest.approx(usage + r.committed_cost_usd, rel=1e-9)  # type: ignore[attr-defined]
        for ps in r.pools:  # type: ignore[attr-defined]
            assert ps.held_device_s <= ps.capacity_device_s + 1e-6
        # the queue drains and nothing is running at the end
        assert r.samples[-1].queued == 0 and r.samples[-1].running == 0  # type: ignore[attr-defined]


def test_determinism_per_seed(runs: dict[str, object]) -> None:
    jobs = _small_trace()
    again = simulate(jobs, _pools(), "trainyard", SimConfig(seed=7, spot_price_volatility=0.2))
    first = runs["trainyard"]
    assert again.jobs == first.jobs  # type: ignore[attr-defined]
    a, b = again.summary(), first.summary()  # type: ignore[attr-defined]
    a.pop("solver_time_p99_s")
    b.pop("solver_time_p99_s")
    assert a == b
    other = simulate(jobs, _pools(), "trainyard", SimConfig(seed=8, spot_price_volatility=0.2))
    assert other.jobs != first.jobs  # type: ignore[attr-defined]


def test_summary_contract(runs: dict[str, object]) -> None:
    s = runs["trainyard"].summary()  # type: ignore[attr-defined]
    assert list(s) == [
        "policy", "jobs_total", "jobs_completed", "total_cost_usd", "committed_cost_usd", "mean_jct_s",
        "p99_jct_s", "deadline_misses", "preemptions", "lost_work_device_s", "solver_time_p99_s",
        "lower_bound_cost_usd",
    ]  # fmt: skip
    assert s["total_cost_usd"] >= s["lower_bound_cost_usd"] > 0


def test_baselines_behave_as_named(runs: dict[str, object]) -> None:
    pools = {p.name: p for p in _pools()}
    jobs = {j.job_id: j for j in _small_trace()}
    book = OptionBook()
    book.set_pools(list(pools.values()))
    for j in runs["fastest"].jobs:  # type: ignore[attr-defined]
        assert all(pools[p].market.value == "on_demand" for p in j.pools)
    for j in runs["on-demand-only"].jobs:  # type: ignore[attr-defined]
        assert all(pools[p].market.value != "spot" for p in j.pools)
        assert j.preemptions == 0
    # cheapest-hourly: the first allocation of every job is on the cheapest $/device-hour among the pools
    # where the job fits (capacity permitting), so it never picks a pricier pool while a cheaper one is idle
    cheapest_any = 0
    for j in runs["cheapest-hourly"].jobs:  # type: ignore[attr-defined]
        spec = jobs[j.job_id].spec
        feasible = [n for n in pools if book.feasible(j.job_id, spec, n)]
        best = min(pools[n].price_usd_per_device_hour for n in feasible)  # type: ignore[type-var]
        if pools[j.pools[0]].price_usd_per_device_hour == best:
            cheapest_any += 1
    assert cheapest_any >= len(jobs) * 0.8
    # fastest: the first allocation has the lowest predicted step time among on-demand options that fit
    for j in runs["fastest"].jobs[:3]:  # type: ignore[attr-defined]
        spec = jobs[j.job_id].spec
        od = [
            o
            for n, p in pools.items()
            if p.market.value == "on_demand"
            for o in book.feasible(j.job_id, spec, n)
            if capacity_devices(p, o.devices) <= p.total_devices
        ]
        assert min(o.step_time_s for o in od) == pytest.approx(
            min(o.step_time_s for o in od if o.pool == j.pools[0])
        )


def test_trainyard_saves_against_baselines(runs: dict[str, object]) -> None:
    ty = runs["trainyard"].summary()  # type: ignore[attr-defined]
    od = runs["on-demand-only"].summary()  # type: ignore[attr-defined]
    fast = runs["fastest"].summary()  # type: ignore[attr-defined]
    assert ty["total_cost_usd"] < od["total_cost_usd"] < fast["total_cost_usd"]
    assert od["preemptions"] == 0 and fast["preemptions"] == 0


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 6),
    policy=st.sampled_from(["cheapest-hourly", "fastest"]),
    drops=st.lists(st.tuples(st.floats(0, 20_000), st.integers(0, 8)), max_size=4),
    sigma=st.floats(0.0, 0.5),
)
def test_invariants_hold_under_random_preemptions(
    seed: int, n: int, policy: str, drops: list[tuple[float, int]], sigma: float
) -> None:
    jobs = generate_trace(TraceMix(n_jobs=n, span_s=4 * 3600.0, job_hours=(0.2, 1.5)), seed=seed)
    pools = [
        pool("spot", name="s", nodes=1, devices_per_node=8, interruption_rate_per_hour=0.5, notice_s=30.0),
        pool("on_demand", name="o", nodes=1, devices_per_node=8),
    ]
    changes = (
        *(PoolChange(t, "s", available_devices=d) for t, d in drops),
        PoolChange(25_000.0, "s", available_devices=8),  # capacity comes back, so every job can finish
    )
    r = simulate(jobs, pools, policy, SimConfig(seed=seed, step_time_error_sigma=sigma, changes=changes))
    assert all(j.completion_s is not None and j.completion_s >= j.submit_s for j in r.jobs)
    assert r.billed_device_s == pytest.approx(r.held_device_s, rel=1e-9)
    assert sum(j.cost_usd for j in r.jobs) + r.committed_cost_usd == pytest.approx(r.total_cost_usd, rel=1e-9)
    assert all(j.lost_work_device_s >= 0 and j.attempts == j.preemptions + 1 for j in r.jobs)
    for j in r.jobs:  # nobody beats running alone on the cheapest option at true speed
        assert j.cost_usd >= j.lower_bound_cost_usd * (1 - 1e-9)
    on_demand = next(ps for ps in r.pools if ps.name == "o")
    assert on_demand.held_device_s <= on_demand.capacity_device_s + 1e-6


def test_cheapest_hourly_and_fastest_rules_directly() -> None:
    from trainyard.sim.policy import QueuedView, cheapest_hourly, fastest

    pools = [
        pool("on_demand", name="a100-od", price_usd_per_device_hour=3.0),
        pool("spot", name="a100-spot", price_usd_per_device_hour=1.0),
        pool("on_demand", name="l4-od", accelerator="l4", price_usd_per_device_hour=0.8),
        pool("on_demand", name="h100-od", accelerator="h100", price_usd_per_device_hour=6.0),
    ]
    doc = one_job().spec.to_document()
    doc.pop("measured")  # predicted step times: the H100 is the fastest, the L4 the slowest
    job = QueuedView("j", "t", spec_from_dict(doc), 0.0)
    book = OptionBook()
    book.set_pools(pools)
    cheap, fast = cheapest_hourly(book), fastest(book)
    assert [s.pool for s in cheap.decide(0.0, [job], [], pools).starts] == ["l4-od"]
    full_l4 = [p.model_copy(update={"available_devices": 0}) if p.name == "l4-od" else p for p in pools]
    assert [s.pool for s in cheap.decide(0.0, [job], [], full_l4).starts] == ["a100-spot"]
    assert [s.pool for s in fast.decide(0.0, [job], [], pools).starts] == ["h100-od"]
    no_h100 = [p.model_copy(update={"available_devices": 0}) if p.name == "h100-od" else p for p in pools]
    assert [s.pool for s in fast.decide(0.0, [job], [], no_h100).starts] == ["a100-od"]  # never spot
    nothing = [p.model_copy(update={"available_devices": 0}) for p in pools]
    assert (
        cheap.decide(0.0, [job], [], nothing).starts == ()
        and cheap.decide(0.0, [job], [], nothing).unplaced == 1
    )


class _MoveOnce:
    """A scripted policy: start the job on pool "a", move it to pool "b" at the first re-plan after 1800 s."""

    name = "scripted"
    migrates = True

    def decide(self, now_s, queued, running, pools):  # type: ignore[no-untyped-def]
        from trainyard.sim.policy import Decision, Start

        if queued:
            return Decision(starts=(Start(queued[0].job_id, "a", 1),))
        if running and running[0].pool == "a" and now_s >= 1800.0:
            return Decision(starts=(Start(running[0].job_id, "b", 1, migration=True),))
        return Decision(starts=())


def test_migration_checkpoints_moves_and_bills_both_allocations() -> None:
    from trainyard.sim import Simulator

    job = one_job()
    pools = [pool(name="a", price_usd_per_device_hour=3.0), pool(name="b", price_usd_per_device_hour=1.0)]
    c = cfg(periodic_round_s=1800.0, replan_running_s=0.0)
    r = Simulator([job], pools, _MoveOnce(), c).run()
    (out,) = r.jobs
    assert out.migrations == 1 and out.attempts == 2 and out.pools == ("a", "b") and out.preemptions == 0
    # at 1800 s: 1620 s after start-up = two cycles (2 x 630 s) + 360 s -> 1560 s trained, all kept by the
    # checkpoint written before the move (30 s, the old allocation is released at 1830 s)
    remaining = STEPS * STEP_S - 1560.0
    new_startup = WRITE_S + PROVISION_S + load_s(job)  # waits for the checkpoint, then restarts (same family)
    finish = 1800.0 + new_startup + remaining + (math.ceil(remaining / INTERVAL_S) - 1) * WRITE_S
    assert out.completion_s == pytest.approx(finish)
    assert out.cost_usd == pytest.approx(1830.0 / 3600 * 3.0 + (finish - 1800.0) / 3600 * 1.0)
    assert r.billed_device_s == pytest.approx(r.held_device_s) == pytest.approx(1830.0 + finish - 1800.0)
    assert out.lost_work_device_s == 0.0


class _Never:
    name = "never"
    migrates = False

    def decide(self, now_s, queued, running, pools):  # type: ignore[no-untyped-def]
        from trainyard.sim.policy import Decision

        return Decision(starts=(), unplaced=len(queued))


def test_a_job_the_policy_never_places_ends_the_run_after_idle_rounds() -> None:
    from trainyard.sim import Simulator

    r = Simulator([one_job(deadline="2h")], [pool()], _Never(), cfg(give_up_after_idle_rounds=5)).run()
    (out,) = r.jobs
    assert out.completion_s is None and out.missed_deadline and r.rounds == 5
    s = r.summary()
    assert s["jobs_completed"] == 0 and s["deadline_misses"] == 1 and s["total_cost_usd"] == 0.0
    assert r.end_s == pytest.approx(4 * 3600.0)  # rounds at 0, 1 h, 2 h, 3 h, 4 h


@pytest.mark.parametrize("policy", ["trainyard", "on-demand-only"])
def test_a_job_preempted_past_its_deadline_still_completes(policy: str) -> None:
    # 1 h of work, deadline 2 h; capacity is reclaimed after 1000 s and returns only at 3 h, after the
    # deadline: the re-queued job misses it, but it is still placed and finishes
    job = one_job(deadline="2h")
    market = "spot" if policy == "trainyard" else "on_demand"
    name = f"a100-{market}"
    changes = (PoolChange(PROVISION_S + 1000.0, name, available_devices=0), PoolChange(3 * 3600.0, name, 1))
    r = simulate([job], [pool(market)], policy, cfg(changes=changes, give_up_after_idle_rounds=5))
    (out,) = r.jobs
    assert out.preemptions == 1
    assert out.completion_s is not None and out.completion_s > 3 * 3600.0
    assert out.missed_deadline
    s = r.summary()
    assert s["jobs_completed"] == 1 and s["deadline_misses"] == 1


@pytest.mark.parametrize("policy", ["cheapest-hourly", "fastest", "trainyard", "on-demand-only"])
def test_a_job_whose_deadline_is_too_short_from_the_start_still_completes(policy: str) -> None:
    # 1 h of work against a 30-minute deadline: no option can make it, so the job runs anyway (late)
    r = simulate([one_job(deadline="30m")], [pool()], policy, cfg(give_up_after_idle_rounds=5))
    (out,) = r.jobs
    assert out.completion_s is not None and out.missed_deadline


# ---- reserved capacity is committed spend; the lower bound respects pool capacity ------------------------


@pytest.mark.parametrize("policy", ["cheapest-hourly", "trainyard", "on-demand-only"])
def test_reserved_pool_is_billed_over_the_span_not_per_use(policy: str) -> None:
    job = one_job()
    reserved = pool("reserved", nodes=2)  # 2 devices committed, the job uses one
    r = simulate([job], [reserved], policy, cfg())
    wall = PROVISION_S + STEPS * STEP_S + 5 * WRITE_S
    (out,) = r.jobs
    assert out.completion_s == pytest.approx(wall)
    assert out.cost_usd == 0.0 and r.usage_cost_usd == 0.0  # using committed capacity costs nothing more
    assert r.committed_cost_usd == pytest.approx(2 * wall / 3600.0 * PRICE)  # both devices, whole span
    assert r.total_cost_usd == pytest.approx(r.committed_cost_usd)
    s = r.summary()
    assert s["committed_cost_usd"] == pytest.approx(r.committed_cost_usd)
    assert s["lower_bound_cost_usd"] == pytest.approx(r.committed_cost_usd)  # nothing cheaper than free


def test_unused_reserved_capacity_is_billed_to_every_policy() -> None:
    doc = one_job().spec.to_document()
    doc["requirements"] = {"regions": ["us-*"]}
    job = TraceJob(job_id="hand", submit_s=0.0, tenant="t", spec=spec_from_dict(doc))
    pools = [pool("on_demand"), pool("reserved", name="res", region="eu-west-1")]  # outside the job's regions
    for policy in ("fastest", "cheapest-hourly", "trainyard"):
        r = simulate([job], pools, policy, cfg())
        (out,) = r.jobs
        assert out.pools == ("a100-on_demand",)
        assert r.committed_cost_usd == pytest.approx(r.end_s / 3600.0 * PRICE)
        assert r.total_cost_usd == pytest.approx(out.cost_usd + r.committed_cost_usd)


def _reserved_and_on_demand() -> tuple[list[TraceJob], list[Pool]]:
    """Two one-hour jobs, one on-demand device and one reserved one: on-demand-only takes both devices
    and runs the jobs side by side, fastest keeps to the on-demand device and runs them one after the
    other."""
    jobs = [replace(one_job(), job_id=f"j{i}") for i in range(2)]
    return jobs, [pool("on_demand"), pool("reserved", name="res")]


def test_policies_compared_on_one_workload_pay_the_same_committed_spend() -> None:
    jobs, pools = _reserved_and_on_demand()
    policies = ("on-demand-only", "fastest")
    sims = run_policies(jobs, pools, policies, cfg())
    own = {p: sim.result(None) for p, sim in sims.items()}
    spans = {p: r.end_s for p, r in own.items()}
    longer, shorter = "fastest", "on-demand-only"
    assert spans[longer] > 1.8 * spans[shorter]  # the two runs really differ in length
    assert common_span_s(sims) == pytest.approx(spans[longer])
    common = simulate_policies(jobs, pools, policies, cfg())
    for p in policies:
        r, o = common[p], own[p]
        assert r.committed_span_s == pytest.approx(spans[longer])
        assert r.committed_cost_usd == pytest.approx(spans[longer] / 3600.0 * PRICE)  # one reserved device
        assert o.committed_cost_usd == pytest.approx(spans[p] / 3600.0 * PRICE)
        assert r.jobs == o.jobs and r.usage_cost_usd == pytest.approx(o.usage_cost_usd)  # the run is the same
        assert r.total_cost_usd == pytest.approx(r.usage_cost_usd + r.committed_cost_usd)
        assert r.committed_cost_usd <= r.lower_bound_cost_usd <= r.total_cost_usd * (1 + 1e-9)
    # the shorter run pays for the reservation until the longer one ends; the longer one is unchanged
    assert common[longer] == own[longer]
    assert common[shorter].committed_cost_usd == pytest.approx(common[longer].committed_cost_usd)
    # the bound's capacities are over the common span too: over its own span the reserved device has room
    # for one of the two jobs only, over the longer span for both, so no usage is left to bound
    assert own[shorter].lower_bound_cost_usd - own[shorter].committed_cost_usd > 0.9 * PRICE
    assert common[shorter].lower_bound_cost_usd == pytest.approx(common[shorter].committed_cost_usd)


def test_a_configured_committed_span_longer_than_the_run_bills_the_whole_term() -> None:
    jobs, pools = _reserved_and_on_demand()
    term_s = 5 * 86400.0
    sim = Simulator(jobs, pools, make_policy("on-demand-only", OptionBook()), cfg(committed_span_s=term_s))
    with pytest.raises(RuntimeError):
        sim.result(None)
    r = sim.run()
    assert r.end_s < 3 * 3600.0 and sim.span_s == term_s and r.committed_span_s == pytest.approx(term_s)
    assert r.committed_cost_usd == pytest.approx(term_s / 3600.0 * PRICE)
    assert sim.result(term_s) is r  # one result (and one bound LP) per span
    assert sim.result(None).committed_cost_usd == pytest.approx(r.end_s / 3600.0 * PRICE)
    # a span shorter than the run bills the run's own span
    assert sim.result(60.0).committed_cost_usd == pytest.approx(r.end_s / 3600.0 * PRICE)
    # the pool statistics keep the run's own capacity (utilisation is of the run, not of the term)
    (res,) = [ps for ps in r.pools if ps.name == "res"]
    assert res.capacity_device_s == pytest.approx(r.end_s)


def test_capacity_aware_bound_sees_a_scarce_cheap_pool() -> None:
    """Two one-hour jobs, one cheap device and one dear pool: the cheap device cannot do both within the
    run, so the capacity-aware bound lies above the per-job one and below what the run paid."""
    jobs = [replace(one_job(), job_id=f"j{i}") for i in range(2)]
    pools = [
        pool("on_demand", name="cheap", price_usd_per_device_hour=1.0),
        pool("on_demand", name="dear", price_usd_per_device_hour=5.0),
    ]
    r = simulate(jobs, pools, "cheapest-hourly", cfg())
    assert all(j.completion_s is not None for j in r.jobs)
    per_job = sum(j.lower_bound_cost_usd for j in r.jobs)
    assert per_job == pytest.approx(r.per_job_lower_bound_usd)
    assert r.lower_bound_status == "optimal"
    assert per_job * 1.5 < r.lower_bound_cost_usd <= r.total_cost_usd * (1 + 1e-9)
