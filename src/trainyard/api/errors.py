"""Error rendering: every error leaves the API as ``{"error": {code, message, hint, details}}``."""

from __future__ import annotations

import re
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from trainyard.errors import RateLimitedError, TrainyardError, list_errors

log = structlog.get_logger("trainyard.api")

_HTTP_CODES = {
    400: ("bad_request", "Check the request against /openapi.json."),
    401: ("unauthenticated", "Send Authorization: Bearer <api key>."),
    403: ("forbidden", "This operation needs an admin key."),
    404: ("not_found", "Check the URL; the API lives under /v1 (see /openapi.json)."),
    405: ("method_not_allowed", "See /openapi.json for the methods each route accepts."),
    406: ("not_acceptable", "Ask for application/json."),
    413: ("payload_too_large", "Send a smaller request body."),
    415: ("unsupported_media_type", "Send application/json."),
}


def envelope(
    status: int,
    code: str,
    message: str,
    hint: str,
    details: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={"error": {"code": code, "message": message, "hint": hint, "details": details or {}}},
        headers=headers,
    )


def _field_path(loc: tuple[Any, ...] | list[Any]) -> str:
    parts: list[str] = []
    for i, p in enumerate(loc):
        if i == 0 and p in ("body", "query", "path", "header", "cookie"):
            continue
        if isinstance(p, int):
            parts.append(f"[{p}]")
        elif str(p).startswith(("function-", "literal[", "json-or-python")) or p in ("ParallelismPin",):
            continue
        else:
            parts.append(("." if parts else "") + str(p))
    where = str(loc[0]) if loc else "body"
    path = "".join(parts)
    if where in ("query", "path", "header"):
        return f"{where}.{path}" if path else where
    return path or "(body)"


def validation_errors(exc: RequestValidationError) -> list[dict[str, str]]:
    out = []
    for err in exc.errors():
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        kind = err.get("type", "")
        if kind == "extra_forbidden":
            msg = "unknown key"
        elif kind == "missing":
            msg = "required"
        elif kind == "json_invalid":
            ctx = err.get("ctx") or {}
            loc = tuple(err.get("loc", ()))
            where = f" at character {loc[1]}" if len(loc) > 1 and isinstance(loc[1], int) else ""
            out.append(
                {"field": "(body)", "message": f"malformed JSON{where}: {ctx.get('error', 'cannot parse')}"}
            )
            continue
        out.append({"field": _field_path(tuple(err.get("loc", ()))), "message": msg})
    return out


_OPENAI_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    429: "rate_limit_error",
}


def _openai_style(resp: JSONResponse, status: int) -> JSONResponse:
    """Under /openai the envelope also carries OpenAI's ``type`` and ``param`` keys."""
    import json

    body = json.loads(bytes(resp.body))
    kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    body["error"] = {**body["error"], "type": kind, "param": None}
    headers = {k: v for k, v in resp.headers.items() if k.lower() not in ("content-length", "content-type")}
    return JSONResponse(status_code=status, content=body, headers=headers)


_HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def _resources(app: Any) -> list[tuple[int, re.Pattern[str], list[str]]]:
    """(parameters, pattern, methods) of every path of the app's OpenAPI document, built once."""
    cached = getattr(app.state, "allow_by_path", None)
    if cached is None:
        cached = []
        for template, item in app.openapi().get("paths", {}).items():
            methods = {m.upper() for m in item if m in _HTTP_METHODS}
            if "GET" in methods:
                methods.add("HEAD")  # the framework answers HEAD wherever it answers GET
            pattern = re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$")
            cached.append((template.count("{"), pattern, sorted(methods)))
        app.state.allow_by_path = cached
    return cached


def allowed_methods(app: Any, path: str) -> list[str]:
    """The methods of the resource a URL names, for a 405's ``Allow``. The framework lists only the
    methods of the first route whose pattern matched, and FastAPI makes one route per method, so a
    resource with GET and POST answered ``Allow: POST``. Of the documented paths that match ``path``,
    the most specific one (fewest parameters: ``/v1/webhooks/rotate-secret`` rather than
    ``/v1/webhooks/{webhook_id}``) names the resource; its documented methods are the answer. Empty
    for a URL the OpenAPI document does not describe (the framework's own header then stays)."""
    matching = [(n, methods) for n, pattern, methods in _resources(app) if pattern.match(path)]
    return min(matching)[1] if matching else []


def trainyard_error_response(exc: TrainyardError, path: str) -> JSONResponse:
    """The answer to a :class:`TrainyardError` raised while serving ``path`` (OpenAI's shape under
    /openai): what the app's handler sends, callable by the gateway's hot routes directly."""
    headers = {"WWW-Authenticate": "Bearer"} if exc.http_status == 401 else None
    if isinstance(exc, RateLimitedError):
        headers = dict(exc.headers)
    if exc.http_status >= 500:
        log.error("request_failed", code=exc.code, message=exc.message)
    resp = envelope(exc.http_status, exc.code, exc.message, exc.hint, exc.details, headers)
    if path.startswith("/openai/"):
        return _openai_style(resp, exc.http_status)
    return resp


def unexpected_error_response(exc: BaseException) -> JSONResponse:
    """The 500 envelope for an exception nothing handled (logged with its traceback)."""
    log.exception("unhandled_error", error_type=type(exc).__name__)
    return envelope(
        500,
        "internal",
        "internal server error",
        "This is a bug in trainyard; the server log has the details.",
    )


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(TrainyardError)
    async def _trainyard(req: Request, exc: TrainyardError) -> JSONResponse:
        return trainyard_error_response(exc, req.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        errors = validation_errors(exc) or [{"field": "(body)", "message": "invalid"}]
        return envelope(
            422,
            "invalid_input",
            list_errors(errors),
            "Fix the field named above; /openapi.json describes every request body.",
            {"errors": errors},
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(req: Request, exc: StarletteHTTPException) -> JSONResponse:
        code, hint = _HTTP_CODES.get(exc.status_code, ("http_error", "See /openapi.json."))
        message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            allowed = allowed_methods(req.app, req.url.path)
            if allowed:
                headers["Allow"] = ", ".join(allowed)
        return envelope(exc.status_code, code, message, hint, headers=headers or None)

    @app.exception_handler(Exception)
    async def _unexpected(_req: Request, exc: Exception) -> JSONResponse:
        return unexpected_error_response(exc)
