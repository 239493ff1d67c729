"""The JOBS file (DESIGN §3.4): JSON Lines of ``{"submit_s": float, "tenant": str, "spec": JobSpec}``.

Pure: parses text the caller has read. A job's id is its spec name; when two lines share a name, every
one of them after the first is called ``<name>#<line number>`` (1-based), so ids stay unique and stable.
An optional ``"priority"`` (integer, default 0) raises or lowers a job's weight.
"""

from __future__ import annotations

import json
import math
from typing import Any

from trainyard.errors import InvalidInputError, SpecError
from trainyard.schedule.types import QueuedJob
from trainyard.spec.loader import spec_from_dict

_KEYS = {"submit_s", "tenant", "spec", "priority"}


class JobsFileError(InvalidInputError):
    code = "invalid_jobs"
    default_hint = 'Each line of a JOBS file is {"submit_s": <seconds>, "tenant": "<name>", "spec": {...}}.'


def _line_job(data: Any, where: str) -> tuple[float, str, dict[str, Any], int]:
    if not isinstance(data, dict):
        raise JobsFileError(f"{where}: expected a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise JobsFileError(
            f"{where}: unknown key {unknown[0]!r} (allowed: submit_s, tenant, spec, priority)"
        )
    for key in ("submit_s", "tenant", "spec"):
        if key not in data:
            raise JobsFileError(f"{where}: missing {key!r}")
    submit = data["submit_s"]
    if isinstance(submit, bool) or not isinstance(submit, int | float) or not math.isfinite(submit):
        raise JobsFileError(f"{where}: submit_s must be a finite number of seconds, got {submit!r}")
    tenant = data["tenant"]
    if not isinstance(tenant, str) or not tenant.strip():
        raise JobsFileError(f"{where}: tenant must be a non-empty string")
    priority = data.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or not -100 <= priority <= 100:
        raise JobsFileError(f"{where}: priority must be an integer in [-100, 100], got {priority!r}")
    return float(submit), tenant, data["spec"], priority


def parse_jobs(text: str, source: str = "jobs") -> list[QueuedJob]:
    """Parse a whole JOBS file; the first bad line raises a one-line error naming its line number."""
    jobs: list[QueuedJob] = []
    seen: set[str] = set()
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        where = f"{source}:{lineno}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise JobsFileError(f"{where}: malformed JSON at column {exc.colno}: {exc.msg}") from None
        submit_s, tenant, spec_doc, priority = _line_job(data, where)
        try:
            spec = spec_from_dict(spec_doc, where)
        except SpecError as exc:
            raise JobsFileError(f"{where}: spec.{exc.message}", details=exc.details) from None
        job_id = spec.name if spec.name not in seen else f"{spec.name}#{lineno}"
        seen.add(job_id)
        jobs.append(
            QueuedJob(job_id=job_id, tenant=tenant.strip(), spec=spec, submit_s=submit_s, priority=priority)
        )
    if not jobs:
        raise JobsFileError(f"{source}: no jobs (the file is empty)")
    return jobs
