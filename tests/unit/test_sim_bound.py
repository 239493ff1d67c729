"""The capacity-aware lower bound (sim.bound): a relaxation of every capacity-respecting assignment."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.sim.bound import BoundOption, capacity_lower_bound


def test_hand_instance() -> None:
    # two jobs, each 1 device-hour; the cheap pool holds 1.5 device-hours: one and a half jobs go there
    opts = {j: [BoundOption("cheap", 1.0, 3600.0), BoundOption("dear", 4.0, 3600.0)] for j in ("a", "b")}
    b = capacity_lower_bound(opts, {"cheap": 5400.0, "dear": 1e9})
    assert b.status == "optimal"
    assert b.usage_usd == pytest.approx(1.5 * 1.0 + 0.5 * 4.0)
    unlimited = capacity_lower_bound(opts, {"cheap": 1e9, "dear": 1e9})
    assert unlimited.usage_usd == pytest.approx(2.0)  # the per-job bound when capacity never binds
    none = capacity_lower_bound(opts, {"cheap": 0.0, "dear": 0.0})
    assert none.status == "infeasible" and none.usage_usd == pytest.approx(2.0)  # falls back


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    n_jobs=st.integers(1, 8),
    n_pools=st.integers(1, 4),
)
def test_bound_between_per_job_bound_and_any_feasible_assignment(
    data: st.DataObject, n_jobs: int, n_pools: int
) -> None:
    pools = [f"p{i}" for i in range(n_pools)]
    opts: dict[str, list[BoundOption]] = {}
    for j in range(n_jobs):
        chosen = data.draw(st.lists(st.sampled_from(pools), min_size=1, max_size=n_pools, unique=True))
        opts[f"j{j}"] = [
            BoundOption(p, data.draw(st.floats(0.0, 100.0)), data.draw(st.floats(1.0, 1e4))) for p in chosen
        ]
    # capacities that admit one particular whole-job assignment (so the programme is feasible)
    assign = {j: data.draw(st.sampled_from(o)) for j, o in opts.items()}
    cap = {p: 0.0 for p in pools}
    for o in assign.values():
        cap[o.pool] += o.device_s
    cap = {p: c + data.draw(st.floats(0.0, 1e4)) for p, c in cap.items()}
    b = capacity_lower_bound(opts, cap)
    assert b.status == "optimal"
    per_job = sum(min(o.cost_usd for o in os) for os in opts.values())
    assert b.usage_usd >= per_job - 1e-6 * (1 + per_job)
    assert b.usage_usd <= sum(o.cost_usd for o in assign.values()) + 1e-6 * (1 + per_job)
