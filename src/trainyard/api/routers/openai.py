"""The OpenAI-compatible API at /openai/v1 (DESIGN §3.9): ``model`` is a deployment name, the tenant's
API key is the bearer token. The gateway (trainyard.serving.gateway) does the work."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match, Route
from starlette.types import Scope

from trainyard.api.auth import CurrentPrincipal, authenticate_request, bearer_key
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


# ---- the hot routes without the framework's dependency solving ------------------------------------------


async def _lean_chat_completions(request: Request) -> Response:
    key = bearer_key(request.headers.get("authorization"))
    return await chat_completions(request, await authenticate_request(request, key))


async def _lean_completions(request: Request) -> Response:
    key = bearer_key(request.headers.get("authorization"))
    return await completions(request, await authenticate_request(request, key))


class _HotRoute(Route):
    """A Starlette route that, like FastAPI's, names itself as the request's ``route`` (the request
    metrics and the request span are labelled with its path template)."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match is not Match.NONE:
            child["route"] = self
        return match, child


def lean_routes() -> list[BaseRoute]:
    """``POST /openai/v1/chat/completions`` and ``/completions`` as plain Starlette routes, placed first
    in the app's routing table: the same endpoints as the documented routes above (which stay for the
    OpenAPI document), with the authentication, rate limit and role check of ``CurrentPrincipal`` done
    by one direct call instead of FastAPI's dependency solving, and matched before the couple of hundred
    routes of the rest of the API are tried. Errors leave through the same handlers, in OpenAI's shape."""
    return [
        _HotRoute(
            f"{router.prefix}/chat/completions",
            _lean_chat_completions,
            methods=["POST"],
            include_in_schema=False,
        ),
        _HotRoute(
            f"{router.prefix}/completions", _lean_completions, methods=["POST"], include_in_schema=False
        ),
    ]
