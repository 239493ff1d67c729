"""/v1/pools: live capacity, prices and interruption rates (admins change them at run time)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse, Response

from trainyard.api.auth import AdminPrincipal, CurrentPrincipal
from trainyard.api.schemas import ErrorEnvelope, PoolDoc, PoolList, PoolPatch
from trainyard.catalog.pools import Pool
from trainyard.errors import InvalidInputError
from trainyard.services.domain import PoolRecord, iso
from trainyard.services.pools import executor_serves, pool_backend, pool_from_record
from trainyard.store.repositories import JobRepo

router = APIRouter(prefix="/v1/pools", tags=["pools"])
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorEnvelope},
    403: {"model": ErrorEnvelope},
    404: {"model": ErrorEnvelope},
    422: {"model": ErrorEnvelope},
}
PoolName = Annotated[str, Path(min_length=1, max_length=200)]


def _in_use(platform: Any) -> dict[str, int]:
    with platform.db.session() as s:
        return JobRepo(s).devices_in_use(by="pool")


def _doc(rec: PoolRecord, used: dict[str, int], executor: Any = None) -> dict[str, Any]:
    pool = pool_from_record(rec)
    return {
        **rec.doc,
        "backend": pool_backend(pool, executor),
        "executable": executor_serves(executor, pool),
        "source": rec.source,
        "devices_in_use": used.get(rec.name, 0),
        "updated_at": iso(rec.updated_at_s),
    }


@router.get("", response_model=PoolList, responses=ERRORS, summary="Live pools")
def list_pools(request: Request, _p: CurrentPrincipal) -> JSONResponse:
    platform = request.app.state.platform
    used = _in_use(platform)
    ex = platform.options.executor
    return JSONResponse({"pools": [_doc(r, used, ex) for r in platform.pools.list()]})


@router.get("/{name}", response_model=PoolDoc, responses=ERRORS, summary="One live pool")
def get_pool(name: PoolName, request: Request, _p: CurrentPrincipal) -> JSONResponse:
    platform = request.app.state.platform
    return JSONResponse(_doc(platform.pools.get(name), _in_use(platform), platform.options.executor))


@router.put("/{name}", response_model=PoolDoc, responses=ERRORS, summary="Create or replace a pool (admin)")
def put_pool(name: PoolName, body: Pool, request: Request, _p: AdminPrincipal) -> JSONResponse:
    if body.name != name:
        raise InvalidInputError(
            f"the body names pool {body.name!r} but the URL names {name!r}",
            details={"errors": [{"field": "name", "message": "must equal the name in the URL"}]},
        )
    platform = request.app.state.platform
    return JSONResponse(_doc(platform.pools.put(body), _in_use(platform), platform.options.executor))


@router.patch(
    "/{name}", response_model=PoolDoc, responses=ERRORS, summary="Change a pool at run time (admin)"
)
def patch_pool(name: PoolName, body: PoolPatch, request: Request, _p: AdminPrincipal) -> JSONResponse:
    platform = request.app.state.platform
    changes = body.model_dump(exclude_unset=True)
    return JSONResponse(
        _doc(platform.pools.update(name, changes), _in_use(platform), platform.options.executor)
    )


@router.delete("/{name}", status_code=204, responses=ERRORS, summary="Remove a pool (admin)")
def delete_pool(name: PoolName, request: Request, _p: AdminPrincipal) -> Response:
    request.app.state.platform.pools.delete(name)
    return Response(status_code=204)
