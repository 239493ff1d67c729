"""/v1/jobs: submit, list, get, cancel, preempt, events, step metrics, logs."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from trainyard.api.auth import CurrentPrincipal
from trainyard.api.schemas import (
    ErrorEnvelope,
    EventList,
    JobDocument,
    JobList,
    LogChunk,
    MetricsDocument,
    SubmitJobRequest,
)
from trainyard.errors import ConflictError, InvalidInputError
from trainyard.services.jobs import job_document
from trainyard.services.lifecycle import JobState

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorEnvelope, "description": "Missing or wrong API key"},
    404: {"model": ErrorEnvelope, "description": "No such job for this tenant"},
    413: {"model": ErrorEnvelope, "description": "Request body too large"},
    422: {"model": ErrorEnvelope, "description": "Invalid input; `details.errors` names each field"},
}
JobId = Annotated[str, Path(min_length=1, max_length=64, description="Job id, e.g. job-3f2a9c1b7d4e")]
MAX_LOG_CHUNK_BYTES = 1_048_576
MAX_LOG_WAIT_S = 30.0
LOG_WAIT_POLL_S = 0.25
TERMINAL_JOB_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


def _platform(request: Request) -> Any:
    return request.app.state.platform


@router.post(
    "",
    status_code=201,
    response_model=JobDocument,
    responses={
        **ERRORS,
        200: {"model": JobDocument, "description": "Replay of an Idempotency-Key"},
        409: {"model": ErrorEnvelope, "description": "Idempotency-Key reused with another spec"},
        429: {"model": ErrorEnvelope, "description": "Tenant quota exceeded"},
    },
    summary="Submit a training job",
)
def submit_job(
    body: SubmitJobRequest,
    request: Request,
    principal: CurrentPrincipal,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=200,
            description="Retry-safe submission: the same key returns the same job.",
        ),
    ] = None,
) -> JSONResponse:
    job, created = _platform(request).jobs.submit(principal, body.spec, idempotency_key)
    return JSONResponse(
        job_document(job, []), status_code=201 if created else 200, headers={"Location": f"/v1/jobs/{job.id}"}
    )


@router.get("", response_model=JobList, responses=ERRORS, summary="List jobs, newest first")
def list_jobs(
    request: Request,
    principal: CurrentPrincipal,
    state: Annotated[list[JobState] | None, Query(description="Only jobs in these states")] = None,
    name: Annotated[str | None, Query(max_length=200)] = None,
    cursor: Annotated[
        str | None, Query(max_length=200, description="next_cursor of the previous page")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> JSONResponse:
    page = _platform(request).jobs.list(
        principal, states=[s.value for s in state] if state else None, name=name, cursor=cursor, limit=limit
    )
    return JSONResponse(
        {"jobs": [job_document(j, include_spec=False) for j in page.jobs], "next_cursor": page.next_cursor}
    )


@router.get("/{job_id}", response_model=JobDocument, responses=ERRORS, summary="One job with its events")
def get_job(job_id: JobId, request: Request, principal: CurrentPrincipal) -> JSONResponse:
    job, events = _platform(request).jobs.get_with_events(principal, job_id)
    return JSONResponse(job_document(job, events))


@router.post(
    "/{job_id}/cancel",
    response_model=JobDocument,
    responses={**ERRORS, 409: {"model": ErrorEnvelope, "description": "The job already finished"}},
    summary="Cancel a job",
)
def cancel_job(job_id: JobId, request: Request, principal: CurrentPrincipal) -> JSONResponse:
    job = _platform(request).jobs.cancel(principal, job_id)
    return JSONResponse(job_document(job, []))


class PreemptRequest(BaseModel):
    notice_s: float | None = Field(
        default=None,
        ge=0,
        le=3600,
        description="Seconds between the notice and the kill (default: the pool's notice_s, else 30).",
        examples=[5.0],
    )


@router.post(
    "/{job_id}/preempt",
    response_model=JobDocument,
    responses={
        **ERRORS,
        409: {"model": ErrorEnvelope, "description": "The job is not starting or running"},
    },
    summary="Inject a preemption (drill): notice, emergency checkpoint, requeue, resume",
)
def preempt_job(
    job_id: JobId, request: Request, principal: CurrentPrincipal, body: PreemptRequest | None = None
) -> JSONResponse:
    platform = _platform(request)
    if not principal.admin:
        platform.jobs.get(principal, job_id)  # 404 for another tenant's job
    supervisor = platform.supervisor
    if supervisor is None:
        raise ConflictError(
            "this server runs no executor, so no job is running to preempt",
            hint="Start the platform with `trainyard up --executor local` (or ray).",
        )
    notice_s = body.notice_s if body is not None else None
    job = supervisor.preempt(job_id, notice_s, by=principal.tenant_name)
    return JSONResponse(job_document(job, []))


@router.get("/{job_id}/events", response_model=EventList, responses=ERRORS, summary="The job's event log")
def job_events(
    job_id: JobId,
    request: Request,
    principal: CurrentPrincipal,
    after: Annotated[int, Query(ge=0, le=2**62, description="Only events with a larger id")] = 0,
    limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
) -> JSONResponse:
    events = _platform(request).jobs.events(principal, job_id, after_id=after, limit=limit)
    return JSONResponse(
        {"events": [e.to_dict() for e in events], "next_after": events[-1].id if events else after}
    )


@router.get(
    "/{job_id}/logs",
    response_model=LogChunk,
    responses=ERRORS,
    summary="A chunk of one rank's log (stdout and stderr), of one attempt or of all",
)
async def job_logs(
    job_id: JobId,
    request: Request,
    principal: CurrentPrincipal,
    rank: Annotated[int, Query(ge=0, le=100_000)] = 0,
    attempt: Annotated[
        int | None, Query(ge=1, le=100_000, description="One attempt's log (default: every attempt's)")
    ] = None,
    offset: Annotated[int, Query(ge=0, le=2**53)] = 0,
    limit_bytes: Annotated[int, Query(ge=1, le=MAX_LOG_CHUNK_BYTES)] = 65536,
    tail: Annotated[
        int | None,
        Query(ge=0, le=10_000, description="The last N lines (within limit_bytes); ignores offset"),
    ] = None,
    wait_s: Annotated[
        float,
        Query(ge=0, le=MAX_LOG_WAIT_S, description="Follow: wait up to this long for bytes past offset"),
    ] = 0.0,
) -> JSONResponse:
    platform = _platform(request)
    job = await run_in_threadpool(platform.jobs.get, principal, job_id)
    if rank >= job.ranks_possible():
        raise InvalidInputError(
            f"rank {rank} does not exist for this job",
            details={"errors": [{"field": "query.rank", "message": "no such rank"}]},
        )
    if attempt is not None and attempt > max(1, job.attempt):
        raise InvalidInputError(
            f"attempt {attempt} does not exist for this job (it has {job.attempt})",
            details={"errors": [{"field": "query.attempt", "message": "no such attempt"}]},
        )
    logs = platform.worker_logs
    deadline = time.monotonic() + wait_s
    while True:  # follow: until bytes past offset arrive, the job ends or wait_s passes
        doc = await run_in_threadpool(
            logs.read,
            job,
            rank=rank,
            attempt=attempt,
            offset=offset,
            limit_bytes=limit_bytes,
            tail_lines=tail,
        )
        if (
            doc["text"]
            or tail is not None
            or job.state in TERMINAL_JOB_STATES
            or time.monotonic() >= deadline
        ):
            break
        await asyncio.sleep(LOG_WAIT_POLL_S)
        job = await run_in_threadpool(platform.jobs.get, principal, job_id)
    doc["attempts"] = await run_in_threadpool(logs.attempts, job, rank)
    doc["job_state"] = job.state.value
    return JSONResponse(doc)


@router.get(
    "/{job_id}/metrics",
    response_model=MetricsDocument,
    responses=ERRORS,
    summary="Step metrics at training resolution (loss, eval loss, step time, tokens/s, learning rate)",
)
def job_metrics(
    job_id: JobId,
    request: Request,
    principal: CurrentPrincipal,
    since_step: Annotated[
        int, Query(ge=0, le=2**31, description="Only steps after this one (incremental polling)")
    ] = 0,
    max_points: Annotated[
        int, Query(ge=1, le=10_000, description="At most this many points: more are downsampled")
    ] = 2000,
    attempt: Annotated[
        int | None, Query(ge=1, le=100_000, description="One attempt's rows (default: the newest per step)")
    ] = None,
    downsample: Annotated[
        bool,
        Query(description="false: raw rows, max_points at a time (page with next_since_step)"),
    ] = True,
) -> JSONResponse:
    doc = _platform(request).training_metrics.curve(
        principal,
        job_id,
        attempt=attempt,
        since_step=since_step,
        max_points=max_points,
        downsample=downsample,
    )
    return JSONResponse(doc)
