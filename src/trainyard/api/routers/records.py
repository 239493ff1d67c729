"""/v1/jobs/{id}/record and /v1/jobs/{id}/reproduce: the immutable run record of a job's attempts."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.responses import JSONResponse

from trainyard.api.auth import CurrentPrincipal
from trainyard.api.schemas import ErrorEnvelope
from trainyard.services.jobs import job_document
from trainyard.spec.loader import spec_from_dict

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorEnvelope, "description": "Missing or wrong API key"},
    404: {"model": ErrorEnvelope, "description": "No such job (or no record yet) for this tenant"},
    422: {"model": ErrorEnvelope, "description": "Invalid input"},
}
JobId = Annotated[str, Path(min_length=1, max_length=64, description="Job id, e.g. job-3f2a9c1b7d4e")]


@router.get("/{job_id}/record", responses=ERRORS, summary="The run record of a job attempt")
def job_record(
    job_id: JobId,
    request: Request,
    principal: CurrentPrincipal,
    attempt: Annotated[int | None, Query(ge=1, le=1_000_000, description="Default: the newest")] = None,
) -> JSONResponse:
    platform = request.app.state.platform
    platform.jobs.get(principal, job_id)  # 404 for another tenant's job
    return JSONResponse(platform.records.get(principal, job_id, attempt))


@router.post(
    "/{job_id}/reproduce",
    status_code=201,
    responses={**ERRORS, 200: {"description": "Replay of an Idempotency-Key"}},
    summary="Submit a new job that reruns the recorded one (same data version, spec, seed, devices)",
)
def reproduce_job(
    job_id: JobId,
    request: Request,
    principal: CurrentPrincipal,
    idempotency_key: Annotated[
        str | None, Header(alias="Idempotency-Key", min_length=1, max_length=200)
    ] = None,
) -> JSONResponse:
    platform = request.app.state.platform
    platform.jobs.get(principal, job_id)
    spec = spec_from_dict(platform.records.reproduction_spec(principal, job_id))
    job, created = platform.jobs.submit(principal, spec, idempotency_key)
    return JSONResponse(
        job_document(job, []), status_code=201 if created else 200, headers={"Location": f"/v1/jobs/{job.id}"}
    )
