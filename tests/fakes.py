"""A scripted executor implementing the Executor protocol (interface B), for control-plane tests.

It runs nothing: tests decide which events the "workers" report and whether adoption succeeds.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

from trainyard.executors.base import ExecutorEvent, LaunchRequest, WorkerInfo


@dataclass
class FakeExecutor:
    name: str = "fake"
    launches: list[LaunchRequest] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    preempted: list[tuple[str, float]] = field(default_factory=list)
    adopt_result: bool = False
    adopted: list[tuple[str, int, str]] = field(default_factory=list)
    fail_launch: bool = False
    shut_down: bool = False
    clock: float = 1_000.0
    unserved: set[str] = field(default_factory=set)
    _pending: list[ExecutorEvent] = field(default_factory=list)
    _live: dict[str, list[WorkerInfo]] = field(default_factory=dict)
    _pids: itertools.count = field(default_factory=lambda: itertools.count(40_000))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def serves(self, pool: object) -> bool:
        """The scripted executor plays any backend, except for pools named in ``unserved`` and pools
        marked planning-only (``backend: none``)."""
        return getattr(pool, "name", None) not in self.unserved

    def launch(self, req: LaunchRequest) -> list[WorkerInfo]:
        if self.fail_launch:
            raise RuntimeError("no capacity in the fake cloud")
        self.launches.append(req)
        workers = [WorkerInfo(rank=r, pid=next(self._pids), host="fakehost") for r in range(req.world_size)]
        self._live[req.job_id] = workers
        return workers

    def emit(
        self,
        job_id: str,
        kind: str,
        data: dict | None = None,
        *,
        attempt: int | None = None,
        time_s: float | None = None,
    ) -> None:
        if attempt is None:
            attempt = max(r.attempt for r in self.launches if r.job_id == job_id)
        with self._lock:
            self._pending.append(
                ExecutorEvent(
                    job_id=job_id,
                    attempt=attempt,
                    kind=kind,
                    data=dict(data or {}),
                    time_s=self.clock if time_s is None else time_s,
                )
            )
        if kind in ("succeeded", "failed", "preempted", "lost"):
            self._live.pop(job_id, None)

    def poll(self) -> list[ExecutorEvent]:
        with self._lock:
            out, self._pending = self._pending, []
        return out

    def preempt(self, job_id: str, notice_s: float) -> None:
        self.preempted.append((job_id, notice_s))

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)
        self._live.pop(job_id, None)

    def workers(self, job_id: str) -> list[WorkerInfo]:
        return list(self._live.get(job_id, []))

    def adopt(self, job_id: str, attempt: int, run_dir: str, workers: list[WorkerInfo]) -> bool:
        self.adopted.append((job_id, attempt, run_dir))
        if self.adopt_result:
            self._live[job_id] = list(workers)
        return self.adopt_result

    def shutdown(self) -> None:
        self.shut_down = True


class ManualClock:
    """A wall clock (epoch seconds) that only moves when a test sets or advances ``now``."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
