"""Bearer-key authentication. The key never reaches a log line; only its tenant does."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from trainyard.errors import AuthenticationError, PermissionDeniedError
from trainyard.services.domain import Principal

bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer ty_...`")


def current_principal(
    request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> Principal:
    if creds is None:
        if request.headers.get("authorization"):
            raise AuthenticationError("malformed Authorization header (expected: Bearer <api key>)")
        raise AuthenticationError("missing API key (send Authorization: Bearer <key>)")
    principal = request.app.state.platform.tenants.authenticate(creds.credentials)
    request.state.tenant = principal.tenant_name
    return principal


def admin_principal(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    if not principal.admin:
        raise PermissionDeniedError("this operation needs an admin key")
    return principal


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]
AdminPrincipal = Annotated[Principal, Depends(admin_principal)]
