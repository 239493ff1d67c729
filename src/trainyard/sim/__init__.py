"""Discrete-event cluster simulator: arrivals, spot preemptions and prices, true vs predicted step times,
the real scheduler in rounds, baselines, and reports. Pure apart from ``trainyard.sim.files``.

Entry points: :func:`simulate`, :class:`Simulator`, :func:`generate_trace`. See docs/simulator.md.
"""

from trainyard.sim.engine import JobOutcome, PoolChange, PoolStats, Sample, SimConfig, SimResult, Simulator
from trainyard.sim.generate import TraceMix, generate_trace
from trainyard.sim.metrics import SUMMARY_KEYS, summarize
from trainyard.sim.policy import (
    POLICY_NAMES,
    Decision,
    OptionBook,
    Policy,
    QueuedView,
    RunningView,
    SchedulerPolicy,
    Start,
    make_policy,
)
from trainyard.sim.run import common_span_s, run_policies, simulate, simulate_policies
from trainyard.sim.spot import SpotTrace, parse_spot_trace
from trainyard.sim.trace import TraceError, TraceJob, dump_trace, parse_trace

__all__ = [
    "POLICY_NAMES",
    "SUMMARY_KEYS",
    "Decision",
    "JobOutcome",
    "OptionBook",
    "Policy",
    "PoolChange",
    "PoolStats",
    "QueuedView",
    "RunningView",
    "Sample",
    "SchedulerPolicy",
    "SimConfig",
    "SimResult",
    "Simulator",
    "SpotTrace",
    "Start",
    "TraceError",
    "TraceJob",
    "TraceMix",
    "common_span_s",
    "dump_trace",
    "generate_trace",
    "make_policy",
    "parse_spot_trace",
    "parse_trace",
    "run_policies",
    "simulate",
    "simulate_policies",
    "summarize",
]
