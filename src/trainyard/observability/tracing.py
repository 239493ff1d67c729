"""OpenTelemetry tracing: spans around API requests, scheduling rounds and gang launches.

Spans go to an in-process ring buffer by default (the latest ``trace_buffer_spans`` finished spans, read
with :meth:`RingBufferExporter.spans`); ``TRAINYARD_TRACE_EXPORTER=console`` prints them and ``otlp``
ships them to ``TRAINYARD_TRACE_OTLP_ENDPOINT`` (needs ``opentelemetry-exporter-otlp-proto-http``);
``none`` turns tracing off. Span attributes never carry request headers or API keys.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any, Literal

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from pydantic_settings import BaseSettings, SettingsConfigDict

from trainyard import __version__
from trainyard.errors import ServiceUnavailableError
from trainyard.observability.metrics import ControlLoopMetrics


class ObservabilitySettings(BaseSettings):
    """``TRAINYARD_TRACE_*`` settings (read once when the app is built)."""

    model_config = SettingsConfigDict(env_prefix="TRAINYARD_", extra="ignore")

    trace_exporter: Literal["memory", "console", "otlp", "none"] = "memory"
    trace_otlp_endpoint: str = "http://127.0.0.1:4318/v1/traces"
    trace_buffer_spans: int = 2048


class RingBufferExporter(SpanExporter):
    """Keeps the latest finished spans in memory."""

    def __init__(self, max_spans: int = 2048) -> None:
        self._spans: deque[ReadableSpan] = deque(maxlen=max(1, max_spans))
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            self._spans.extend(spans)
        return SpanExportResult.SUCCESS

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        with self._lock:
            out = list(self._spans)
        return [s for s in out if name is None or s.name == name]

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def make_tracer_provider(
    settings: ObservabilitySettings | None = None,
) -> tuple[TracerProvider | None, RingBufferExporter | None]:
    """A tracer provider of its own (not the process-global one) and, for ``memory``, its buffer."""
    cfg = settings or ObservabilitySettings()
    if cfg.trace_exporter == "none":
        return None, None
    provider = TracerProvider(
        resource=Resource.create({"service.name": "trainyard", "service.version": __version__})
    )
    buffer = None
    if cfg.trace_exporter == "memory":
        buffer = RingBufferExporter(cfg.trace_buffer_spans)
        provider.add_span_processor(SimpleSpanProcessor(buffer))
    elif cfg.trace_exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter,
            )
        except ImportError as exc:
            raise ServiceUnavailableError(
                "TRAINYARD_TRACE_EXPORTER=otlp needs the OTLP exporter package",
                hint="pip install opentelemetry-exporter-otlp-proto-http, or use memory/console/none.",
            ) from exc
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=cfg.trace_otlp_endpoint)))
    return provider, buffer


class TracingMiddleware:
    """ASGI middleware: one SERVER span per HTTP request, named ``METHOD /route/{template}``."""

    def __init__(self, app: Any, tracer: Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = {"code": 500}

        async def tracking_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
            await send(message)

        method = scope.get("method", "")
        with self.tracer.start_as_current_span(f"{method} request", kind=SpanKind.SERVER) as span:
            span.set_attribute("http.request.method", method)
            try:
                await self.app(scope, receive, tracking_send)
            finally:
                route = getattr(scope.get("route"), "path", None) or "(unmatched)"
                span.update_name(f"{method} {route}")
                span.set_attribute("http.route", route)
                span.set_attribute("http.response.status_code", status["code"])
                tenant = (scope.get("state") or {}).get("tenant")
                if tenant:
                    span.set_attribute("trainyard.tenant", str(tenant))
                if status["code"] >= 500:
                    span.set_status(Status(StatusCode.ERROR))


class TracedRound:
    """Wraps a ScheduleRound: a ``scheduler.round`` span plus round metrics."""

    def __init__(self, inner: Any, tracer: Tracer | None, metrics: ControlLoopMetrics) -> None:
        self.inner = inner
        self.tracer = tracer
        self.metrics = metrics

    def __call__(self, jobs: Sequence[Any], pools: Sequence[Any], now_s: float) -> Any:
        started = time.perf_counter()
        cm = self.tracer.start_as_current_span("scheduler.round") if self.tracer else nullcontext(None)
        with cm as span:
            try:
                result = self.inner(jobs, pools, now_s)
            except BaseException:
                self.metrics.round_errors.inc()
                raise
            finally:
                self.metrics.rounds.inc()
                self.metrics.round_duration.observe(time.perf_counter() - started)
            self.metrics.placed.inc(len(result.placements))
            self.metrics.last_queued.set(len(jobs))
            self.metrics.last_unplaced.set(len(result.unplaced))
            if span is not None:
                span.set_attribute("trainyard.jobs", len(jobs))
                span.set_attribute("trainyard.pools", len(pools))
                span.set_attribute("trainyard.placed", len(result.placements))
                span.set_attribute("trainyard.unplaced", len(result.unplaced))
        return result


class TracedExecutor:
    """Wraps an Executor: ``executor.launch`` spans and launch metrics; everything else passes through."""

    def __init__(self, inner: Any, tracer: Tracer | None, metrics: ControlLoopMetrics) -> None:
        self.inner = inner
        self.tracer = tracer
        self.metrics = metrics

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def launch(self, req: Any) -> Any:
        started = time.perf_counter()
        attrs = {
            "trainyard.job_id": req.job_id,
            "trainyard.attempt": req.attempt,
            "trainyard.world_size": req.world_size,
            "trainyard.pool": req.pool,
            "trainyard.market": req.market,
        }
        try:
            if self.tracer is None:
                workers = self.inner.launch(req)
            else:
                with self.tracer.start_as_current_span("executor.launch", attributes=attrs) as span:
                    workers = self.inner.launch(req)
                    span.set_attribute("trainyard.workers", len(workers))
        except BaseException:
            self.metrics.launches.labels("error").inc()
            raise
        finally:
            self.metrics.launch_duration.observe(time.perf_counter() - started)
        self.metrics.launches.labels("ok").inc()
        return workers
