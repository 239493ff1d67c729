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
    return _simulator(jobs, pools, policy, config, spot_traces, scheduler_config, timer).run()


def _simulator(
    jobs: Sequence[TraceJob],
    pools: Sequence[Pool],
    policy: str,
    config: SimConfig | None,
    spot_traces: Mapping[str, SpotTrace] | None,
    scheduler_config: Any,
    timer: Callable[[], float] | None,
) -> Simulator:
    book = OptionBook()
    policy_ = make_policy(policy, book, scheduler_config)
    return Simulator(jobs, pools, policy_, config, spot_traces=spot_traces, book=book, timer=timer)


def run_policies(
    jobs: Sequence[TraceJob],
    pools: Sequence[Pool],
    policies: Sequence[str],
    config: SimConfig | None = None,
    *,
    spot_traces: Mapping[str, SpotTrace] | None = None,
    scheduler_config: Any = None,
    timer: Callable[[], float] | None = None,
) -> dict[str, Simulator]:
    """Run ``jobs`` under each policy; each finished :class:`Simulator` gives its result over any
    committed span (``Simulator.result``)."""
    sims = {}
    for policy in policies:
        sim = _simulator(jobs, pools, policy, config, spot_traces, scheduler_config, timer)
        sim.run()
        sims[policy] = sim
    return sims


def common_span_s(sims: Mapping[str, Simulator]) -> float:
    """The span every run of one workload is billed over: the longest run's (or the configured
    ``committed_span_s`` when that is longer)."""
    return max((sim.span_s for sim in sims.values()), default=0.0)


def simulate_policies(
    jobs: Sequence[TraceJob],
    pools: Sequence[Pool],
    policies: Sequence[str],
    config: SimConfig | None = None,
    *,
    spot_traces: Mapping[str, SpotTrace] | None = None,
    scheduler_config: Any = None,
    timer: Callable[[], float] | None = None,
) -> dict[str, SimResult]:
    """Run ``jobs`` under each policy and bill reserved capacity over one span for all of them
    (:func:`common_span_s`). A reservation is paid for whether used or not, so a policy that finishes
    sooner does not pay less for it; the capacity-aware bound of every run is over that span too."""
    sims = run_policies(
        jobs, pools, policies, config, spot_traces=spot_traces, scheduler_config=scheduler_config, timer=timer
    )
    span_s = common_span_s(sims)
    return {p: sim.result(span_s) for p, sim in sims.items()}
