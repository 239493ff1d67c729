"""/v1/webhooks (where a tenant's alerts are delivered) and /v1/alerts (the alerts that fired)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from trainyard.api.auth import CurrentPrincipal
from trainyard.api.schemas import ErrorEnvelope

router = APIRouter(tags=["alerts"])
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorEnvelope, "description": "Missing or wrong API key"},
    403: {"model": ErrorEnvelope, "description": "A viewer key cannot change anything"},
    404: {"model": ErrorEnvelope, "description": "No such webhook for this tenant"},
    422: {"model": ErrorEnvelope, "description": "Invalid input (`url_not_allowed` for an internal URL)"},
}
WebhookId = Annotated[str, Path(min_length=1, max_length=40, description="Webhook id, e.g. whk-3f2a9c1b7d4e")]


def _alerts(request: Request) -> Any:
    return request.app.state.platform.alerts


class WebhookRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(min_length=1, max_length=2000, examples=["https://hooks.example.com/trainyard"])
    rules: list[str] | None = Field(
        default=None, max_length=20, description="Only these alert rules (default: every rule)"
    )


class WebhookDoc(BaseModel):
    id: str
    url: str
    rules: list[str] | None
    created_at: str | None
    signing_secret: str | None = Field(default=None, description="The tenant's HMAC-SHA256 secret")


@router.post(
    "/v1/webhooks",
    status_code=201,
    response_model=WebhookDoc,
    responses=ERRORS,
    summary="Register a webhook for the tenant's alerts (answers with the signing secret)",
)
async def create_webhook(body: WebhookRequest, request: Request, principal: CurrentPrincipal) -> JSONResponse:
    doc = await run_in_threadpool(_alerts(request).create_webhook, principal, body.url, body.rules)
    return JSONResponse(doc, status_code=201, headers={"Location": f"/v1/webhooks/{doc['id']}"})


@router.get("/v1/webhooks", responses=ERRORS, summary="The tenant's webhooks (without the secret)")
async def list_webhooks(request: Request, principal: CurrentPrincipal) -> JSONResponse:
    return JSONResponse({"webhooks": await run_in_threadpool(_alerts(request).list_webhooks, principal)})


@router.delete("/v1/webhooks/{webhook_id}", status_code=204, responses=ERRORS, summary="Remove a webhook")
async def delete_webhook(webhook_id: WebhookId, request: Request, principal: CurrentPrincipal) -> Response:
    await run_in_threadpool(_alerts(request).delete_webhook, principal, webhook_id)
    return Response(status_code=204)


@router.post(
    "/v1/webhooks/{webhook_id}/test",
    responses=ERRORS,
    summary="Deliver a webhook_test alert to one webhook now",
)
async def test_webhook(webhook_id: WebhookId, request: Request, principal: CurrentPrincipal) -> JSONResponse:
    return JSONResponse(await run_in_threadpool(_alerts(request).test_webhook, principal, webhook_id))


@router.post(
    "/v1/webhooks/rotate-secret",
    responses=ERRORS,
    summary="A new signing secret for the tenant's webhooks (the old one stops working at once)",
)
async def rotate_secret(request: Request, principal: CurrentPrincipal) -> JSONResponse:
    return JSONResponse(await run_in_threadpool(_alerts(request).rotate_secret, principal))


@router.get("/v1/alerts", responses=ERRORS, summary="Alerts that fired for the tenant, oldest first")
async def list_alerts(
    request: Request,
    principal: CurrentPrincipal,
    job_id: Annotated[str | None, Query(max_length=64, description="Only this job's alerts")] = None,
) -> JSONResponse:
    rows = await run_in_threadpool(_alerts(request).list_alerts, principal, job_id=job_id)
    return JSONResponse({"alerts": rows})


@router.get(
    "/v1/webhooks/deliveries",
    responses=ERRORS,
    summary="The tenant's latest webhook deliveries, newest first: state, attempts, last answer",
)
async def list_deliveries(
    request: Request,
    principal: CurrentPrincipal,
    limit: Annotated[int, Query(ge=1, le=200, description="At most this many")] = 50,
) -> JSONResponse:
    rows = await run_in_threadpool(_alerts(request).list_deliveries, principal, limit=limit)
    return JSONResponse({"deliveries": rows})


@router.get(
    "/v1/webhooks/{webhook_id}/deliveries",
    responses=ERRORS,
    summary="One webhook's latest deliveries, newest first",
)
async def list_webhook_deliveries(
    webhook_id: WebhookId,
    request: Request,
    principal: CurrentPrincipal,
    limit: Annotated[int, Query(ge=1, le=200, description="At most this many")] = 50,
) -> JSONResponse:
    rows = await run_in_threadpool(
        _alerts(request).list_deliveries, principal, webhook_id=webhook_id, limit=limit
    )
    return JSONResponse({"deliveries": rows})
