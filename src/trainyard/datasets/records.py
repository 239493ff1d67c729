"""Run records: one immutable document per job attempt (written once from the worker's ``record`` event,
completed with what the server knows), readable by the job's tenant, and the spec to reproduce a run."""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard.errors import NotFoundError
from trainyard.services.domain import Job, Principal, iso
from trainyard.store.datasets_models import RunRecordRow
from trainyard.store.db import Database


def record_sha256(record: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class RunRecords:
    def __init__(self, db: Database, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.clock = clock

    def store(self, s: Session, job: Job, attempt: int, data: dict[str, Any], time_s: float) -> bool:
        """Insert the record of (job, attempt) unless one exists (records are never changed)."""
        exists = s.scalar(
            select(RunRecordRow.id).where(RunRecordRow.job_id == job.id, RunRecordRow.attempt == attempt)
        )
        if exists is not None:
            return False
        record = {
            **data,
            "job_id": job.id,
            "attempt": attempt,
            "submitted_spec_sha256": job.spec_sha256,
            "placement": job.placement.to_dict() if job.placement else None,
            "recorded_at": iso(time_s),
        }
        # the caller holds the job's row lock (apply_event), so the check above cannot race
        s.add(
            RunRecordRow(
                tenant_id=job.tenant_id,
                job_id=job.id,
                attempt=attempt,
                sha256=record_sha256(record),
                record=record,
                created_at_s=time_s,
            )
        )
        return True

    def get(self, principal: Principal, job_id: str, attempt: int | None = None) -> dict[str, Any]:
        """``{job_id, attempt, sha256, record, attempts}`` of the newest attempt, or of ``attempt``."""
        with self.db.session() as s:
            rows = list(
                s.scalars(
                    select(RunRecordRow)
                    .where(RunRecordRow.job_id == job_id, RunRecordRow.tenant_id == principal.tenant_id)
                    .order_by(RunRecordRow.attempt)
                )
            )
        rows_for = [r for r in rows if r.attempt == attempt] if attempt is not None else rows[-1:]
        if not rows_for:
            raise NotFoundError(
                f"no run record for job {job_id!r}" + (f" attempt {attempt}" if attempt is not None else ""),
                hint="A record is written when an attempt starts training; see `trainyard jobs get`.",
            )
        row = rows_for[0]
        return {
            "job_id": row.job_id,
            "attempt": row.attempt,
            "sha256": row.sha256,
            "created_at": iso(row.created_at_s),
            "attempts": [r.attempt for r in rows],
            "record": row.record,
        }

    def reproduction_spec(self, principal: Principal, job_id: str) -> dict[str, Any]:
        """The spec of a new job that reruns the recorded one: the same resolved spec (pinned dataset
        version, seed) on the same number of devices of the same accelerator."""
        doc = self.get(principal, job_id)
        rec = doc["record"]
        spec = copy.deepcopy(rec["spec"])
        spec["name"] = f"{spec.get('name', 'job')}-repro"[:200]
        world = int(rec.get("world_size") or 1)
        resources = dict(spec.get("resources") or {})
        resources["min_devices"] = world
        resources["max_devices"] = world
        spec["resources"] = resources
        accel = (rec.get("placement") or {}).get("accelerator")
        if accel:
            spec["requirements"] = {**(spec.get("requirements") or {}), "allow": [accel]}
        tags = dict(spec.get("tags") or {})
        tags["reproduces"] = job_id
        spec["tags"] = tags
        return spec
