"""The scheduler: the whole queue against live pools as one constrained optimisation per round.

Entry point: :func:`schedule_round`. See docs/scheduler.md.
"""

from trainyard.schedule.candidates import CandidateCache
from trainyard.schedule.jobs import JobsFileError, parse_jobs
from trainyard.schedule.replan import EventKind, Replanner, SchedulerEvent
from trainyard.schedule.round import schedule_round
from trainyard.schedule.types import (
    Alternative,
    Candidate,
    JobGroup,
    Placement,
    PoolState,
    QueuedJob,
    RoundResult,
    RunningJob,
    SchedulerConfig,
    TenantQuota,
    Unplaced,
)

__all__ = [
    "Alternative",
    "Candidate",
    "CandidateCache",
    "EventKind",
    "JobGroup",
    "JobsFileError",
    "Placement",
    "PoolState",
    "QueuedJob",
    "Replanner",
    "RoundResult",
    "RunningJob",
    "SchedulerConfig",
    "SchedulerEvent",
    "TenantQuota",
    "Unplaced",
    "parse_jobs",
    "schedule_round",
]
