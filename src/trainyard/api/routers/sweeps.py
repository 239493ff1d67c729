"""/v1/sweeps: create (a ``kind: Sweep`` document, quoted as a group), list, get, cancel."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Request
from fastapi.responses import JSONResponse

from trainyard.api.auth import CurrentPrincipal
from trainyard.api.schemas import ErrorEnvelope, SweepDoc, SweepList

router = APIRouter(prefix="/v1/sweeps", tags=["sweeps"])

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorEnvelope, "description": "Missing or wrong API key"},
    404: {"model": ErrorEnvelope, "description": "No such sweep for this tenant"},
    422: {"model": ErrorEnvelope, "description": "Invalid sweep, or a trial no pool can run"},
}
SweepId = Annotated[str, Path(min_length=1, max_length=40, description="The sweep's id (sweep-…)")]


def _platform(request: Request) -> Any:
    return request.app.state.platform


@router.post(
    "",
    status_code=201,
    response_model=SweepDoc,
    responses=ERRORS,
    summary="Create a sweep: quote it as a group and start its trials",
)
def create_sweep(
    request: Request,
    principal: CurrentPrincipal,
    body: Annotated[
        dict[str, Any],
        Body(description="A sweep document (apiVersion trainyard/v1, kind Sweep); docs/sweeps.md"),
    ],
) -> JSONResponse:
    doc = _platform(request).sweeps.create(principal, body)
    return JSONResponse(doc, status_code=201, headers={"Location": f"/v1/sweeps/{doc['id']}"})


@router.get("", response_model=SweepList, responses=ERRORS, summary="List sweeps, newest first")
def list_sweeps(
    request: Request,
    principal: CurrentPrincipal,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> JSONResponse:
    return JSONResponse({"sweeps": _platform(request).sweeps.list(principal, limit=limit)})


@router.get("/{sweep_id}", response_model=SweepDoc, responses=ERRORS, summary="One sweep with its trials")
def get_sweep(sweep_id: SweepId, request: Request, principal: CurrentPrincipal) -> JSONResponse:
    return JSONResponse(_platform(request).sweeps.get(principal, sweep_id))


@router.post(
    "/{sweep_id}/cancel",
    response_model=SweepDoc,
    responses=ERRORS,
    summary="Cancel a sweep: running trials stop, waiting ones never start",
)
def cancel_sweep(sweep_id: SweepId, request: Request, principal: CurrentPrincipal) -> JSONResponse:
    return JSONResponse(_platform(request).sweeps.cancel(principal, sweep_id))
