"""/v1/datasets: streaming upload, list, get, rows (DESIGN §3.7)."""

from __future__ import annotations

import contextlib
import os
import secrets
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from trainyard.api.auth import CurrentPrincipal
from trainyard.api.schemas import DatasetDoc, DatasetEpochCost, DatasetList, DatasetRows, ErrorEnvelope
from trainyard.enums import DatasetFormat
from trainyard.errors import PayloadTooLargeError

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorEnvelope, "description": "Missing or wrong API key"},
    404: {"model": ErrorEnvelope, "description": "No such dataset version for this tenant"},
    422: {"model": ErrorEnvelope, "description": "Invalid input; `details.errors` lists every bad line"},
}
DatasetRef = Annotated[
    str,
    Path(
        min_length=1,
        max_length=120,
        description="NAME@VERSION (or NAME for the newest version), e.g. support-chats@3",
    ),
]


def _service(request: Request) -> Any:
    return request.app.state.platform.datasets


@router.post(
    "",
    status_code=201,
    response_model=DatasetDoc,
    responses={
        **ERRORS,
        200: {"description": "Identical content was uploaded before: the existing version"},
        413: {"model": ErrorEnvelope, "description": "Larger than the upload limit"},
    },
    summary="Upload a JSON Lines file as a new dataset version (the request body is the file)",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
async def upload_dataset(
    request: Request,
    principal: CurrentPrincipal,
    name: Annotated[str, Query(min_length=1, max_length=100, description="Dataset name")],
    format: Annotated[DatasetFormat, Query()] = DatasetFormat.AUTO,
    eval_fraction: Annotated[float, Query(ge=0, lt=1)] = 0.1,
    seed: Annotated[int, Query(ge=0, le=2**62)] = 0,
    base: Annotated[str | None, Query(max_length=200, description="Base model NAME@V (tokenizer)")] = None,
    max_tokens: Annotated[int | None, Query(ge=1, le=2**31, description="Context limit per row")] = None,
    derived_from: Annotated[str | None, Query(max_length=200, description="Parent ds://NAME@V")] = None,
) -> JSONResponse:
    service = _service(request)
    service.spool_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    raw = service.spool_dir / f"upload-{secrets.token_hex(8)}.jsonl"
    limit = service.max_bytes
    received = 0
    try:
        fd = os.open(raw, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            async for chunk in request.stream():
                received += len(chunk)
                if received > limit:
                    raise PayloadTooLargeError(
                        f"the dataset exceeds the upload limit of {limit} bytes",
                        hint="Split the file, or ask an admin to raise TRAINYARD_DATASET_MAX_BYTES.",
                        details={"max_bytes": limit},
                    )
                out.write(chunk)

        def run() -> Any:
            with open(raw, "rb") as fh:
                return service.upload(
                    principal,
                    fh,
                    name=name,
                    format=format.value,
                    eval_fraction=eval_fraction,
                    seed=seed,
                    base=base,
                    max_tokens=max_tokens,
                    derived_from=derived_from,
                )

        version, created = await run_in_threadpool(run)
    finally:
        with contextlib.suppress(OSError):
            raw.unlink()
    return JSONResponse(
        version.to_document(),
        status_code=201 if created else 200,
        headers={"Location": f"/v1/datasets/{version.name}@{version.version}"},
    )


@router.get("", response_model=DatasetList, responses=ERRORS, summary="The tenant's dataset versions")
def list_datasets(
    request: Request,
    principal: CurrentPrincipal,
    name: Annotated[str | None, Query(max_length=100)] = None,
) -> JSONResponse:
    versions = _service(request).list(principal, name=name)
    return JSONResponse({"datasets": [v.to_document() for v in versions]})


@router.get("/{ref}", response_model=DatasetDoc, responses=ERRORS, summary="One dataset version")
def get_dataset(ref: DatasetRef, request: Request, principal: CurrentPrincipal) -> JSONResponse:
    return JSONResponse(_service(request).get(principal, _ds(ref)).to_document())


@router.get(
    "/{ref}/rows",
    response_model=DatasetRows,
    responses=ERRORS,
    summary="A page of one split's normalised rows",
)
def dataset_rows(
    ref: DatasetRef,
    request: Request,
    principal: CurrentPrincipal,
    split: Annotated[str, Query(pattern="^(train|eval)$")] = "train",
    offset: Annotated[int, Query(ge=0, le=2**53)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> JSONResponse:
    page = _service(request).rows(principal, _ds(ref), split=split, offset=offset, limit=limit)
    return JSONResponse(page)


@router.get(
    "/{ref}/cost",
    response_model=DatasetEpochCost,
    responses=ERRORS,
    summary="What one epoch over the train split costs on the cheapest placement",
)
def dataset_epoch_cost(
    ref: DatasetRef,
    request: Request,
    principal: CurrentPrincipal,
    model: Annotated[
        str | None, Query(max_length=200, description="Model NAME@V (default: the --base of the upload)")
    ] = None,
    seq_len: Annotated[int, Query(ge=1, le=1_048_576)] = 2048,
    global_batch: Annotated[int, Query(ge=1, le=1_048_576)] = 16,
) -> JSONResponse:
    from trainyard.datasets.cost import epoch_cost

    doc = epoch_cost(
        request.app.state.platform,
        principal,
        _ds(ref),
        model=model,
        seq_len=seq_len,
        global_batch=global_batch,
    )
    return JSONResponse(doc)


def _ds(ref: str) -> str:
    return ref if ref.startswith("ds://") else f"ds://{ref}"
