"""/v1/tenants (admin), a tenant's API keys (admin or the tenant itself) and /v1/whoami."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

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
from trainyard.errors import NotFoundError, PermissionDeniedError
from trainyard.services.domain import ApiKeyRecord, Principal, Tenant, iso

router = APIRouter(tags=["tenants"])
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorEnvelope},
    403: {"model": ErrorEnvelope},
    404: {"model": ErrorEnvelope},
    409: {"model": ErrorEnvelope},
    422: {"model": ErrorEnvelope},
}


def _doc(t: Tenant, request: Request | None = None) -> dict[str, Any]:
    policy = request.app.state.platform.storage_policy if request is not None else None
    return {
        "id": t.id,
        "name": t.name,
        "created_at": iso(t.created_at_s),
        "max_queued_jobs": t.max_queued_jobs,
        "max_active_devices": t.max_active_devices,
        "storage_roots": list(t.storage_roots),
        "allow_user_code": t.allow_user_code,
        "storage_url": policy.tenant_root(t.name) if policy is not None else None,
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
    return JSONResponse({"tenants": [_doc(t, request) for t in request.app.state.platform.tenants.list()]})


@router.get("/v1/tenants/{name}", response_model=TenantDoc, responses=ERRORS, summary="One tenant (admin)")
def get_tenant(
    name: Annotated[str, Path(min_length=1, max_length=63)], request: Request, _p: AdminPrincipal
) -> JSONResponse:
    return JSONResponse(_tenant_doc(request.app.state.platform, name, request))


TenantName = Annotated[str, Path(min_length=1, max_length=63, description="Tenant name, e.g. research")]
KeyId = Annotated[str, Path(min_length=1, max_length=40, description="API key id, e.g. key-3f2a9c1b7d4e5a6b")]


def _key_doc(k: ApiKeyRecord) -> dict[str, Any]:
    return {
        "id": k.id,
        "prefix": k.prefix,
        "admin": k.admin,
        "role": k.role or ("admin" if k.admin else "member"),
        "created_at": iso(k.created_at_s),
        "expires_at": iso(k.expires_at_s),
        "revoked": k.revoked,
    }


class TenantUpdate(BaseModel):
    """Fields to change; a field sent as null removes that limit, a field left out is unchanged."""

    model_config = ConfigDict(extra="forbid")
    max_queued_jobs: int | None = Field(default=None, ge=1, le=10_000_000)
    max_active_devices: int | None = Field(default=None, ge=1, le=10_000_000)
    max_concurrent_jobs: int | None = Field(default=None, ge=1, le=10_000_000)
    rate_limit_rps: float | None = Field(default=None, gt=0, le=1e6, description="Requests/s, all keys")
    rate_limit_burst: float | None = Field(default=None, ge=1, le=1e7, description="Bucket size (requests)")
    key_rate_limit_rps: float | None = Field(default=None, gt=0, le=1e6, description="Requests/s per key")
    tokens_per_minute: int | None = Field(default=None, ge=1, le=10**12, description="Inference tokens/min")
    max_usd_per_month: float | None = Field(
        default=None, ge=0, le=1e12, description="A hard monthly dollar budget (same as `budgets set --hard`)"
    )
    # the tenant's walls (DESIGN §3.6)
    storage_roots: list[Annotated[str, Field(min_length=1, max_length=1000)]] | None = Field(
        default=None,
        max_length=64,
        description="Storage roots granted besides the namespace (replaces the list; [] or null: none)",
    )
    allow_user_code: bool | None = Field(
        default=None, description="Whether the tenant may submit `entrypoint` jobs (run in the sandbox)"
    )


def _tenant_doc(platform: Any, name: str, request: Request | None = None) -> dict[str, Any]:
    doc = _doc(platform.tenants.get(name), request)
    limits = platform.tenants.limits(name)
    doc.update(
        max_concurrent_jobs=limits.max_concurrent_jobs,
        rate_limit_rps=limits.rate_limit_rps,
        rate_limit_burst=limits.rate_limit_burst,
        key_rate_limit_rps=limits.key_rate_limit_rps,
        tokens_per_minute=limits.tokens_per_minute,
    )
    return doc


@router.patch(
    "/v1/tenants/{name}",
    response_model=TenantDoc,
    responses=ERRORS,
    summary="Change a tenant's quotas, rate limits, dollar cap, storage roots and user code (admin)",
)
def update_tenant(
    name: Annotated[str, Path(min_length=1, max_length=63)],
    body: TenantUpdate,
    request: Request,
    _p: AdminPrincipal,
) -> JSONResponse:
    platform = request.app.state.platform
    changes = {k: getattr(body, k) for k in body.model_fields_set}
    usd = changes.pop("max_usd_per_month", None)
    walls = {k: changes.pop(k) for k in ("storage_roots", "allow_user_code") if k in changes}
    if walls:
        roots = walls.get("storage_roots")
        platform.tenants.update_walls(
            name,
            storage_roots=([] if roots is None else roots) if "storage_roots" in walls else None,
            allow_user_code=walls.get("allow_user_code"),
            by=_p.tenant_name,
        )
    if changes:
        platform.tenants.update(name, changes)
    else:
        platform.tenants.get(name)  # 404 for an unknown tenant
    if "max_usd_per_month" in body.model_fields_set and usd is not None:
        platform.governance.set_budget(name, usd=usd, period="month", hard=True)
    return JSONResponse(_tenant_doc(platform, name, request))


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


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: str = Field(default="member", pattern="^(admin|member|viewer)$")


class KeyRotate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    overlap_s: float = Field(
        default=3600.0, ge=0, le=30 * 86400, description="How long the old key keeps working"
    )


def _may_grant(principal: Principal, role: str) -> None:
    if role == "admin" and not principal.admin:
        raise PermissionDeniedError("only an admin key can create or rotate an admin key")


@router.post(
    "/v1/tenants/{name}/keys",
    status_code=201,
    responses=ERRORS,
    summary="Create an API key with a role (admin, or a member key of that tenant); shown once",
)
def create_key(
    name: TenantName, body: KeyCreate, request: Request, principal: CurrentPrincipal
) -> JSONResponse:
    _own_tenant(principal, name)
    _may_grant(principal, body.role)
    rec, plaintext = request.app.state.platform.tenants.create_key_record(name, role=body.role)
    return JSONResponse({**_key_doc(rec), "api_key": plaintext}, status_code=201)


@router.post(
    "/v1/tenants/{name}/keys/{key_id}/rotate",
    status_code=201,
    responses=ERRORS,
    summary="Replace a key: a new key with the same role; the old one works for overlap_s more seconds",
)
def rotate_key(
    name: TenantName,
    key_id: KeyId,
    request: Request,
    principal: CurrentPrincipal,
    body: KeyRotate | None = None,
) -> JSONResponse:
    _own_tenant(principal, name)
    tenants = request.app.state.platform.tenants
    current = next((k for k in tenants.list_keys(name) if k.id == key_id), None)
    if current is not None:
        _may_grant(principal, current.role or ("admin" if current.admin else "member"))
    overlap = body.overlap_s if body is not None else KeyRotate().overlap_s
    new, plaintext, old = tenants.rotate_key(name, key_id, overlap_s=overlap)
    return JSONResponse(
        {"new": {**_key_doc(new), "api_key": plaintext}, "old": _key_doc(old)}, status_code=201
    )


@router.get("/v1/whoami", response_model=WhoAmI, responses=ERRORS, summary="The tenant behind this key")
def whoami(request: Request, principal: CurrentPrincipal) -> JSONResponse:
    policy = request.app.state.platform.storage_policy
    return JSONResponse(
        {
            "tenant": principal.tenant_name,
            "admin": principal.admin,
            "role": principal.effective_role,
            "storage_url": policy.tenant_root(principal.tenant_name),
            "storage_roots": list(principal.storage_roots),
            "allow_user_code": principal.allow_user_code,
        }
    )
