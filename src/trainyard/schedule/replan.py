"""When to run the next round: events in, "a round is due" out (debounced).

The control plane feeds every event it sees (arrival, completion, preemption, price change, capacity
change) to a :class:`Replanner` and asks :meth:`Replanner.due` on each tick. Bursts are coalesced: a
round runs once events have been quiet for ``debounce_s``, but never later than ``max_delay_s`` after the
first pending event. Preemptions (and arrivals of jobs with a deadline) are urgent: their round is due at
once. Price changes smaller than ``min_price_change`` (relative) are ignored, since they cannot change a
decision that the migration hysteresis would let through. A periodic round every ``period_s`` catches
slow drifts (waiting costs grow with queueing time).

Pure: time is the ``now_s`` each call passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class EventKind(StrEnum):
    ARRIVAL = "arrival"
    COMPLETION = "completion"
    PREEMPTION = "preemption"
    PRICE_CHANGE = "price_change"
    CAPACITY_CHANGE = "capacity_change"


@dataclass(frozen=True)
class SchedulerEvent:
    kind: EventKind
    time_s: float
    job_id: str | None = None
    pool: str | None = None
    old_price_usd_per_hour: float | None = None
    new_price_usd_per_hour: float | None = None
    urgent: bool = False  # e.g. an arrival with a deadline


@dataclass
class Replanner:
    debounce_s: float = 5.0
    max_delay_s: float = 30.0
    period_s: float = 300.0
    min_price_change: float = 0.05
    last_round_s: float | None = None
    first_pending_s: float | None = None
    last_event_s: float | None = None
    urgent_pending: bool = False
    pending: list[SchedulerEvent] = field(default_factory=list)

    def observe(self, event: SchedulerEvent) -> bool:
        """Record an event; returns whether it asks for a round (False when it is ignored)."""
        if event.kind == EventKind.PRICE_CHANGE:
            old, new = event.old_price_usd_per_hour, event.new_price_usd_per_hour
            if (
                old is not None
                and new is not None
                and old > 0
                and abs(new - old) / old < self.min_price_change
            ):
                return False
        self.pending.append(event)
        # events may arrive out of order: the burst starts at the earliest pending one (as planned() has it)
        self.first_pending_s = (
            event.time_s if self.first_pending_s is None else min(self.first_pending_s, event.time_s)
        )
        self.last_event_s = (
            event.time_s if self.last_event_s is None else max(self.last_event_s, event.time_s)
        )
        if event.kind == EventKind.PREEMPTION or event.urgent:
            self.urgent_pending = True
        return True

    def due(self, now_s: float) -> bool:
        """Whether a round should run now."""
        if self.pending:
            if self.urgent_pending:
                return True
            assert self.first_pending_s is not None and self.last_event_s is not None
            if now_s - self.last_event_s >= self.debounce_s:
                return True
            return now_s - self.first_pending_s >= self.max_delay_s
        return self.last_round_s is None or now_s - self.last_round_s >= self.period_s

    def next_due_s(self) -> float:
        """The earliest time at which :meth:`due` turns true with no further events."""
        if self.pending:
            if self.urgent_pending:
                return self.first_pending_s or 0.0
            assert self.first_pending_s is not None and self.last_event_s is not None
            return min(self.last_event_s + self.debounce_s, self.first_pending_s + self.max_delay_s)
        return 0.0 if self.last_round_s is None else self.last_round_s + self.period_s

    def planned(self, now_s: float) -> list[SchedulerEvent]:
        """Mark a round as run at ``now_s``; returns the events it covered."""
        covered = [e for e in self.pending if e.time_s <= now_s]
        self.pending = [e for e in self.pending if e.time_s > now_s]
        self.last_round_s = now_s
        self.first_pending_s = min((e.time_s for e in self.pending), default=None)
        self.last_event_s = max((e.time_s for e in self.pending), default=None)
        self.urgent_pending = any(e.kind == EventKind.PREEMPTION or e.urgent for e in self.pending)
        return covered
