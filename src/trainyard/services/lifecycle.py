"""The job state machine of DESIGN §3.3, in one table.

Every state change in the platform goes through :func:`check_transition`; an edge missing from
:data:`TRANSITIONS` is an :class:`~trainyard.errors.IllegalTransitionError`. The module is pure.
"""

from __future__ import annotations

from trainyard.enums import JobState
from trainyard.errors import IllegalTransitionError

__all__ = [
    "ACTIVE_STATES",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "JobState",
    "can_transition",
    "check_transition",
    "is_terminal",
]

S = JobState

#: The only legal edges. Reasons for each edge:
#:   pending→queued      admission found at least one feasible option
#:   pending→failed      nothing can run the job (infeasible quote)
#:   queued→starting     the scheduler placed the job
#:   starting→running    the executor reported the workers started
#:   starting→queued     launch failed on infrastructure, or the control plane restarted mid-launch
#:   starting→preempted  capacity was taken away before the first step
#:   starting/running→succeeded|failed   the executor reported the outcome
#:   running→preempted   spot reclaim, node loss or lost workers after a restart
#:   preempted→queued    re-enters the queue, resumes from its last committed checkpoint
#:   any live state→cancelled            the user cancelled
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    S.PENDING: frozenset({S.QUEUED, S.FAILED, S.CANCELLED}),
    S.QUEUED: frozenset({S.STARTING, S.FAILED, S.CANCELLED}),
    S.STARTING: frozenset({S.RUNNING, S.QUEUED, S.PREEMPTED, S.SUCCEEDED, S.FAILED, S.CANCELLED}),
    S.RUNNING: frozenset({S.PREEMPTED, S.SUCCEEDED, S.FAILED, S.CANCELLED}),
    S.PREEMPTED: frozenset({S.QUEUED, S.FAILED, S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}

TERMINAL_STATES: frozenset[JobState] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
ACTIVE_STATES: frozenset[JobState] = frozenset({S.STARTING, S.RUNNING})  # hold capacity


def can_transition(current: JobState | str, target: JobState | str) -> bool:
    return JobState(target) in TRANSITIONS[JobState(current)]


def check_transition(current: JobState | str, target: JobState | str, *, job_id: str = "") -> JobState:
    """Return ``target`` as a JobState when the edge is legal; raise IllegalTransitionError otherwise."""
    cur, tgt = JobState(current), JobState(target)
    if tgt not in TRANSITIONS[cur]:
        allowed = ", ".join(sorted(TRANSITIONS[cur])) or "none (terminal state)"
        who = f"job {job_id}" if job_id else "job"
        raise IllegalTransitionError(
            f"{who} cannot go from {cur.value} to {tgt.value}",
            details={"job_id": job_id, "from": cur.value, "to": tgt.value, "allowed": allowed},
        )
    return tgt


def is_terminal(state: JobState | str) -> bool:
    return JobState(state) in TERMINAL_STATES
