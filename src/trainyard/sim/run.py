"""One call to simulate a trace under a named policy."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trainyard.catalog.pools import Pool
from trainyard.sim.engine import SimConfig, SimResult, Simulator
from trainyard.sim.policy import OptionBook, make_policy
from trainyard.sim.spot import SpotTrace
from trainyard.sim.trace import TraceJob


def simulate(
    jobs: Sequence[TraceJob],
    pools: Sequence[Pool],
    policy: str,
    config: SimConfig | None = None,
    *,
    spot_traces: Mapping[str, SpotTrace] | None = None,
    scheduler_config: Any = None,
    timer: Callable[[], float] | None = None,
) -> SimResult:
    """Run ``jobs`` on ``pools`` under ``policy`` (``trainyard``, ``cheapest-hourly``, ``fastest`` or
    ``on-demand-only``). Equal inputs and seed give equal results (solver timings aside)."""
    book = OptionBook()
    sim = Simulator(
        jobs,
        pools,
        make_policy(policy, book, scheduler_config),
        config,
        spot_traces=spot_traces,
        book=book,
        timer=timer,
    )
    return sim.run()
