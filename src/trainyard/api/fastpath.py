"""The gateway's completion routes served in front of the framework.

``POST /openai/v1/chat/completions`` and ``POST /openai/v1/completions`` are most of an inference
deployment's traffic and each is a forward to a replica: the framework's layers around them (its error,
body-limit and exception middlewares, the exit stack, the router, the request and dependency objects)
cost more API-server CPU than the gateway's own work (docs/benchmarks.md). :class:`CompletionFastPath`
sits at the head of the app's middleware stack and answers those two (path, method) pairs itself:

* through the *same* user middlewares as every other route (the API middleware: body limit, request
  metrics, access log, rate-limit headers; the tracing middleware: the SERVER span), built a second time
  around its endpoint with the arguments the app registered them with, so the request is measured,
  logged and traced exactly like one that went through the router, under the route template
  (``scope["route"]`` is a :class:`RouteName` of the path, which is what the request metrics and the
  SERVER span read of a route; the documented routes of :mod:`trainyard.api.routers.openai` stay for
  the OpenAPI document and answer the other methods);
* with authentication, the request rate limit and the viewer rule of ``CurrentPrincipal`` done by
  :func:`trainyard.api.auth.authenticate_scope`, and errors rendered by the app's own handlers'
  functions (OpenAI's shape under /openai);
* everything else (other paths, other methods on these paths: a GET answers 405 from the router)
  goes to the framework unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainyard.api.auth import authenticate_scope, bearer_key
from trainyard.api.errors import trainyard_error_response, unexpected_error_response
from trainyard.api.middleware import BodyTooLarge
from trainyard.errors import TrainyardError

ENDPOINTS = {
    "/openai/v1/chat/completions": "chat.completions",
    "/openai/v1/completions": "completions",
}


@dataclass(frozen=True)
class RouteName:
    """What the request metrics and the SERVER span read of the matched route: its path template."""

    path: str


class _Disconnected(Exception):
    """The client went away before its request body arrived."""


async def read_body(receive: Any) -> bytes:
    """The whole request body (the receive callable is the API middleware's, which enforces the limit)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "http.request":
            chunk = message.get("body", b"")
            if chunk:
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        elif kind == "http.disconnect":
            raise _Disconnected
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class CompletionFastPath:
    """ASGI app: the completion routes through the user middlewares straight to the gateway; any other
    request to ``app`` (the framework's full stack)."""

    def __init__(self, app: Any, fastapi_app: Any, platform: Any) -> None:
        self.app = app
        self.platform = platform
        self.routes = {path: RouteName(path) for path in ENDPOINTS}
        chain: Any = self._endpoint
        for cls, args, kwargs in reversed(fastapi_app.user_middleware):
            chain = cls(chain, *args, **kwargs)
        self.chain = chain

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST":
            route = self.routes.get(scope.get("path") or "")
            if route is not None:
                scope["route"] = route
                await self.chain(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _endpoint(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            response = await self._answer(scope, receive)
        except BodyTooLarge:
            raise  # the API middleware answers 413
        except _Disconnected:
            return
        except TrainyardError as exc:
            response = trainyard_error_response(exc, scope["path"])
        except Exception as exc:
            response = unexpected_error_response(exc)
        await response(scope, receive, send)

    async def _answer(self, scope: dict[str, Any], receive: Any) -> Any:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        authorization = headers.get("authorization")
        principal = await authenticate_scope(
            self.platform, scope, bearer_key(authorization), malformed=bool(authorization)
        )
        raw = await read_body(receive)
        return await self.platform.serving_gateway.handle(
            principal.tenant_id,
            ENDPOINTS[scope["path"]],
            raw,
            headers,
            tokens_per_minute=principal.tokens_per_minute,
        )


def install_fast_path(app: Any, platform: Any) -> None:
    """Put :class:`CompletionFastPath` at the head of ``app``'s middleware stack (built on the first
    request, after every middleware is registered)."""
    build = app.build_middleware_stack

    def build_with_fast_path() -> Any:
        return CompletionFastPath(build(), app, platform)

    app.build_middleware_stack = build_with_fast_path
