"""/v1/tenants (admin), a tenant's API keys (admin or the tenant itself) and /v1/whoami."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse

from trainyard.api.auth import AdminPrincipal, CurrentPrincipal
from trainyard.api.schemas import (
    ApiKeyDoc,
    ApiKeyList,
    ErrorEnvelope,
    TenantCreate,
    TenantCreated,
    TenantDoc,
    TenantList,
    WhoAmI,
)
from trainyard.errors import NotFoundError
from trainyard.services.domain import ApiKeyRecord, Principal, Tenant, iso

router = APIRouter(tags=["tenants"])
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorEnvelope},
    403: {"model": ErrorEnvelope},
    404: {"model": ErrorEnvelope},
    409: {"model": ErrorEnvelope},
    422: {"model": ErrorEnvelope},
}


def _doc(t: Tenant) -> dict[str, Any]:
    return {
        "id": t.id,
        "name": t.name,
        "created_at": iso(t.created_at_s),
        "max_queued_jobs": t.max_queued_jobs,
        "max_active_devices": t.max_active_devices,
    }


@router.post(
    "/v1/tenants",
    status_code=201,
    response_model=TenantCreated,
    responses=ERRORS,
    summary="Create a tenant and its first API key (admin); the key is shown once",
)
def create_tenant(body: TenantCreate, request: Request, _p: AdminPrincipal) -> JSONResponse:
    tenant, key = request.app.state.platform.tenants.create(
        body.name,
        admin=body.admin,
        max_queued_jobs=body.max_queued_jobs,
        max_active_devices=body.max_active_devices,
    )
    return JSONResponse({"id": tenant.id, "name": tenant.name, "api_key": key}, status_code=201)


@router.get("/v1/tenants", response_model=TenantList, responses=ERRORS, summary="All tenants (admin)")
def list_tenants(request: Request, _p: AdminPrincipal) -> JSONResponse:
    return JSONResponse({"tenants": [_doc(t) for t in request.app.state.platform.tenants.list()]})


@router.get("/v1/tenants/{name}", response_model=TenantDoc, responses=ERRORS, summary="One tenant (admin)")
def get_tenant(
    name: Annotated[str, Path(min_length=1, max_length=63)], request: Request, _p: AdminPrincipal
) -> JSONResponse:
    return JSONResponse(_doc(request.app.state.platform.tenants.get(name)))


TenantName = Annotated[str, Path(min_length=1, max_length=63, description="Tenant name, e.g. research")]
KeyId = Annotated[str, Path(min_length=1, max_length=40, description="API key id, e.g. key-3f2a9c1b7d4e5a6b")]


def _key_doc(k: ApiKeyRecord) -> dict[str, Any]:
    return {
        "id": k.id,
        "prefix": k.prefix,
        "admin": k.admin,
        "created_at": iso(k.created_at_s),
        "revoked": k.revoked,
    }


def _own_tenant(principal: Principal, name: str) -> None:
    """An admin key may manage any tenant's keys, any other key only its own tenant's; another tenant
    answers 404 like every resource of another tenant."""
    if not principal.admin and principal.tenant_name != name:
        raise NotFoundError(f"no tenant named {name!r}")


@router.get(
    "/v1/tenants/{name}/keys",
    response_model=ApiKeyList,
    responses=ERRORS,
    summary="A tenant's API keys (admin, or a key of that tenant); never the keys themselves",
)
def list_keys(name: TenantName, request: Request, principal: CurrentPrincipal) -> JSONResponse:
    _own_tenant(principal, name)
    keys = request.app.state.platform.tenants.list_keys(name)
    return JSONResponse({"keys": [_key_doc(k) for k in keys]})


@router.post(
    "/v1/tenants/{name}/keys/{key_id}/revoke",
    response_model=ApiKeyDoc,
    responses=ERRORS,
    summary="Revoke an API key (admin, or a key of that tenant); it answers 401 from the next request on",
)
def revoke_key(
    name: TenantName, key_id: KeyId, request: Request, principal: CurrentPrincipal
) -> JSONResponse:
    _own_tenant(principal, name)
    key = request.app.state.platform.tenants.revoke_key(name, key_id, by=principal.tenant_name)
    return JSONResponse(_key_doc(key))


@router.get("/v1/whoami", response_model=WhoAmI, responses=ERRORS, summary="The tenant behind this key")
def whoami(principal: CurrentPrincipal) -> JSONResponse:
    return JSONResponse({"tenant": principal.tenant_name, "admin": principal.admin})
