"""Property tests of whole rounds with the real cost model: capacity, gangs, quotas, markets, reasons."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scheduler_paths import both_pricing_paths  # noqa: F401
from scheduler_strategies import MARKETS, pool_lists
from test_scheduler_round import pool, spec

from trainyard.schedule import (
    CandidateCache,
    QueuedJob,
    RunningJob,
    SchedulerConfig,
    TenantQuota,
    schedule_round,
)
from trainyard.schedule.solver import whole_nodes

# every round runs on the vectorised pricing and on the scalar reference, which must decide alike
pytestmark = pytest.mark.usefixtures("both_pricing_paths")

ACCS = ["a100-80gb", "h100", "t4", "tpu-v4", "trn1"]
CACHE = CandidateCache()  # shared across examples: equal specs and pools are priced once


@st.composite
def rounds(draw):
    pools = draw(pool_lists(ACCS, max_pools=5))
    jobs = []
    for j in range(draw(st.integers(1, 10))):
        lo = draw(st.sampled_from([1, 2, 4, 8, 16]))
        hi = lo * draw(st.sampled_from([1, 2, 4]))
        markets = draw(st.lists(st.sampled_from(MARKETS), min_size=1, max_size=3, unique=True))
        s = spec(
            f"j{j}",
            resources={"min_devices": lo, "max_devices": hi},
            objective={"markets": markets},
            measured={"step_time_s": {"a100-80gb": 1.0, "h100": 0.7}},
        )
        jobs.append(
            QueuedJob(
                f"j{j}",
                draw(st.sampled_from(["a", "b"])),
                s,
                submit_s=0.0,
                priority=draw(st.integers(0, 2)),
            )
        )
    running = []
    for r in range(draw(st.integers(0, 3))):
        home = draw(st.sampled_from(pools))
        s = spec(
            f"r{r}",
            workload={"steps": 20000},
            objective={"deadline": draw(st.sampled_from(["12h", "48h"]))},
            measured={"step_time_s": {"a100-80gb": 1.0, "h100": 0.7}},
        )
        running.append(
            RunningJob(
                f"r{r}",
                draw(st.sampled_from(["a", "b"])),
                s,
                submit_s=0.0,
                pool=home.name,
                devices=1,
                market=home.market.value,
                placed_s=0.0,
                progress_fraction=draw(st.sampled_from([0.05, 0.3, 0.6])),
            )
        )
    quotas = {
        "a": TenantQuota(
            max_devices=draw(st.none() | st.integers(0, 24)), max_jobs=draw(st.none() | st.integers(0, 4))
        )
    }
    return pools, jobs, running, quotas


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds())
def test_round_invariants(case) -> None:
    pools, jobs, running, quotas = case
    cfg = SchedulerConfig(time_limit_s=0.1, quotas=quotas)
    r = schedule_round(jobs, pools, running, now_s=6 * 3600.0, config=cfg, cache=CACHE)
    by_pool = {p.name: p for p in pools}
    by_job = {j.job_id: j for j in (*jobs, *running)}
    # every queued job is placed or unplaced with a reason, every running job kept or moved, exactly once
    ids = [p.job_id for p in r.placements] + [u.job_id for u in r.unplaced] + list(r.kept)
    assert sorted(ids) == sorted(by_job)
    assert {p.job_id for p in r.placements if p.migration} | set(r.kept) == {rj.job_id for rj in running}
    assert all(u.reason.strip() for u in r.unplaced)
    used: dict[str, int] = defaultdict(int)
    whole: dict[str, int] = defaultdict(int)
    chosen = defaultdict(list)
    t_dev: dict[str, int] = defaultdict(int)
    t_jobs: dict[str, int] = defaultdict(int)
    for rj in running:  # running jobs hold their devices against the quota (a move releases the old ones)
        t_dev[rj.tenant] += rj.devices
        t_jobs[rj.tenant] += 1
    moved = {p.job_id for p in r.placements if p.migration}
    for rj in running:
        if rj.job_id in moved:
            t_dev[rj.tenant] -= rj.devices
            t_jobs[rj.tenant] -= 1
    for p in r.placements:
        pl = by_pool[p.pool]
        s = by_job[p.job_id].spec
        # markets respected
        assert p.market == pl.market.value
        assert p.market in {m.value for m in s.objective.markets}
        # gangs whole: the job's device range, whole nodes when it spans nodes
        assert (s.resources.min_devices or 1) <= p.devices <= (s.resources.max_devices or p.devices)
        assert p.nodes == math.ceil(p.devices / pl.devices_per_node)
        if p.nodes > 1:
            assert p.devices % pl.devices_per_node == 0
            whole[p.pool] += p.nodes
            used[p.pool] += p.nodes * pl.devices_per_node
        else:
            used[p.pool] += p.devices
        chosen[p.pool].append(p)
        t_dev[p.tenant] += p.devices
        t_jobs[p.tenant] += 1
    for name, n in used.items():
        pl = by_pool[name]
        # never over capacity, multi-node gangs on whole free nodes, and every gang gets concrete nodes
        assert n <= pl.free_devices
        assert whole[name] <= whole_nodes(pl.free_devices, pl.devices_per_node)
    # quotas: the round never takes a tenant over its quota (running jobs may already be over it)
    q = quotas["a"]
    held_dev = sum(rj.devices for rj in running if rj.tenant == "a")
    held_jobs = sum(1 for rj in running if rj.tenant == "a")
    if q.max_devices is not None:
        assert t_dev["a"] <= max(q.max_devices, held_dev)
    if q.max_jobs is not None:
        assert t_jobs["a"] <= max(q.max_jobs, held_jobs)


def test_rounds_are_deterministic_across_caches() -> None:
    pools = [
        pool("a", "a100-80gb", 2.0, per_node=8, nodes=2, available=12),
        pool("h", "h100", 4.0, per_node=8),
    ]
    jobs = [
        QueuedJob(f"j{i}", "t", spec(f"j{i}", resources={"min_devices": 2 ** (i % 4), "max_devices": 8}), 0.0)
        for i in range(12)
    ]
    a = schedule_round(jobs, pools, config=SchedulerConfig(time_limit_s=0.2))
    b = schedule_round(jobs, pools, config=SchedulerConfig(time_limit_s=0.2), cache=CandidateCache())
    assert a.to_contract()["placements"] == b.to_contract()["placements"]
    assert a.to_contract()["unplaced"] == b.to_contract()["unplaced"]
