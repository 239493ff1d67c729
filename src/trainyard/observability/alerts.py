"""Alert rules over the platform's health snapshot (pure: the snapshot comes in, alerts come out).

Rules:
- ``job_failing_repeatedly``: a job that is still open has failed (or lost its workers) at least
  ``failures_warning`` times; critical from ``failures_critical``.
- ``heartbeat_missed``: a running job has not reported for ``heartbeat_timeout_s``.
- ``budget_burn``: a job's cost so far has used ``budget_warning_fraction`` of its ``budget_usd``;
  critical once the budget is spent.
- ``stuck_starting``: a job placed ``starting_timeout_s`` ago has not reported its workers started.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

WARNING = "warning"
CRITICAL = "critical"


@dataclass(frozen=True)
class AlertThresholds:
    failures_warning: int = 2
    failures_critical: int = 4
    heartbeat_timeout_s: float = 300.0
    budget_warning_fraction: float = 0.8
    starting_timeout_s: float = 900.0


@dataclass(frozen=True)
class JobHealth:
    """What the rules need to know about one open job."""

    job_id: str
    tenant_id: str
    tenant_name: str
    name: str
    state: str
    attempt: int
    failures: int  # failed + lost events over all attempts
    preemptions: int
    last_report_age_s: float | None  # since the last heartbeat (or the attempt start when none came)
    cost_usd: float  # closed attempts plus the running attempt so far
    budget_usd: float | None
    restarts: int = 0  # restarts after failures
    progress: dict[str, Any] = field(default_factory=dict)  # the latest heartbeat (step, loss, ...)


@dataclass(frozen=True)
class Alert:
    rule: str
    severity: str
    message: str
    value: float
    threshold: float
    job_id: str | None = None
    tenant_id: str | None = None


RULES: dict[str, str] = {
    "job_failing_repeatedly": "An open job keeps failing and being restarted.",
    "heartbeat_missed": "A running job stopped reporting heartbeats.",
    "budget_burn": "A job's cost is close to (or over) its budget.",
    "stuck_starting": "A placed job has not started its workers.",
}


def evaluate(jobs: Sequence[JobHealth], thresholds: AlertThresholds | None = None) -> list[Alert]:
    """Every alert that fires now, critical ones first, then by rule and job id."""
    t = thresholds or AlertThresholds()
    out: list[Alert] = []
    for j in jobs:
        if j.failures >= t.failures_warning:
            sev = CRITICAL if j.failures >= t.failures_critical else WARNING
            out.append(
                Alert(
                    "job_failing_repeatedly",
                    sev,
                    f"{j.name} failed {j.failures} times (attempt {j.attempt}, state {j.state})",
                    float(j.failures),
                    float(t.failures_warning),
                    j.job_id,
                    j.tenant_id,
                )
            )
        age = j.last_report_age_s
        if j.state == "running" and age is not None and age > t.heartbeat_timeout_s:
            out.append(
                Alert(
                    "heartbeat_missed",
                    CRITICAL if age > 3 * t.heartbeat_timeout_s else WARNING,
                    f"{j.name} has not reported for {age:.0f} s",
                    age,
                    t.heartbeat_timeout_s,
                    j.job_id,
                    j.tenant_id,
                )
            )
        if j.state == "starting" and age is not None and age > t.starting_timeout_s:
            out.append(
                Alert(
                    "stuck_starting",
                    WARNING,
                    f"{j.name} was placed {age:.0f} s ago and its workers have not started",
                    age,
                    t.starting_timeout_s,
                    j.job_id,
                    j.tenant_id,
                )
            )
        if j.budget_usd is not None and j.budget_usd > 0:
            used = j.cost_usd / j.budget_usd
            if used >= t.budget_warning_fraction:
                out.append(
                    Alert(
                        "budget_burn",
                        CRITICAL if used >= 1.0 else WARNING,
                        f"{j.name} has spent ${j.cost_usd:.2f} of its ${j.budget_usd:.2f} budget "
                        f"({used:.0%})",
                        used,
                        t.budget_warning_fraction,
                        j.job_id,
                        j.tenant_id,
                    )
                )
    out.sort(key=lambda a: (a.severity != CRITICAL, a.rule, a.job_id or ""))
    return out
