"""Names with a closed set of values that the API, the client and the core share: job states,
markets, dataset formats, pool backends. Standard library only, so every layer can import them."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    PENDING = "pending"  # accepted and stored; not yet quoted/admitted
    QUEUED = "queued"  # admitted: quoted, feasible, waiting for capacity
    STARTING = "starting"  # placed; workers are being launched
    RUNNING = "running"  # workers report progress
    PREEMPTED = "preempted"  # capacity taken away; the job goes back to the queue
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: States a job never leaves.
TERMINAL_JOB_STATES: frozenset[JobState] = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}
)


class Market(StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on_demand"
    RESERVED = "reserved"


class DatasetFormat(StrEnum):
    """How the rows of a JSON Lines dataset are read (DESIGN §3.7); ``auto`` only on upload."""

    AUTO = "auto"
    TEXT = "text"
    COMPLETION = "completion"
    CHAT = "chat"


class PoolBackend(StrEnum):
    """Which executor can start work on a pool; ``none`` is planning only."""

    LOCAL = "local"
    RAY = "ray"
    NONE = "none"
