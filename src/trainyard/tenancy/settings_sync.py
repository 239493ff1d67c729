"""Admin changes of tenant settings reaching every server process within a fraction of a second.

A server process keeps what a request needs of its tenant in memory — the principal of each API key
(role, quotas, rate limits, walls, whether a budget applies) and the tenant's budget definitions — so
that an ordinary request reads nothing from the database. An admin change made through one process
(``trainyard tenants update``, a budget, a key revoked or rotated, new walls) forgets that process's
copies at once; the other processes on the same database learn of it through one counter:

* every such change moves the ``settings_version`` row (:func:`bump`) in the transaction that makes
  the change, so the counter moves exactly when the change commits;
* each server process runs a :class:`SettingsWatcher`, a thread that reads the counter every
  ``poll_s`` (one primary-key read a few times a second, whatever the request rate) and, when it
  moved, drops every cached principal and budget definition (admin changes are rare: the next request
  of each key reads afresh, once);
* the cached principals are trusted only while the watcher's last successful read began less than
  ``fresh_s`` ago (:meth:`SettingsWatcher.fresh`); a watcher that cannot read the database, or falls
  behind, makes requests authenticate from the database instead of from a cache it cannot vouch for.

So a change committed at time *t* is enforced by every process for every request that starts after
``t + fresh_s`` (``poll_s`` plus the read, in practice), and never later, whatever happens to the
watcher. The embedded SQLite default with one process needs none of this (its own changes forget its
caches directly), but several processes on one SQLite file are covered the same way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, cast

import structlog
from sqlalchemy import Connection, Table, update

from trainyard.store.db import Database
from trainyard.store.governance_models import SettingsVersionRow

log = structlog.get_logger("trainyard.settings_sync")

_VERSION = cast(Table, SettingsVersionRow.__table__)
_BUMP = update(_VERSION).where(_VERSION.c.id == 1).values(version=_VERSION.c.version + 1)
_READ_SQL = "SELECT version FROM settings_version WHERE id = 1"

POLL_S = 0.2  # how often each process reads the counter
FRESH_S = 1.0  # a cache is trusted while the last successful read began less than this long ago


def bump(conn: Connection) -> None:
    """Move the settings version, inside the transaction of the change it announces."""
    conn.execute(_BUMP)


class SettingsWatcher:
    """Reads the settings version every ``poll_s`` and calls ``on_change`` when it moved."""

    def __init__(
        self,
        db: Database,
        on_change: Callable[[], None],
        *,
        poll_s: float = POLL_S,
        fresh_s: float = FRESH_S,
    ) -> None:
        self.db = db
        self.on_change = on_change
        self.poll_s = poll_s
        self.fresh_s = fresh_s
        self.version: int | None = None
        self.changes = 0  # how many times the version was seen to move (for tests and metrics)
        self._synced_at = float("-inf")  # monotonic start of the last read whose result was applied
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def fresh(self) -> bool:
        """Whether a change committed more than ``fresh_s`` ago has been applied here."""
        return time.monotonic() - self._synced_at < self.fresh_s

    def read(self) -> int:
        """The committed settings version (a plain read, outside any transaction: on SQLite it takes
        no writer's lock)."""
        raw: Any = self.db.engine.raw_connection()
        try:
            cur = raw.cursor()
            try:
                cur.execute(_READ_SQL)
                row = cur.fetchone()
            finally:
                cur.close()
            raw.rollback()
        finally:
            raw.close()
        return int(row[0]) if row is not None else 0

    def poll(self) -> bool:
        """Read the version once and apply it; True when it moved since the last read."""
        started = time.monotonic()
        version = self.read()
        moved = self.version is not None and version != self.version
        if moved:
            self.changes += 1
        if version != self.version:  # the first read too: what was cached before it is not vouched for
            self.on_change()  # before the read counts as applied (see fresh)
        self.version = version
        self._synced_at = started
        return moved

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="trainyard-settings-watcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                self.poll()
                if failing:
                    log.info("settings_watch_resumed")
                failing = False
            except Exception as exc:  # the database is away: caches stop being trusted (fresh())
                if not failing:
                    log.warning("settings_watch_failed", error=type(exc).__name__)
                failing = True
            self._stop.wait(self.poll_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        self._synced_at = float("-inf")
