"""Repository of step metrics (``job_metrics``): batched upserts from the workers' ``metrics`` events,
and curves read back whole, page by page, or downsampled in the database."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Table, and_, func, select
from sqlalchemy.orm import Session, aliased

from trainyard.store.telemetry_models import METRIC_COLUMNS, JobMetricRow

_M = cast(Table, JobMetricRow.__table__)
MAX_EXTRA_METRICS = 16


@dataclass(frozen=True)
class MetricsPage:
    points: list[dict[str, Any]]
    total_points: int  # rows after since_step (before downsampling)
    first_step: int | None
    last_step: int | None
    downsampled: bool
    bucket_steps: int = 1  # steps per point when downsampled
    complete: bool = True  # False: more raw points follow (page on with since_step)
    attempts: list[int] = field(default_factory=list)


_UPSERTS: dict[str, Any] = {}


def _upsert_statement(dialect: str) -> Any:
    """One ``INSERT … ON CONFLICT DO UPDATE`` per dialect, built once and run with many rows (executemany
    batches them; the compiled statement is cached)."""
    stmt = _UPSERTS.get(dialect)
    if stmt is not None:
        return stmt
    ins: Any
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        ins = pg_insert(_M)
    else:
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        ins = sqlite_insert(_M)
    ex = ins.excluded
    stmt = ins.on_conflict_do_update(
        index_elements=[_M.c.job_id, _M.c.step, _M.c.attempt],
        set_={
            "time_s": ex.time_s,
            **{n: func.coalesce(getattr(ex, n), _M.c[n]) for n in METRIC_COLUMNS},
            "extra": func.coalesce(ex.extra, _M.c.extra),
        },
    )
    _UPSERTS[dialect] = stmt
    return stmt


class MetricsRepo:
    def __init__(self, s: Session) -> None:
        self.s = s

    def upsert(
        self, job_id: str, attempt: int, rows: Sequence[tuple[int, float, Mapping[str, float | None]]]
    ) -> int:
        """Store rows ``(step, time_s, {name: value})`` of one attempt; a step stored before keeps the
        values the new row lacks (a training row and a later eval loss of the same step merge)."""
        if not rows:
            return 0
        values = []
        for step, time_s, metrics in rows:
            doc: dict[str, Any] = {"job_id": job_id, "attempt": attempt, "step": step, "time_s": time_s}
            extra: dict[str, float] = {}
            for name, value in metrics.items():
                if name in METRIC_COLUMNS:
                    doc[name] = value
                elif len(extra) < MAX_EXTRA_METRICS and value is not None:
                    extra[name] = value
            for name in METRIC_COLUMNS:
                doc.setdefault(name, None)
            doc["extra"] = extra or None
            values.append(doc)
        self.s.execute(_upsert_statement(self.s.get_bind().dialect.name), values)
        return len(values)

    def _filtered(self, job_id: str, attempt: int | None, since_step: int, attempts: list[int]) -> Any:
        """The rows of one curve: one attempt's, or per step the newest attempt's (a resumed attempt
        replays the steps after its checkpoint; its values are the ones the job kept)."""
        cond = and_(_M.c.job_id == job_id, _M.c.step > since_step)
        if attempt is not None:
            return select(_M).where(cond, _M.c.attempt == attempt)
        if len(attempts) <= 1:
            return select(_M).where(cond)
        newer = aliased(_M)
        replaced = (
            select(newer.c.step)
            .where(newer.c.job_id == _M.c.job_id, newer.c.step == _M.c.step, newer.c.attempt > _M.c.attempt)
            .exists()
        )
        return select(_M).where(cond, ~replaced)

    def min_loss(self, job_id: str, attempt: int) -> float | None:
        """The lowest training loss an attempt logged so far (None before any)."""
        value = self.s.execute(
            select(func.min(_M.c.loss)).where(_M.c.job_id == job_id, _M.c.attempt == attempt)
        ).scalar()
        return None if value is None else float(value)

    def attempts(self, job_id: str) -> list[int]:
        """The attempts with rows: the lowest and highest from the (job, attempt) index, and an index
        probe for each one between (a job has a handful), never a scan of its rows."""
        # one aggregate a statement: SQLite (and PostgreSQL) answer a lone MIN or MAX from the index
        low = self.s.execute(select(func.min(_M.c.attempt)).where(_M.c.job_id == job_id)).scalar()
        high = self.s.execute(select(func.max(_M.c.attempt)).where(_M.c.job_id == job_id)).scalar()
        if low is None or high is None:
            return []
        found = [int(low)]
        for a in range(int(low) + 1, int(high)):
            hit = self.s.execute(
                select(_M.c.step).where(_M.c.job_id == job_id, _M.c.attempt == a).limit(1)
            ).first()
            if hit is not None:
                found.append(a)
        if int(high) != int(low):
            found.append(int(high))
        return found

    def curve(
        self,
        job_id: str,
        *,
        attempt: int | None = None,
        since_step: int = 0,
        max_points: int = 2000,
        downsample: bool = True,
    ) -> MetricsPage:
        attempts = self.attempts(job_id)
        base = self._filtered(job_id, attempt, since_step, attempts).subquery()
        total, first, last = self.s.execute(
            select(func.count(), func.min(base.c.step), func.max(base.c.step)).select_from(base)
        ).one()
        total = int(total or 0)
        if total == 0:
            return MetricsPage([], 0, None, None, False, attempts=attempts)
        if total <= max_points or not downsample:
            rows = self.s.execute(select(base).order_by(base.c.step).limit(max_points)).mappings().all()
            points = [_point(r) for r in rows]
            return MetricsPage(
                points,
                total,
                int(first),
                int(last),
                False,
                complete=total <= max_points,
                attempts=attempts,
            )
        width = max(1, math.ceil((int(last) - int(first) + 1) / max_points))
        bucket = ((base.c.step - int(first)) // width).label("bucket")
        grouped = (
            select(
                func.max(base.c.step).label("step"),
                func.max(base.c.attempt).label("attempt"),
                func.max(base.c.time_s).label("time_s"),
                *[func.avg(base.c[n]).label(n) for n in METRIC_COLUMNS],
                func.min(base.c.loss).label("loss_min"),
                func.max(base.c.loss).label("loss_max"),
                func.count().label("count"),
            )
            .group_by(bucket)
            .order_by(func.max(base.c.step))
        )
        points = []
        for r in self.s.execute(grouped).mappings():
            p = _point(r)
            p["count"] = int(r["count"])
            p["loss_min"], p["loss_max"] = r["loss_min"], r["loss_max"]
            points.append(p)
        return MetricsPage(points, total, int(first), int(last), True, bucket_steps=width, attempts=attempts)


def _point(r: Any) -> dict[str, Any]:
    p: dict[str, Any] = {"step": int(r["step"]), "attempt": int(r["attempt"]), "time_s": float(r["time_s"])}
    for n in METRIC_COLUMNS:
        v = r[n]
        p[n] = None if v is None else float(v)
    extra = r.get("extra") if hasattr(r, "get") else None
    if extra:
        p["extra"] = dict(extra)
    return p
