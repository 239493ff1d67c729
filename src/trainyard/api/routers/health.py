"""/healthz (the process is up), /readyz (database reachable, start-up done), /metrics (Prometheus)."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from trainyard.errors import AuthenticationError, PermissionDeniedError

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness")
async def healthz() -> JSONResponse:
    return JSONResponse({"status": "ok"})


@router.get(
    "/readyz",
    summary="Readiness: start-up finished and the database answers",
    responses={503: {"description": "Not ready"}},
)
def readyz(request: Request) -> JSONResponse:
    platform = request.app.state.platform
    db_ok = platform.db.ping()
    ready = bool(platform.ready and db_ok)
    return JSONResponse(
        {"status": "ready" if ready else "not_ready", "database": db_ok, "started": bool(platform.ready)},
        status_code=200 if ready else 503,
    )


async def metrics_reader(request: Request) -> None:
    """/metrics names every tenant, its costs and open jobs: it answers an admin key or the
    ``TRAINYARD_METRICS_TOKEN`` bearer token only (401 without credentials, 403 for other keys)."""
    header = request.headers.get("authorization") or ""
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        raise AuthenticationError(
            "/metrics needs an admin key or the metrics token (Authorization: Bearer ...)",
            hint="Configure the scraper with TRAINYARD_METRICS_TOKEN's value as its bearer token.",
        )
    presented = presented.strip()
    platform = request.app.state.platform
    token = platform.settings.metrics_token
    if token and hmac.compare_digest(presented.encode(), token.encode()):
        return
    tenants = platform.tenants
    principal = tenants.cached_principal(presented)
    if principal is None:
        principal = await run_in_threadpool(tenants.authenticate, presented)
    if not principal.admin:
        raise PermissionDeniedError("/metrics needs an admin key or the metrics token")


@router.get(
    "/metrics",
    summary="Prometheus metrics (an admin key or TRAINYARD_METRICS_TOKEN)",
    response_class=Response,
    responses={401: {"description": "No credentials"}, 403: {"description": "Not an admin key"}},
)
async def metrics(request: Request) -> Response:
    await metrics_reader(request)
    state = request.app.state

    def render() -> bytes:
        state.refresh_gauges()
        return generate_latest(state.metrics.registry)

    # collecting reads the store: in a worker thread, so that requests go on being served meanwhile
    return Response(await run_in_threadpool(render), media_type=CONTENT_TYPE_LATEST)
