"""Bearer-key authentication. The key never reaches a log line; only its tenant does."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from opentelemetry import trace
from starlette.concurrency import run_in_threadpool

from trainyard.errors import AuthenticationError, PermissionDeniedError, RateLimitedError
from trainyard.services.domain import Principal

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer ty_...`")


async def current_principal(
    request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> Principal:
    """The caller. A key seen recently is answered from the in-memory cache on the event loop; only a
    cache miss goes to the database (in the thread pool)."""
    return await authenticate_request(request, creds.credentials if creds is not None else None)


def bearer_key(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header, as :data:`bearer` reads it; None otherwise."""
    if not authorization:
        return None
    scheme, _, key = authorization.partition(" ")
    key = key.strip()
    if not scheme or not key or scheme.lower() != "bearer":
        return None
    return key


async def authenticate_request(request: Request, key: str | None) -> Principal:
    """Authentication, the request rate limit and the viewer role's read-only rule for the bearer
    ``key`` of ``request``: what :func:`current_principal` does as a dependency, callable directly by a
    route that does without dependency solving (the OpenAI-compatible gateway's hot routes)."""
    return await authenticate_scope(
        request.app.state.platform,
        request.scope,
        key,
        malformed=bool(request.headers.get("authorization")),
    )


async def authenticate_scope(platform: Any, scope: Any, key: str | None, *, malformed: bool) -> Principal:
    """:func:`authenticate_request` on a raw ASGI ``scope`` (``malformed``: an Authorization header was
    sent but carried no bearer key); the rate limit's headers go to ``scope["trainyard.headers"]``."""
    if key is None:
        if malformed:
            raise AuthenticationError("malformed Authorization header (expected: Bearer <api key>)")
        raise AuthenticationError("missing API key (send Authorization: Bearer <key>)")
    tenants = platform.tenants
    principal = tenants.cached_principal(key)
    if principal is None:
        principal = await run_in_threadpool(tenants.authenticate, key)
    scope.setdefault("state", {})["tenant"] = principal.tenant_name
    trace.get_current_span().set_attribute("trainyard.tenant", principal.tenant_name)
    if principal.tenant_rps_or_key_rps:
        await _rate_limit(scope, platform, principal)
    if principal.effective_role == "viewer" and scope.get("method") not in READ_METHODS:
        raise PermissionDeniedError(
            "this API key has the viewer role: it can read, not change anything",
            hint="Use a member or admin key (`trainyard tenants keys create NAME --role member`).",
        )
    return principal


async def _rate_limit(scope: Any, platform: Any, principal: Principal) -> None:
    limiter = platform.rate_limiter
    args = {
        "tenant_id": principal.tenant_id,
        "key_id": principal.key_id,
        "tenant_rps": principal.rate_limit_rps,
        "tenant_burst": principal.rate_limit_burst,
        "key_rps": principal.key_rate_limit_rps,
        "now": platform.options.clock(),
    }
    decided, decision = limiter.check_local(**args)  # in process, or from this process's leases
    if not decided:
        decision = await run_in_threadpool(lambda: limiter.check(**args))
    if decision is None:
        return
    headers = decision.headers()
    scope.setdefault("trainyard.headers", {}).update(headers)
    if not decision.allowed:
        raise RateLimitedError(
            f"rate limit of {headers['X-RateLimit-Limit']} requests/s for tenant "
            f"{principal.tenant_name!r} reached",
            retry_after_s=decision.retry_after_s,
            headers=headers,
            details={
                "limit_rps": decision.limit,
                "burst": decision.burst,
                "retry_after_s": round(decision.retry_after_s, 3),
            },
        )


async def admin_principal(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    if not principal.admin:
        raise PermissionDeniedError("this operation needs an admin key")
    return principal


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]
AdminPrincipal = Annotated[Principal, Depends(admin_principal)]
