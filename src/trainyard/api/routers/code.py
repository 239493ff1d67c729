"""/v1/code: upload the code an ``entrypoint`` runs in (a gzip tar, stored content-addressed)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from trainyard.api.auth import CurrentPrincipal
from trainyard.api.schemas import CodeUploaded, ErrorEnvelope
from trainyard.services.code import store_archive

router = APIRouter(tags=["code"])
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorEnvelope},
    413: {"model": ErrorEnvelope},
    422: {"model": ErrorEnvelope},
}


@router.post(
    "/v1/code",
    status_code=201,
    response_model=CodeUploaded,
    responses=ERRORS,
    summary="Upload a code archive (gzip tar); name its url as entrypoint.code",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/gzip": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
async def upload_code(request: Request, principal: CurrentPrincipal) -> JSONResponse:
    data = await request.body()
    platform = request.app.state.platform
    archive = await run_in_threadpool(store_archive, platform.storage_policy, principal, data)
    return JSONResponse(archive.to_dict(), status_code=201)
