"""/v1/models: import (chunked upload of a Hugging Face directory), list, get, lineage, promote, aliases."""

from __future__ import annotations

import re
import secrets
import shutil
from pathlib import Path as FsPath
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from trainyard.api.auth import CurrentPrincipal
from trainyard.api.schemas import ErrorEnvelope, ModelList, ModelVersionDoc
from trainyard.errors import InvalidInputError, NotFoundError
from trainyard.registry.service import tenant_area
from trainyard.services.domain import Principal

router = APIRouter(prefix="/v1/models", tags=["models"])

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorEnvelope, "description": "Missing or wrong API key"},
    404: {"model": ErrorEnvelope, "description": "No such model for this tenant"},
    422: {"model": ErrorEnvelope, "description": "Invalid input; `details.errors` names each field"},
}
ModelRef = Annotated[str, Path(min_length=3, max_length=200, description="NAME@VERSION or NAME@ALIAS")]
FILE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
UPLOAD_RE = re.compile(r"^up-[0-9a-f]{16}$")
MAX_UPLOAD_BYTES = 64 * 1024**3


def _platform(request: Request) -> Any:
    return request.app.state.platform


def _upload_dir(request: Request, principal: Principal, upload_id: str) -> FsPath:
    if not UPLOAD_RE.match(upload_id):
        raise NotFoundError(f"no upload {upload_id!r}")
    root = _platform(request).registry.root
    return tenant_area(root, principal.tenant_name, "models") / ".uploads" / upload_id


class ImportRequest(BaseModel):
    upload_id: str = Field(min_length=1, max_length=40)
    name: str = Field(min_length=1, max_length=100, examples=["tiny-llama"])
    public: bool = Field(default=False, description="Admin only: every tenant may fine-tune from it.")


class PromoteRequest(BaseModel):
    alias: str = Field(min_length=1, max_length=64, examples=["production"])
    force: bool = Field(default=False, description="Admin only, with a reason: skip the evaluation gate.")
    reason: str = Field(default="", max_length=2000)
    evaluation: str | None = Field(default=None, max_length=40, description="Use this evaluation.")


@router.post("/uploads", status_code=201, responses=ERRORS, summary="Start uploading a model directory")
def start_upload(request: Request, principal: CurrentPrincipal) -> JSONResponse:
    upload_id = f"up-{secrets.token_hex(8)}"
    d = _upload_dir(request, principal, upload_id)
    d.mkdir(parents=True, mode=0o700)
    return JSONResponse({"upload_id": upload_id}, status_code=201)


@router.put("/uploads/{upload_id}/files/{filename}", responses=ERRORS, summary="Append a chunk to a file")
async def upload_chunk(
    upload_id: Annotated[str, Path(max_length=40)],
    filename: Annotated[str, Path(max_length=200)],
    request: Request,
    principal: CurrentPrincipal,
    offset: Annotated[int, Query(ge=0, le=MAX_UPLOAD_BYTES)] = 0,
) -> JSONResponse:
    if not FILE_RE.match(filename):
        raise InvalidInputError(
            f"file name {filename!r} is not allowed",
            details={"errors": [{"field": "filename", "message": "plain file names only"}]},
        )
    d = _upload_dir(request, principal, upload_id)
    if not d.is_dir():
        raise NotFoundError(f"no upload {upload_id!r}")
    body = await request.body()

    def write() -> int:
        path = d / filename
        size = path.stat().st_size if path.exists() else 0
        if offset != size:
            raise InvalidInputError(
                f"offset {offset} does not continue {filename} (it has {size} bytes)",
                details={"errors": [{"field": "offset", "message": f"expected {size}"}], "size": size},
            )
        with path.open("ab") as f:
            f.write(body)
        return size + len(body)

    size = await run_in_threadpool(write)
    return JSONResponse({"upload_id": upload_id, "file": filename, "bytes": size})


@router.post(
    "/import",
    status_code=201,
    response_model=ModelVersionDoc,
    responses=ERRORS,
    summary="Import an uploaded HF directory",
)
def import_model(body: ImportRequest, request: Request, principal: CurrentPrincipal) -> JSONResponse:
    d = _upload_dir(request, principal, body.upload_id)
    if not d.is_dir():
        raise NotFoundError(f"no upload {body.upload_id!r}")
    try:
        v = _platform(request).registry.import_directory(principal, d, body.name, public=body.public)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return JSONResponse(v.document(), status_code=201, headers={"Location": f"/v1/models/{v.id}"})


@router.get(
    "",
    response_model=ModelList,
    responses=ERRORS,
    summary="List model versions (yours and the public base models)",
)
def list_models(
    request: Request,
    principal: CurrentPrincipal,
    name: Annotated[str | None, Query(max_length=100)] = None,
    dataset: Annotated[str | None, Query(max_length=500, description="Only versions trained on it")] = None,
) -> JSONResponse:
    reg = _platform(request).registry
    versions = reg.models_for_dataset(principal, dataset) if dataset else reg.list(principal, name=name)
    if name and dataset:
        versions = [v for v in versions if v.name == name]
    return JSONResponse({"models": [v.document() for v in versions]})


@router.get(
    "/{ref}",
    response_model=ModelVersionDoc,
    responses=ERRORS,
    summary="One model version (by version or alias)",
)
def get_model(ref: ModelRef, request: Request, principal: CurrentPrincipal) -> JSONResponse:
    return JSONResponse(_platform(request).registry.get(principal, ref).document())


@router.get("/{ref}/lineage", responses=ERRORS, summary="Where a version came from and what came of it")
def model_lineage(ref: ModelRef, request: Request, principal: CurrentPrincipal) -> JSONResponse:
    platform = _platform(request)
    v = platform.registry.get(principal, ref)
    children = platform.registry.children(principal, v.id)
    evals = platform.evaluations.list(principal, model=v.id)
    return JSONResponse(
        {
            "model": v.id,
            "base": v.base,
            "datasets": v.datasets,
            "source_job": v.source_job,
            "children": [c.id for c in children],
            "evaluations": [
                {"id": e["id"], "baseline": e["baseline"], "verdict": e["verdict"]} for e in evals
            ],
        }
    )


@router.post("/{ref}/promote", responses={**ERRORS, 409: {"model": ErrorEnvelope}}, summary="Move an alias")
def promote_model(
    ref: ModelRef, body: PromoteRequest, request: Request, principal: CurrentPrincipal
) -> JSONResponse:
    doc = _platform(request).registry.promote(
        principal, ref, body.alias, force=body.force, reason=body.reason, evaluation_id=body.evaluation
    )
    return JSONResponse(doc)


@router.get("/{name}/aliases", responses=ERRORS, summary="Current aliases and their append-only history")
def model_aliases(
    name: Annotated[str, Path(min_length=1, max_length=100)], request: Request, principal: CurrentPrincipal
) -> JSONResponse:
    return JSONResponse(_platform(request).registry.aliases(principal, name))
