"""The supervisor on a real PostgreSQL server (127.0.0.1:5432) where SQLite cannot show it: every change it
makes to a job re-reads the job under a row lock, so a concurrent change (a cancel from the API, another
sweep's charge, a newer attempt) is never overwritten. On SQLite one writer runs at a time, so the race
cannot happen there; here a transaction of the test holds the job's row, and once the supervisor waits on
a lock the test commits its change. SQLite runs the rest of the supervisor (test_supervisor.py)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from service_support import add_job, job_services
from sqlalchemy import text

from controlplane_support import postgres_db
from fakes import FakeExecutor
from trainyard.catalog.pools import Pool
from trainyard.errors import StorageError
from trainyard.executors.base import ExecutorEvent
from trainyard.services.domain import Job, Placement
from trainyard.services.execution import Supervisor
from trainyard.services.lifecycle import JobState
from trainyard.store.repositories import EventRepo, JobRepo

pytestmark = pytest.mark.postgres

NOW = 1_800_000_000.0
S = JobState
SPEC = {"name": "tiny", "requirements": {"allow": ["cpu"]}}
CANCEL = "UPDATE jobs SET state = 'cancelled', reason = 'cancelled by the user' WHERE id = :id"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with postgres_db((("t1", "acme"),)) as db:
        db.dispose()  # each test's services open their own
        yield db.url


class Env:
    def __init__(self, url: str, runs: Path) -> None:
        self.url = url
        self.db, self.clock, self.pools, self.jobs = job_services(url, NOW)
        self.ex = FakeExecutor(clock=NOW)
        self.sup = Supervisor(
            self.db,
            self.jobs,
            self.pools,
            self.ex,
            runs_dir=runs,
            checkpoint_url="file:///ck",
            clock=self.clock,
        )
        self.pool = Pool(
            name="cpu",
            accelerator="cpu",
            devices_per_node=4,
            nodes=1,
            market="on_demand",
            price_usd_per_device_hour=3.6,
            region="local",
        )
        self.pools.put(self.pool)
        self.runs = runs

    def add(self, state: JobState, **fields: Any) -> str:
        job_id = f"j-{uuid.uuid4().hex[:8]}"
        add_job(self.db, job_id, state, SPEC, NOW, **fields)
        return job_id

    def running(self, state: JobState = S.RUNNING) -> str:
        placement = Placement(
            pool="cpu", devices=1, market="on_demand", accelerator="cpu", price_usd_per_device_hour=3.6
        )
        return self.add(
            state, attempt=1, placement=placement, attempt_started_at_s=NOW - 10, run_dir=str(self.runs)
        )

    def job(self, job_id: str) -> Job:
        with self.db.session() as s:
            j = JobRepo(s).get(job_id)
        assert j is not None
        return j

    def kinds(self, job_id: str) -> list[str]:
        with self.db.session() as s:
            return [e.kind for e in EventRepo(s).list(job_id)]


@pytest.fixture
def env(url: str, tmp_path: Path) -> Iterator[Env]:
    e = Env(url, tmp_path / "runs")
    yield e
    e.db.dispose()


class Concurrent:
    """A transaction of the test that holds ``job_id``'s row from ``start()``; once another session waits on
    a lock (or after 20 s) it applies ``sql`` and commits."""

    def __init__(self, env: Env, job_id: str, sql: str) -> None:
        self.env, self.job_id, self.sql = env, job_id, sql
        self.locked, self.done = threading.Event(), threading.Event()
        self.saw_a_waiter = False

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()
        assert self.locked.wait(20)

    def _run(self) -> None:
        with self.env.db.engine.connect() as c, self.env.db.engine.connect() as watch:
            tx = c.begin()
            c.execute(text("SELECT 1 FROM jobs WHERE id = :id FOR UPDATE"), {"id": self.job_id})
            self.locked.set()
            me = c.execute(text("SELECT pg_backend_pid()")).scalar()
            waiting = text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND pid <> :me"
            )
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if watch.execute(waiting, {"me": me}).scalar():
                    self.saw_a_waiter = True
                    break
                watch.rollback()
                time.sleep(0.01)
            c.execute(text(self.sql), {"id": self.job_id})
            tx.commit()
        self.done.set()

    def finish(self) -> None:
        assert self.done.wait(30) and self.saw_a_waiter


def race(env: Env, job_id: str, sql: str, action: Any) -> None:
    other = Concurrent(env, job_id, sql)
    other.start()
    action()
    other.finish()


def test_an_executor_event_never_overwrites_a_cancel_committed_while_it_waited(env: Env) -> None:
    j = env.running()
    ev = ExecutorEvent(job_id=j, attempt=1, kind="succeeded", data={}, time_s=NOW)
    race(env, j, CANCEL, lambda: env.sup.apply_event(ev))
    assert env.job(j).state == S.CANCELLED and "cost" not in env.kinds(j)


def test_a_placement_never_starts_a_job_cancelled_while_it_waited(env: Env) -> None:
    j = env.add(S.QUEUED)
    placement = Placement(
        pool="cpu", devices=1, market="on_demand", accelerator="cpu", price_usd_per_device_hour=3.6
    )
    race(env, j, CANCEL, lambda: env.sup._start(j, placement, env.pool))
    assert env.job(j).state == S.CANCELLED and env.ex.launches == []


def test_the_workers_of_an_attempt_that_moved_on_while_they_were_recorded_are_dropped(env: Env) -> None:
    j = env.add(S.QUEUED)
    placement = Placement(
        pool="cpu", devices=1, market="on_demand", accelerator="cpu", price_usd_per_device_hour=3.6
    )
    real = env.ex.launch
    other = Concurrent(env, j, "UPDATE jobs SET attempt = attempt + 1 WHERE id = :id")

    def launch(req: Any) -> Any:
        workers = real(req)
        other.start()  # from here the row is held; the supervisor's re-read waits for it
        return workers

    env.ex.launch = launch  # type: ignore[method-assign]
    env.sup._start(j, placement, env.pool)
    other.finish()
    assert env.job(j).workers == [] and "workers" not in env.kinds(j)


def test_a_restart_released_never_overwrites_a_cancel_committed_while_it_waited(env: Env) -> None:
    j = env.add(S.PREEMPTED, attempt=1)
    env.sup._restart_not_before[j] = NOW
    race(env, j, CANCEL, env.sup.release_restarts)
    assert env.job(j).state == S.CANCELLED


def test_a_storage_failure_never_overwrites_a_cancel_committed_while_it_waited(env: Env) -> None:
    j = env.running()
    race(env, j, CANCEL, lambda: env.sup._fail_for_storage(j, 1, StorageError("cannot write")))
    assert env.job(j).state == S.CANCELLED and env.kinds(j) == []


def test_a_failed_launch_never_overwrites_a_cancel_committed_while_it_waited(env: Env) -> None:
    j = env.running(S.STARTING)
    race(env, j, CANCEL, lambda: env.sup._end_attempt_with_failure(j, 1, "launch failed: x", "user"))
    assert env.job(j).state == S.CANCELLED and env.kinds(j) == []


def test_reconciling_never_overwrites_a_cancel_committed_while_it_waited(env: Env) -> None:
    j = env.running()
    race(env, j, CANCEL, env.sup.reconcile)
    assert env.job(j).state == S.CANCELLED and "state" not in env.kinds(j)


def test_a_cancelled_attempt_charged_meanwhile_by_another_sweep_is_not_charged_again(env: Env) -> None:
    j = env.running(S.CANCELLED)
    race(env, j, "UPDATE jobs SET attempt_started_at_s = NULL WHERE id = :id", env.sup.sweep_cancelled)
    assert env.job(j).attempt_started_at_s is None and "cost" not in env.kinds(j)
