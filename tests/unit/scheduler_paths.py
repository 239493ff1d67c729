"""Every round a scheduler test runs is run twice, with the vectorised pricing (``schedule.grid``) and
with the scalar reference (one quote per option), and the two must decide alike.

A test module opts in with ``pytestmark = pytest.mark.usefixtures("both_pricing_paths")`` after importing
the fixture; its ``schedule_round`` is then the checked one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from trainyard.schedule import CandidateCache, RoundResult, SchedulerConfig, schedule_round


def decisions(r: RoundResult) -> tuple[Any, ...]:
    """Everything a round decides and says (placements with reasons and alternatives, unplaced jobs with
    reasons, kept jobs, the objective and the bounds), not how long it took."""
    return (
        r.placements,
        r.unplaced,
        r.kept,
        r.objective_usd,
        r.solver_status,
        r.greedy_objective_usd,
        r.lower_bound_usd,
    )


def both_paths(
    jobs: Any,
    pools: Any,
    running: Any = (),
    now_s: float = 0.0,
    config: SchedulerConfig | None = None,
    *,
    cache: CandidateCache | None = None,
    time_limit_s: float | None = None,
    groups: Any = None,
) -> RoundResult:
    """``schedule_round`` on the vectorised path, checked against the scalar reference on a cache of its
    own (with the same calibration hook)."""
    cfg = config or SchedulerConfig()
    ref_cache = CandidateCache(calibrated=cache.calibrated if cache is not None else None)
    ref = schedule_round(
        jobs, pools, running, now_s, replace(cfg, vectorised_pricing=False), cache=ref_cache,
        time_limit_s=time_limit_s, groups=groups,
    )  # fmt: skip
    got = schedule_round(
        jobs, pools, running, now_s, replace(cfg, vectorised_pricing=True), cache=cache,
        time_limit_s=time_limit_s, groups=groups,
    )  # fmt: skip
    assert decisions(got) == decisions(ref)
    return got


@pytest.fixture
def both_pricing_paths(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(request.module, "schedule_round", both_paths)
    yield
