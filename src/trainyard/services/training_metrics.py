"""Step metrics at training resolution: what the workers' ``metrics`` events store, and the curves
``GET /v1/jobs/{id}/metrics`` serves (tenant-scoped; downsampled on read, never on write)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from trainyard.runtime.metrics import unpack
from trainyard.services.domain import Principal
from trainyard.services.jobs import JobService
from trainyard.store.db import Database
from trainyard.store.metrics_repo import MetricsPage, MetricsRepo

DEFAULT_MAX_POINTS = 2000
MAX_POINTS_LIMIT = 10_000


def ingest(s: Session, job_id: str, attempt: int, data: dict[str, Any]) -> int:
    """Store the rows of one ``metrics`` event (in the caller's transaction); how many were stored."""
    return MetricsRepo(s).upsert(job_id, attempt, unpack(data))


def page_document(job_id: str, page: MetricsPage, *, attempt: int | None, since_step: int) -> dict[str, Any]:
    last = page.points[-1]["step"] if page.points else since_step
    return {
        "job_id": job_id,
        "attempt": attempt,
        "attempts": page.attempts,
        "since_step": since_step,
        "points": page.points,
        "total_points": page.total_points,
        "first_step": page.first_step,
        "last_step": page.last_step,
        "downsampled": page.downsampled,
        "bucket_steps": page.bucket_steps,
        "complete": page.complete,
        # poll again with since_step=next_since_step for what was logged after these points
        "next_since_step": page.last_step if page.downsampled and page.last_step is not None else last,
    }


class TrainingMetricsService:
    def __init__(self, db: Database, jobs: JobService) -> None:
        self.db = db
        self.jobs = jobs

    def curve(
        self,
        principal: Principal,
        job_id: str,
        *,
        attempt: int | None = None,
        since_step: int = 0,
        max_points: int = DEFAULT_MAX_POINTS,
        downsample: bool = True,
    ) -> dict[str, Any]:
        job = self.jobs.get(principal, job_id)  # another tenant's job: 404
        with self.db.session() as s:
            page = MetricsRepo(s).curve(
                job.id, attempt=attempt, since_step=since_step, max_points=max_points, downsample=downsample
            )
        return page_document(job.id, page, attempt=attempt, since_step=since_step)
