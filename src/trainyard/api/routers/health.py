"""/healthz (the process is up), /readyz (database reachable, start-up done), /metrics (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

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


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics(request: Request) -> Response:
    state = request.app.state
    state.refresh_gauges()
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
