"""What the service-layer unit tests share: a migrated SQLite template with tenants, a manual clock and
a stand-in for a module's structured logger."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from sqlalchemy import Table, insert

from trainyard.store.db import Database
from trainyard.store.models import TenantRow


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
