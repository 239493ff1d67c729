"""What the service-layer unit tests share: a migrated SQLite template with tenants, a manual clock and
a stand-in for a module's structured logger."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from sqlalchemy import Table, insert

from trainyard.services.domain import Job, Placement
from trainyard.services.jobs import JobService
from trainyard.services.lifecycle import JobState
from trainyard.services.pools import PoolService
from trainyard.store.db import Database
from trainyard.store.models import TenantRow
from trainyard.store.repositories import JobRepo


def sqlite_template(path: Path, tenants: Sequence[tuple[str, str]] = ()) -> Path:
    """A migrated SQLite database at ``path`` holding ``tenants`` (id, name); tests copy it."""
    db = Database(f"sqlite:///{path}")
    db.upgrade()
    if tenants:
        with db.engine.begin() as c:
            c.execute(
                insert(cast(Table, TenantRow.__table__)),
                [{"id": tid, "name": name, "created_at_s": 0.0} for tid, name in tenants],
            )
    db.dispose()
    return path


class Clock:
    """A clock the test moves by hand (``now`` in Unix seconds)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Logged:
    """Stands in for a module's structured logger: the events it was given, with their fields."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def _log(self, level: str, event: str, **fields: Any) -> None:
        self.records.append({"event": event, **fields, "log_level": level})

    def info(self, event: str, **fields: Any) -> None:
        self._log("info", event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log("warning", event, **fields)

    def exception(self, event: str, **fields: Any) -> None:
        self._log("error", event, **fields)

    def take(self) -> list[dict[str, Any]]:
        out, self.records = self.records, []
        return out


def job_services(path: Path | str, now_s: float) -> tuple[Database, Clock, PoolService, JobService]:
    """A database at ``path`` (a copy of a template; a ``str`` is a database URL), a manual clock at
    ``now_s``, and the pool and job services on them (no catalog, no quotes): what the supervisor and
    scheduler tests build on."""
    db = Database(path if isinstance(path, str) else f"sqlite:///{path}")
    clock = Clock(now_s)
    pools = PoolService(db, clock)
    jobs = JobService(
        db, quoter=lambda spec, pools: [], live_pools=pools.pools, clock=clock, with_catalog=False
    )
    return db, clock, pools, jobs


def add_job(
    db: Database, job_id: str, state: JobState, spec: dict[str, Any], now_s: float, **fields: Any
) -> None:
    """Insert a job row in ``state`` (created 100 s before ``now_s``; ``tenant``, ``name``, ``created``,
    ``attempt``, ``reason`` and ``quote`` go on the row, any other field, a ``Placement`` included, is
    set on it after)."""
    job = Job(
        id=job_id,
        seq=0,
        tenant_id=fields.pop("tenant", "t1"),
        name=fields.pop("name", job_id),
        state=state,
        spec=spec,
        created_at_s=fields.pop("created", now_s - 100),
        updated_at_s=now_s - 100,
        attempt=fields.pop("attempt", 0),
        reason=fields.pop("reason", ""),
        quote=fields.pop("quote", None),
    )
    with db.session() as s:
        JobRepo(s).add(job)
        if isinstance(fields.get("placement"), Placement):
            fields["placement"] = fields["placement"].to_dict()
        if fields:
            JobRepo(s).update(job_id, **fields)
