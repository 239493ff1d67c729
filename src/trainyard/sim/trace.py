"""JOBS / TRACE files (DESIGN §3.4): one ``{"submit_s", "tenant", "spec"}`` JSON object per line.

Parsing works on text so that the simulator core stays free of file access; ``trainyard.sim.files``
reads the file. Optional keys ``job_id`` and ``priority`` are accepted (additive to the contract).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from trainyard.errors import InvalidInputError, SpecError
from trainyard.spec.loader import spec_from_dict
from trainyard.spec.models import JobSpec

_KEYS = {"submit_s", "tenant", "spec", "job_id", "priority"}


class TraceError(InvalidInputError):
    code = "invalid_trace"
    default_hint = 'Each line must be a JSON object {"submit_s": seconds, "tenant": name, "spec": {...}}.'


@dataclass(frozen=True)
class TraceJob:
    """One arrival: a job spec submitted by a tenant at ``submit_s`` seconds after the trace start."""

    job_id: str
    submit_s: float
    tenant: str
    spec: JobSpec
    priority: int = 0

    def to_line(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "submit_s": self.submit_s,
            "tenant": self.tenant,
            "spec": self.spec.to_document(),
        }
        doc["job_id"] = self.job_id
        if self.priority:
            doc["priority"] = self.priority
        return doc


def parse_trace_line(doc: Any, index: int, source: str = "trace") -> TraceJob:
    where = f"{source}: line {index + 1}"
    if not isinstance(doc, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    unknown = sorted(set(doc) - _KEYS)
    if unknown:
        raise TraceError(f"{where}: unknown key {unknown[0]!r}")
    for key in ("submit_s", "tenant", "spec"):
        if key not in doc:
            raise TraceError(f"{where}: missing {key!r}")
    submit = doc["submit_s"]
    if (
        isinstance(submit, bool)
        or not isinstance(submit, int | float)
        or not math.isfinite(submit)
        or submit < 0
    ):
        raise TraceError(f"{where}: submit_s must be a non-negative number of seconds, got {submit!r}")
    tenant = doc["tenant"]
    if not isinstance(tenant, str) or not tenant:
        raise TraceError(f"{where}: tenant must be a non-empty string")
    priority = doc.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TraceError(f"{where}: priority must be an integer")
    try:
        spec = spec_from_dict(doc["spec"], f"{where}: spec")
    except SpecError as exc:
        msg = exc.message if exc.message.startswith(where) else f"{where}: spec.{exc.message}"
        raise TraceError(msg, details=exc.details) from None
    job_id = doc.get("job_id")
    if job_id is None:
        job_id = f"{spec.name}-{index:05d}"
    if not isinstance(job_id, str) or not job_id:
        raise TraceError(f"{where}: job_id must be a non-empty string")
    return TraceJob(job_id=job_id, submit_s=float(submit), tenant=tenant, spec=spec, priority=priority)


def parse_trace(text: str, source: str = "trace") -> list[TraceJob]:
    """Parse JSON Lines text into arrivals sorted by (submit_s, line order); blank lines are skipped."""
    jobs: list[TraceJob] = []
    seen: set[str] = set()
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(
                f"{source}: line {i + 1}: malformed JSON at column {exc.colno}: {exc.msg}"
            ) from None
        job = parse_trace_line(doc, i, source)
        if job.job_id in seen:
            raise TraceError(f"{source}: line {i + 1}: job_id {job.job_id!r} appears twice")
        seen.add(job.job_id)
        jobs.append(job)
    if not jobs:
        raise TraceError(f"{source}: no jobs", hint="A trace needs at least one JSON line.")
    return sorted(jobs, key=lambda j: j.submit_s)  # stable: equal times keep file order


def dump_trace(jobs: Iterable[TraceJob]) -> str:
    return "".join(json.dumps(j.to_line(), separators=(",", ":"), sort_keys=False) + "\n" for j in jobs)


def trace_span_s(jobs: Sequence[TraceJob]) -> float:
    return max(j.submit_s for j in jobs) - min(j.submit_s for j in jobs)
