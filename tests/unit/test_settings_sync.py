"""The settings version and its watcher (tenancy/settings_sync.py) on a real SQLite file: the counter
moves with the change that commits it, each process drops its caches when it moves, and cached
principals are vouched for only while the watcher keeps reading."""

from __future__ import annotations

import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from service_support import Logged, sqlite_template
from sqlalchemy import text

from trainyard.store.db import Database
from trainyard.tenancy import settings_sync
from trainyard.tenancy.settings_sync import FRESH_S, POLL_S, SettingsWatcher, bump


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sqlite_template(tmp_path_factory.mktemp("settings") / "template.sqlite")


@pytest.fixture
def db(template: Path, tmp_path: Path) -> Iterator[Database]:
    shutil.copy(template, tmp_path / "db.sqlite")
    d = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    yield d
    d.dispose()


def committed_version(db: Database) -> int:
    with db.engine.connect() as c:
        return int(c.execute(text("SELECT version FROM settings_version WHERE id = 1")).scalar_one())


class Changes:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


class FakeMonotonic:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def wait_until(cond: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_the_defaults_poll_five_times_a_second_and_trust_a_read_for_one_second(db: Database) -> None:
    assert (POLL_S, FRESH_S) == (0.2, 1.0)
    w = SettingsWatcher(db, Changes())
    assert (w.poll_s, w.fresh_s) == (0.2, 1.0)
    w = SettingsWatcher(db, Changes(), poll_s=0.05, fresh_s=0.3)
    assert (w.poll_s, w.fresh_s) == (0.05, 0.3)


def test_bump_moves_the_version_by_one_when_its_transaction_commits(db: Database) -> None:
    start = committed_version(db)
    with db.engine.begin() as c:
        bump(c)
    assert committed_version(db) == start + 1
    with db.engine.begin() as c:
        bump(c)
        bump(c)
    assert committed_version(db) == start + 3
    with pytest.raises(RuntimeError), db.engine.begin() as c:
        bump(c)
        raise RuntimeError("the change failed")
    assert committed_version(db) == start + 3  # a rolled-back change announces nothing


def test_read_is_the_committed_version_and_zero_without_the_row(db: Database) -> None:
    w = SettingsWatcher(db, Changes())
    with db.engine.begin() as c:
        c.execute(text("UPDATE settings_version SET version = 41 WHERE id = 1"))
    assert w.read() == 41
    with db.engine.begin() as c:
        bump(c)
    assert w.read() == 42
    with db.engine.begin() as c:
        c.execute(text("DELETE FROM settings_version"))
    assert w.read() == 0


def test_the_read_holds_no_lock_a_writer_would_wait_for(db: Database) -> None:
    w = SettingsWatcher(db, Changes())
    w.read()
    path = db.engine.url.database
    assert path
    other = sqlite3.connect(path, timeout=0, isolation_level=None)  # another process's writer
    try:
        other.execute("BEGIN EXCLUSIVE")  # fails at once if the read left any lock behind
        other.execute("UPDATE settings_version SET version = version + 1 WHERE id = 1")
        other.execute("COMMIT")
    finally:
        other.close()
    assert w.read() == committed_version(db)


def test_the_first_poll_drops_the_caches_and_later_polls_only_when_the_version_moved(db: Database) -> None:
    changes = Changes()
    w = SettingsWatcher(db, changes)
    assert w.version is None and w.changes == 0
    assert w.poll() is False  # nothing was read before: not a move, but what was cached is not vouched for
    assert (changes.calls, w.changes, w.version) == (1, 0, committed_version(db))
    assert w.poll() is False
    assert (changes.calls, w.changes) == (1, 0)
    with db.engine.begin() as c:
        bump(c)
    assert w.poll() is True
    assert (changes.calls, w.changes, w.version) == (2, 1, committed_version(db))
    assert w.poll() is False
    with db.engine.begin() as c:
        bump(c)
    assert w.poll() is True
    with db.engine.begin() as c:
        bump(c)
    assert w.poll() is True
    assert (changes.calls, w.changes) == (4, 3)


def test_a_version_that_moves_back_is_a_move_too(db: Database) -> None:
    changes = Changes()
    w = SettingsWatcher(db, changes)
    with db.engine.begin() as c:
        c.execute(text("UPDATE settings_version SET version = 9 WHERE id = 1"))
    w.poll()
    with db.engine.begin() as c:  # a restored backup, say
        c.execute(text("UPDATE settings_version SET version = 3 WHERE id = 1"))
    assert w.poll() is True
    assert (changes.calls, w.changes, w.version) == (2, 1, 3)


def test_a_poll_is_fresh_for_fresh_s_from_the_start_of_its_read(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeMonotonic(1000.0)
    monkeypatch.setattr(settings_sync.time, "monotonic", clock)
    w = SettingsWatcher(db, Changes(), fresh_s=1.0)
    assert w.fresh() is False  # never read
    real_read = w.read

    def slow_read() -> int:
        clock.now += 0.4  # the read itself takes 0.4 s
        return real_read()

    w.read = slow_read  # type: ignore[method-assign]
    w.poll()
    assert clock.now == 1000.4
    clock.now = 1000.999
    assert w.fresh() is True
    clock.now = 1001.0  # fresh_s after the read began, not after it ended
    assert w.fresh() is False
    w.poll()  # starts at 1001.0
    clock.now = 1001.9
    assert w.fresh() is True
    clock.now = 1002.5
    assert w.fresh() is False


def test_a_failed_drop_of_the_caches_leaves_the_read_unapplied(db: Database) -> None:
    fail = [True]
    calls = [0]

    def on_change() -> None:
        calls[0] += 1
        if fail[0]:
            raise RuntimeError("cache busy")

    w = SettingsWatcher(db, on_change)
    with pytest.raises(RuntimeError):
        w.poll()
    assert w.version is None and w.fresh() is False
    fail[0] = False
    assert w.poll() is False  # the first read again: the caches are dropped this time
    assert calls[0] == 2 and w.version == committed_version(db) and w.fresh() is True
    before = w.version
    with db.engine.begin() as c:
        bump(c)
    fail[0] = True
    with pytest.raises(RuntimeError):
        w.poll()
    assert w.version == before and w.changes == 1  # seen to move, not applied
    fail[0] = False
    assert w.poll() is True
    assert calls[0] == 4 and w.version == committed_version(db)


def test_the_thread_sees_a_change_within_a_poll_and_stops(db: Database) -> None:
    changes = Changes()
    w = SettingsWatcher(db, changes, poll_s=0.01)
    w.start()
    try:
        wait_until(lambda: w.version is not None)
        assert w.fresh() is True and changes.calls == 1
        thread = w._thread
        assert thread is not None and thread.daemon is True  # never keeps the server process alive
        assert thread.name == "trainyard-settings-watcher"
        assert thread in threading.enumerate()
        w.start()  # already running: the same thread
        assert w._thread is thread
        for n in (1, 2, 3):
            with db.engine.begin() as c:
                bump(c)
            wait_until(lambda n=n: w.changes == n)  # type: ignore[misc]
        assert changes.calls == 4
    finally:
        w.stop()
    assert not thread.is_alive()
    assert w._thread is None
    assert w.fresh() is False  # a stopped watcher vouches for nothing
    with db.engine.begin() as c:
        bump(c)
    time.sleep(0.05)
    assert w.changes == 3  # nothing reads any more
    w.start()  # and it starts again
    try:
        wait_until(lambda: w.changes == 4)
        assert w.fresh() is True
    finally:
        w.stop()


def test_an_unreachable_database_stops_the_trust_until_reads_succeed_again(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    logged = Logged()
    monkeypatch.setattr(settings_sync, "log", logged)
    w = SettingsWatcher(db, Changes(), poll_s=0.005, fresh_s=0.2)
    failures = [0]
    down = threading.Event()
    real_read = w.read

    def read() -> int:
        if down.is_set():
            failures[0] += 1
            raise OSError("database away")
        return real_read()

    w.read = read  # type: ignore[method-assign]
    w.start()
    try:
        wait_until(lambda: w.version is not None)
        down.set()
        wait_until(lambda: failures[0] >= 5)  # the thread keeps trying
        wait_until(lambda: not w.fresh())  # and the last good read grows old
        assert w._thread is not None and w._thread.is_alive()
        with db.engine.begin() as c:
            bump(c)
        down.clear()
        wait_until(lambda: w.changes == 1 and w.fresh())
    finally:
        w.stop()
    events = [(r["event"], r["log_level"]) for r in logged.records]
    assert events == [("settings_watch_failed", "warning"), ("settings_watch_resumed", "info")]
    assert logged.records[0]["error"] == "OSError"  # once per outage, not once per failed read


def test_stop_without_start_forgets_the_trust(db: Database) -> None:
    w = SettingsWatcher(db, Changes())
    w.poll()
    assert w.fresh() is True
    w.stop()
    assert w.fresh() is False and w._thread is None


def test_stop_waits_at_most_five_seconds_for_a_read_stuck_in_the_database(db: Database) -> None:
    w = SettingsWatcher(db, Changes(), poll_s=0.01)
    stuck = threading.Event()
    release = threading.Event()
    real_read = w.read

    def read() -> int:
        if w.version is not None:
            stuck.set()
            release.wait(30)
        return real_read()

    w.read = read  # type: ignore[method-assign]
    w.start()
    thread = w._thread
    assert thread is not None
    timer = threading.Timer(8.0, release.set)  # the database answers 8 s later
    try:
        wait_until(lambda: stuck.is_set())
        timer.start()
        started = time.monotonic()
        w.stop()  # server shutdown does not hang on the database
        elapsed = time.monotonic() - started
        assert 4.9 <= elapsed < 5.9, elapsed
        assert w._thread is None and w.fresh() is False
    finally:
        release.set()
        timer.cancel()
        thread.join(10)
    assert not thread.is_alive()
