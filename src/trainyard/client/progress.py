"""Following a job: what :meth:`TrainyardClient.watch` yields and :meth:`~TrainyardClient.wait`
reports, computed the same way for the sync and the async client."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainyard import errors as E

if TYPE_CHECKING:
    from trainyard.api_models import EventDoc, EventList, JobDocument
    from trainyard.enums import JobState


@dataclass(frozen=True)
class JobProgress:
    """One report on a job: its state, the latest step and loss the workers sent, cost so far, and
    the events logged since the previous report (state changes, placements, checkpoints,
    preemptions, resumes)."""

    job: JobDocument
    events: list[EventDoc] = field(default_factory=list)

    @property
    def state(self) -> JobState:
        return self.job.state

    @property
    def step(self) -> int | None:
        return self.job.step

    @property
    def total_steps(self) -> int | None:
        return self.job.total_steps

    @property
    def fraction(self) -> float | None:
        """Steps done over steps to do (0..1), when both are known."""
        if self.step is None or not self.total_steps:
            return None
        return min(max(self.step / self.total_steps, 0.0), 1.0)

    @property
    def loss(self) -> float | None:
        v = self.job.progress.get("loss")
        return float(v) if isinstance(v, int | float) else None

    @property
    def tokens_per_s(self) -> float | None:
        v = self.job.progress.get("tokens_per_s")
        return float(v) if isinstance(v, int | float) else None

    @property
    def cost_usd(self) -> float:
        return self.job.cost_usd

    @property
    def attempt(self) -> int:
        return self.job.attempt

    @property
    def done(self) -> bool:
        return self.job.done


class Watcher:
    """The state of one follow loop: which events were seen, what was last reported, the deadline."""

    def __init__(self, job_id: str, *, timeout_s: float | None, events: bool) -> None:
        self.job_id = job_id
        self.timeout_s = timeout_s
        self.events = events
        self.after = 0
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._last: tuple[object, ...] | None = None

    def report(self, job: JobDocument, page: EventList | None) -> JobProgress | None:
        """A report when anything changed since the last one (always for the first and the last)."""
        new = list(page.events) if page is not None else []
        if page is not None:
            self.after = max(self.after, page.next_after)
        key = (job.state, job.step, job.attempt, job.cost_usd, job.progress.get("loss"))
        if new or key != self._last or job.done:
            self._last = key
            return JobProgress(job, new)
        return None

    def check_deadline(self, job: JobDocument) -> None:
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise E.ServiceUnavailableError(
                f"job {self.job_id} still {job.state} after {self.timeout_s:.0f} s",
                hint="Keep following it with `trainyard jobs events --follow`.",
            )
