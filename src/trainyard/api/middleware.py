"""One ASGI middleware: request body size limit (413), Prometheus request metrics, an access log line
without headers (keys never reach logs)."""

from __future__ import annotations

import json
import time
from typing import Any

import structlog
from fastapi import HTTPException
from prometheus_client import CollectorRegistry, Counter, Histogram

log = structlog.get_logger("trainyard.access")

MAX_BODY_BYTES = 1_048_576  # 1 MiB: a job spec is a few kB


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "trainyard_http_requests_total", "HTTP requests", ["method", "route", "status"], registry=registry
        )
        self.latency = Histogram(
            "trainyard_http_request_duration_seconds",
            "HTTP request latency",
            ["method", "route"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=registry,
        )


def _too_large() -> tuple[dict[str, Any], dict[str, Any]]:
    body = json.dumps(
        {
            "error": {
                "code": "payload_too_large",
                "message": f"request body exceeds {MAX_BODY_BYTES} bytes",
                "hint": "Send a smaller request body.",
                "details": {"max_bytes": MAX_BODY_BYTES},
            }
        }
    ).encode()
    start = {
        "type": "http.response.start",
        "status": 413,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ],
    }
    return start, {"type": "http.response.body", "body": body}


class BodyTooLarge(HTTPException):
    """Raised while the body streams in; rendered as the 413 envelope by the error handlers."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(status_code=413, detail=f"request body exceeds {max_bytes} bytes")


class ServiceMiddleware:
    def __init__(
        self,
        app: Any,
        metrics: Metrics,
        max_body_bytes: int = MAX_BODY_BYTES,
        access_log: bool = True,
        upload_paths: dict[str, int] | None = None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.access_log = access_log
        # POST paths whose bodies are streamed uploads, each with its own size limit (the route enforces it)
        self.upload_paths = upload_paths or {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status_holder = {"status": 500, "sent": False}
        if scope.get("method") == "POST" and scope.get("path") in self.upload_paths:
            await self._call(scope, receive, send, status_holder, started)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    too_big = int(value) > self.max_body_bytes
                except ValueError:
                    too_big = False
                if too_big:
                    start, body = _too_large()
                    await send(start)
                    await send(body)
                    self._record(scope, 413, started)
                    return

        received = 0

        async def limited_receive() -> dict[str, Any]:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise BodyTooLarge(self.max_body_bytes)
            return message

        async def tracking_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status_holder["status"] = message["status"]
                status_holder["sent"] = True
                extra = scope.get("trainyard.headers")
                if extra:  # X-RateLimit-* of the request's bucket
                    have = {k.lower() for k, _ in message.get("headers", [])}
                    message = {
                        **message,
                        "headers": [
                            *message.get("headers", []),
                            *(
                                (k.lower().encode(), v.encode())
                                for k, v in extra.items()
                                if k.lower().encode() not in have
                            ),
                        ],
                    }
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not status_holder["sent"]:
                start, body = _too_large()
                await send(start)
                await send(body)
            status_holder["status"] = 413
        self._record(scope, int(status_holder["status"]), started)

    async def _call(
        self, scope: dict[str, Any], receive: Any, send: Any, holder: dict[str, Any], started: float
    ) -> None:
        async def tracking_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                holder["status"] = message["status"]
            await send(message)

        await self.app(scope, receive, tracking_send)
        self._record(scope, int(holder["status"]), started)

    def _record(self, scope: dict[str, Any], status: int, started: float) -> None:
        elapsed = time.perf_counter() - started
        route = scope.get("route")
        template = getattr(route, "path", None) or "(unmatched)"
        method = scope.get("method", "")
        self.metrics.requests.labels(method, template, str(status)).inc()
        self.metrics.latency.labels(method, template).observe(elapsed)
        if self.access_log:
            log.info(
                "request", method=method, path=template, status=status, duration_ms=round(elapsed * 1000, 2)
            )
