"""Engines, sessions and schema upgrades for SQLite (default) and PostgreSQL.

SQLite runs in WAL mode with a busy timeout, and every transaction starts with ``BEGIN IMMEDIATE`` so
that concurrent writers queue on the lock instead of failing with "database is locked" on upgrade.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, inspect
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

from trainyard.errors import InvalidInputError, ServiceUnavailableError

SQLITE_BUSY_TIMEOUT_MS = 30_000
PING_IF_IDLE_S = 1.0  # PostgreSQL: ping a pooled connection before use when it sat idle this long
HEAD_REVISION = "0015_settings_version"


def make_engine(url: str, *, pool_size: int = 16) -> Engine:
    """An engine for ``url`` (``sqlite:///path`` or ``postgresql+psycopg://...``)."""
    try:
        parsed = make_url(url)
    except Exception as exc:  # sqlalchemy raises ArgumentError with the URL inside; keep it out of logs
        raise InvalidInputError(
            "TRAINYARD_DATABASE_URL is not a database URL",
            hint="Use sqlite:///path/to/trainyard.db or postgresql+psycopg://user@host:5432/db.",
        ) from exc
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
            pool_size=pool_size,
            max_overflow=pool_size,
        )
        _configure_sqlite(engine)
        return engine
    if backend == "postgresql":
        engine = create_engine(url, pool_size=pool_size, max_overflow=pool_size)
        _ping_idle_connections(engine)
        return engine
    raise InvalidInputError(
        f"database backend {backend!r} is not supported",
        hint="Use sqlite:///path/to/trainyard.db or postgresql+psycopg://user@host:5432/db.",
    )


def _ping_idle_connections(engine: Engine) -> None:
    """Pessimistic disconnect handling without a round trip per transaction: a pooled connection that sat
    idle for PING_IF_IDLE_S or longer is pinged on checkout, and a dead one is replaced (SQLAlchemy retries
    the checkout with a fresh connection). A connection checked in a moment ago is handed out as is; if
    the server went away in between, the failing statement makes SQLAlchemy invalidate the whole pool.
    (``pool_pre_ping`` would ping before every transaction: one extra round trip per API request.)"""

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_conn: Any, record: Any) -> None:
        if record is not None:
            record.info["checked_in_at_s"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        last = record.info.get("checked_in_at_s")
        if last is None or time.monotonic() - last < PING_IF_IDLE_S:
            return  # freshly opened, or in use a moment ago
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            raise DisconnectionError("pooled connection is gone") from exc
        if not alive:
            raise DisconnectionError("pooled connection is gone")


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (below)
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes in WAL mode
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # straight on the sqlite3 connection: SQLAlchemy's statement machinery costs several times the
        # statement itself, once per transaction
        conn.connection.driver_connection.execute("BEGIN IMMEDIATE")


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def alembic_config(engine: Engine) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(resources.files("trainyard.store") / "migrations"))
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to ``revision`` (idempotent; runs on every start)."""
    from alembic import command

    cfg = alembic_config(engine)
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
    except Exception as exc:
        from sqlalchemy.exc import OperationalError

        if isinstance(exc, OperationalError):
            raise ServiceUnavailableError(
                f"cannot reach the database ({engine.dialect.name})",
                hint="Check TRAINYARD_DATABASE_URL and that the database server is running.",
            ) from exc
        raise


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def table_names(engine: Engine) -> list[str]:
    return sorted(inspect(engine).get_table_names())


class Database:
    """An engine plus a session factory; ``session()`` is one transaction (commit on success)."""

    def __init__(self, url: str, *, pool_size: int = 16) -> None:
        self.url = url
        self.engine = make_engine(url, pool_size=pool_size)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write_lock: threading.RLock | None = threading.RLock() if is_sqlite(self.engine) else None

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def upgrade(self) -> None:
        upgrade(self.engine)

    @contextmanager
    def session(self) -> Iterator[Session]:
        if self._write_lock is None:
            with self._sessions.begin() as s:
                yield s
            return
        # SQLite allows one writer; threads of this process queue on a lock that wakes the next one at
        # once, instead of polling SQLite's busy handler (whose back-off sleeps make long tail latencies).
        # Other processes are still serialised by BEGIN IMMEDIATE + busy_timeout.
        with self._write_lock, self._sessions.begin() as s:
            yield s

    @contextmanager
    def write_connection(self, *, single_statement: bool = False) -> Iterator[Connection]:
        """A Core connection in one transaction (commit on success), without an ORM session: about 30 us
        cheaper for use cases that only run precompiled statements. On SQLite it queues on the same
        writers' lock as :meth:`session`. On PostgreSQL, ``single_statement=True`` (the use case writes
        with exactly one statement, atomic on its own) runs it in autocommit: no BEGIN/COMMIT round
        trips; the connection goes back to the pool transactional again."""
        if self._write_lock is not None:
            with self._write_lock, self.engine.begin() as conn:
                yield conn
            return
        if not single_statement:
            with self.engine.begin() as conn:
                yield conn
            return
        with self.engine.connect() as conn:
            auto = conn.execution_options(isolation_level="AUTOCOMMIT")
            yield auto
            auto.commit()  # nothing left to send in autocommit; ends the connection's transaction cleanly

    def ping(self) -> bool:
        from sqlalchemy import text

        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
                conn.rollback()
            return True
        except Exception:
            return False

    def dispose(self) -> None:
        self.engine.dispose()
