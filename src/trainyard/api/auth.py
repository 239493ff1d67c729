"""Bearer-key authentication. The key never reaches a log line; only its tenant does."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from trainyard.errors import AuthenticationError, PermissionDeniedError
from trainyard.services.domain import Principal

bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer ty_...`")


async def current_principal(
    request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> Principal:
    """The caller. A key seen recently is answered from the in-memory cache on the event loop; only a
    cache miss goes to the database (in the thread pool)."""
    if creds is None:
        if request.headers.get("authorization"):
            raise AuthenticationError("malformed Authorization header (expected: Bearer <api key>)")
        raise AuthenticationError("missing API key (send Authorization: Bearer <key>)")
    tenants = request.app.state.platform.tenants
    principal = tenants.cached_principal(creds.credentials)
    if principal is None:
        principal = await run_in_threadpool(tenants.authenticate, creds.credentials)
    request.state.tenant = principal.tenant_name
    return principal


async def admin_principal(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    if not principal.admin:
        raise PermissionDeniedError("this operation needs an admin key")
    return principal


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]
AdminPrincipal = Annotated[Principal, Depends(admin_principal)]
