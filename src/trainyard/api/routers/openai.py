"""The OpenAI-compatible API at /openai/v1 (DESIGN §3.9): ``model`` is a deployment name, the tenant's
API key is the bearer token. The gateway (trainyard.serving.gateway) does the work."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from trainyard.api.auth import CurrentPrincipal
from trainyard.serving.gateway import GatewayError

router = APIRouter(prefix="/openai/v1", tags=["openai"])
BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"type": "object", "required": ["model"]}}},
    }
}


def _gateway(request: Request) -> Any:
    return request.app.state.platform.serving_gateway


@router.post("/chat/completions", summary="Chat completion (OpenAI-compatible)", openapi_extra=BODY)
async def chat_completions(request: Request, principal: CurrentPrincipal) -> Response:
    raw = await request.body()
    return await _gateway(request).handle(
        principal.tenant_id,
        "chat.completions",
        raw,
        dict(request.headers),
        tokens_per_minute=principal.tokens_per_minute,
    )


@router.post("/completions", summary="Text completion (OpenAI-compatible)", openapi_extra=BODY)
async def completions(request: Request, principal: CurrentPrincipal) -> Response:
    raw = await request.body()
    return await _gateway(request).handle(
        principal.tenant_id,
        "completions",
        raw,
        dict(request.headers),
        tokens_per_minute=principal.tokens_per_minute,
    )


@router.get("/models", summary="The tenant's deployments as models (a LoRA version's base is its parent)")
async def list_models(request: Request, principal: CurrentPrincipal) -> JSONResponse:
    return JSONResponse(_gateway(request).models(principal.tenant_id))


@router.get("/models/{model}", summary="One deployment as a model")
async def get_model(model: str, request: Request, principal: CurrentPrincipal) -> Response:
    try:
        return JSONResponse(_gateway(request).model(principal.tenant_id, model))
    except GatewayError as exc:
        return exc.response()
