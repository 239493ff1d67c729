"""OpenTelemetry tracing: the tracer provider, its exporters and sampler, and OpenTelemetry's own
instrumentation of the API (ASGI), the database (SQLAlchemy) and outgoing HTTP (httpx).

Configuration (read once when the app is built): ``TRAINYARD_TRACE_EXPORTER`` (``memory`` | ``console``
| ``otlp`` | ``none``) wins when set; otherwise the standard ``OTEL_TRACES_EXPORTER`` (a comma list of
``otlp``, ``console``, ``none``; ``memory`` too), otherwise ``memory``. ``memory`` keeps the latest
``TRAINYARD_TRACE_BUFFER_SPANS`` finished spans in process for the dashboard. ``otlp`` ships spans over
OTLP/HTTP (protobuf) to ``TRAINYARD_TRACE_OTLP_ENDPOINT``, else ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
else ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``, else ``http://127.0.0.1:4318/v1/traces``; the
exporter itself reads ``OTEL_EXPORTER_OTLP_HEADERS``, ``..._TIMEOUT`` and ``..._COMPRESSION`` and the
batch processor ``OTEL_BSP_*``. ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` name the service
(default ``trainyard``), ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` choose the sampler
(default ``parentbased_traceidratio`` at :data:`DEFAULT_SAMPLE_RATIO`: a trace is kept or dropped as a
whole, at its root, and a job's trace follows its submission's decision) and ``OTEL_SDK_DISABLED=true``
turns tracing off.

A request the sampler dropped still gets its SERVER span when it fails (a 5xx or an exception;
``TRAINYARD_TRACE_KEEP_ERRORS``) or is slow (``TRAINYARD_TRACE_KEEP_SLOWER_THAN_S``, default 1 s): the
middleware records nothing for it while it runs and, only for those, writes the span when it ends.
Spans go out through the OTLP/HTTP exporter of ``opentelemetry-exporter-otlp-proto-http`` with the request
encoded by ``observability.otlp`` (the same protobuf, a quarter of the CPU). Database statements are
CLIENT spans only with ``TRAINYARD_TRACE_DB_STATEMENTS=true`` (off by default:
they were a third of tracing's cost per submission, docs/benchmarks.md).

Whatever the sampler, a CLIENT span without a parent is dropped: the control loop's database queries and
background HTTP calls are traced only inside a traced operation (a request, a job's span), so an idle
loop exports nothing. Span attributes never carry request headers or API keys.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections import deque
from collections.abc import Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SynchronousMultiSpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util.types import Attributes
from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from trainyard import __version__
from trainyard.errors import InvalidInputError, ServiceUnavailableError

DEFAULT_OTLP_ENDPOINT = "http://127.0.0.1:4318/v1/traces"
EXPORTERS = ("memory", "console", "otlp", "none")
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
DEFAULT_SAMPLER = "parentbased_traceidratio"
# the share of traces kept when OTEL_TRACES_SAMPLER is not set (docs/benchmarks.md: tracing every
# submission costs more than the 5 % the platform allows itself; errors and slow requests are kept anyway)
DEFAULT_SAMPLE_RATIO = 0.1
DEFAULT_KEEP_SLOWER_THAN_S = 1.0
# why a span the sampler dropped was recorded after all: "error" or "slow"
KEPT_ATTRIBUTE = "trainyard.trace.kept"
# requests not worth a trace: scrapes and probes
DEFAULT_EXCLUDED_URLS = "/metrics,/healthz,/readyz,/static/"


class ObservabilitySettings(BaseSettings):
    """``TRAINYARD_TRACE_*`` settings and the standard ``OTEL_*`` variables they take precedence over."""

    model_config = SettingsConfigDict(env_prefix="TRAINYARD_", extra="ignore", populate_by_name=True)

    trace_exporter: str | None = None  # memory | console | otlp | none; None: OTEL_TRACES_EXPORTER
    trace_otlp_endpoint: str | None = None
    trace_buffer_spans: int = 2048
    # one CLIENT span per database statement (OpenTelemetry's SQLAlchemy instrumentation); off by default
    trace_db_statements: bool = False
    # a request or job span the sampler dropped is still recorded when it ends in an error ...
    trace_keep_errors: bool = True
    # ... or, for a request, when it took longer than this (0: never for being slow)
    trace_keep_slower_than_s: float = DEFAULT_KEEP_SLOWER_THAN_S
    otel_sdk_disabled: bool = Field(False, validation_alias=AliasChoices("OTEL_SDK_DISABLED"))
    otel_traces_exporter: str | None = Field(None, validation_alias=AliasChoices("OTEL_TRACES_EXPORTER"))
    otel_traces_endpoint: str | None = Field(
        None, validation_alias=AliasChoices("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )
    otel_endpoint: str | None = Field(None, validation_alias=AliasChoices("OTEL_EXPORTER_OTLP_ENDPOINT"))
    otel_protocol: str | None = Field(
        None,
        validation_alias=AliasChoices("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"),
    )
    otel_service_name: str | None = Field(None, validation_alias=AliasChoices("OTEL_SERVICE_NAME"))
    otel_traces_sampler: str | None = Field(None, validation_alias=AliasChoices("OTEL_TRACES_SAMPLER"))
    otel_traces_sampler_arg: str | None = Field(
        None, validation_alias=AliasChoices("OTEL_TRACES_SAMPLER_ARG")
    )
    otel_fastapi_excluded_urls: str | None = Field(
        None,
        validation_alias=AliasChoices(
            "OTEL_PYTHON_ASGI_EXCLUDED_URLS", "OTEL_PYTHON_FASTAPI_EXCLUDED_URLS", "OTEL_PYTHON_EXCLUDED_URLS"
        ),
    )

    def exporters(self) -> list[str]:
        """The exporters in force, validated (``[]`` when tracing is off)."""
        if self.otel_sdk_disabled:
            return []
        if self.trace_exporter is not None:
            raw, source = self.trace_exporter, "TRAINYARD_TRACE_EXPORTER"
        elif self.otel_traces_exporter is not None:
            raw, source = self.otel_traces_exporter, "OTEL_TRACES_EXPORTER"
        else:
            return ["memory"]
        names = [n.strip().lower() for n in raw.split(",") if n.strip()]
        bad = [n for n in names if n not in EXPORTERS]
        if bad:
            raise InvalidInputError(
                f"{source}: unknown trace exporter {', '.join(map(repr, bad))}",
                hint=f"Use one of: {', '.join(EXPORTERS)}.",
                details={"errors": [{"field": source, "message": f"unknown exporter {n!r}"} for n in bad]},
            )
        if not names or "none" in names:
            return []
        return list(dict.fromkeys(names))

    def otlp_endpoint(self) -> str:
        if self.trace_otlp_endpoint:
            return self.trace_otlp_endpoint
        if self.otel_traces_endpoint:
            return self.otel_traces_endpoint
        if self.otel_endpoint:
            return self.otel_endpoint.rstrip("/") + "/v1/traces"
        return DEFAULT_OTLP_ENDPOINT

    def service_name(self) -> str:
        return self.otel_service_name or "trainyard"


class NoOrphanClientSpans(Sampler):
    """Drops CLIENT spans that have no parent (database queries and HTTP calls made outside any traced
    operation, such as the control loop's polling); everything else goes to the configured sampler."""

    def __init__(self, delegate: Sampler) -> None:
        self.delegate = delegate

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        if kind == SpanKind.CLIENT and not trace.get_current_span(parent_context).get_span_context().is_valid:
            return SamplingResult(Decision.DROP)
        return self.delegate.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"NoOrphanClientSpans{{{self.delegate.get_description()}}}"


def drops_children_of_unsampled(provider: Any) -> bool:
    """Whether ``provider``'s sampler drops every span whose local parent was not sampled (a parent-based
    sampler with the default answer for an unsampled local parent, or ``always_off``): then the spans an
    unsampled request would start are known to be dropped before any is made (the gateway skips them)."""
    sampler = getattr(provider, "sampler", None)
    if isinstance(sampler, NoOrphanClientSpans):
        sampler = sampler.delegate
    if sampler is ALWAYS_OFF:
        return True
    unsampled_parent = getattr(sampler, "_local_parent_not_sampled", None)
    return isinstance(sampler, ParentBased) and unsampled_parent is ALWAYS_OFF


def make_sampler(name: str | None, arg: str | None) -> Sampler:
    """The sampler ``OTEL_TRACES_SAMPLER`` names; without one, ``parentbased_traceidratio`` at
    ``OTEL_TRACES_SAMPLER_ARG`` or else :data:`DEFAULT_SAMPLE_RATIO`. A ratio sampler named without an
    argument keeps every trace (the OpenTelemetry specification's default of 1.0)."""
    key = (name or DEFAULT_SAMPLER).strip().lower()
    if key not in SAMPLERS:
        raise InvalidInputError(
            f"OTEL_TRACES_SAMPLER: unknown sampler {key!r}", hint=f"Use one of: {', '.join(SAMPLERS)}."
        )
    ratio = 1.0
    if key.endswith("traceidratio"):
        default = DEFAULT_SAMPLE_RATIO if not name else 1.0
        try:
            ratio = float(arg) if arg not in (None, "") else default
        except ValueError:
            raise InvalidInputError(
                f"OTEL_TRACES_SAMPLER_ARG: {arg!r} is not a number",
                hint="Give the sampling ratio between 0 and 1, e.g. 0.1.",
            ) from None
        if not 0.0 <= ratio <= 1.0:
            raise InvalidInputError(
                f"OTEL_TRACES_SAMPLER_ARG: {ratio} is not between 0 and 1", hint="e.g. 0.1"
            )
    root: Sampler = {"always_on": ALWAYS_ON, "always_off": ALWAYS_OFF}.get(
        key.removeprefix("parentbased_"), TraceIdRatioBased(ratio)
    )
    return ParentBased(root) if key.startswith("parentbased_") else root


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


class TrainyardTracerProvider(TracerProvider):
    """A tracer provider whose exporting processors are also reachable for spans that were recorded
    elsewhere: the workers' spans, which arrive through their event files (:meth:`replay`)."""

    def __init__(self, *, resource: Resource, sampler: Sampler) -> None:
        super().__init__(resource=resource, sampler=sampler)
        self.exporting = SynchronousMultiSpanProcessor()
        self.add_span_processor(self.exporting)

    def add_exporting_processor(self, processor: Any) -> None:
        self.exporting.add_span_processor(processor)

    def replay(self, spans: Sequence[ReadableSpan]) -> None:
        """Hand finished spans recorded elsewhere (another process; a request the sampler dropped and
        :class:`TracingMiddleware` kept) to this provider's exporters."""
        for span in spans:
            self.exporting.on_end(span)


def _otlp_exporter(cfg: ObservabilitySettings) -> SpanExporter:
    protocol = (cfg.otel_protocol or "http/protobuf").strip().lower()
    if protocol != "http/protobuf":
        raise ServiceUnavailableError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol} is not supported",
            hint="trainyard ships the OTLP/HTTP exporter: use http/protobuf (port 4318).",
        )
    try:
        from trainyard.observability.otlp import OTLPSpanExporter
    except ImportError as exc:  # pragma: no cover - a pinned dependency
        raise ServiceUnavailableError(
            "TRAINYARD_TRACE_EXPORTER=otlp needs the OTLP exporter package",
            hint="pip install opentelemetry-exporter-otlp-proto-http, or use memory/console/none.",
        ) from exc
    return OTLPSpanExporter(endpoint=cfg.otlp_endpoint())


def make_tracer_provider(
    settings: ObservabilitySettings | None = None,
) -> tuple[TrainyardTracerProvider | None, RingBufferExporter | None]:
    """A tracer provider of its own (not the process-global one) and, for ``memory``, its buffer."""
    cfg = settings or ObservabilitySettings()
    exporters = cfg.exporters()
    if not exporters:
        return None, None
    resource = Resource.create({"service.version": __version__})
    named = str(resource.attributes.get("service.name", ""))
    if cfg.otel_service_name or not named or named.startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": cfg.service_name()}))
    sampler = NoOrphanClientSpans(make_sampler(cfg.otel_traces_sampler, cfg.otel_traces_sampler_arg))
    provider = TrainyardTracerProvider(resource=resource, sampler=sampler)
    buffer = None
    for name in exporters:
        if name == "memory":
            buffer = RingBufferExporter(cfg.trace_buffer_spans)
            provider.add_exporting_processor(SimpleSpanProcessor(buffer))
        elif name == "console":
            provider.add_exporting_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        else:
            provider.add_exporting_processor(BatchSpanProcessor(_otlp_exporter(cfg)))
    return provider, buffer


# ---- OpenTelemetry's instrumentation, bound to this provider (never the global one) --------------------

SEMCONV_OPT_IN = "OTEL_SEMCONV_STABILITY_OPT_IN"


def _stable_semconv() -> None:
    """The stable HTTP and database attribute names (``http.response.status_code``, ``db.query.text``)
    unless the operator chose otherwise; read once, when the first instrumentation starts."""
    os.environ.setdefault(SEMCONV_OPT_IN, "http,database")


_SERVER_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "QUERY"}
)
_HTTP_SCHEMA_URL = "https://opentelemetry.io/schemas/1.21.0"  # the stable HTTP conventions


class _UnsampledRequestSpan(NonRecordingSpan):
    """The span of a request the sampler dropped: it records nothing (``is_recording()`` is False, so
    the code under it does no tracing work), but keeps the attributes set on it, in case the request
    ends in an error or slowly and :class:`TracingMiddleware` writes its span after all."""

    def __init__(self, context: SpanContext) -> None:
        super().__init__(context)
        self.kept_attributes: dict[str, Any] = {}

    def set_attribute(self, key: str, value: Any) -> None:
        self.kept_attributes[key] = value

    def set_attributes(self, attributes: Any) -> None:
        self.kept_attributes.update(attributes)


def _exception_event(error: BaseException, time_ns: int) -> Event:
    """The ``exception`` event the SDK's ``record_exception`` writes."""
    module, qualname = type(error).__module__, type(error).__qualname__
    return Event(
        "exception",
        {
            "exception.type": f"{module}.{qualname}" if module and module != "builtins" else qualname,
            "exception.message": str(error),
            "exception.stacktrace": "".join(traceback.format_exception(error)),
            "exception.escaped": "False",
        },
        timestamp=time_ns,
    )


class TracingMiddleware:
    """One SERVER span per HTTP request, with the stable HTTP semantic conventions, on the app's tracer
    provider, made with the OpenTelemetry API directly.

    It records what OpenTelemetry's ASGI middleware (``opentelemetry-instrumentation-asgi``) records for a
    server span under ``OTEL_SEMCONV_STABILITY_OPT_IN=http``: the caller's context extracted with the
    global propagator (W3C ``traceparent``/``tracestate`` and ``baggage`` by default), the span named
    ``METHOD`` and renamed ``METHOD /route/{template}`` with ``http.route`` once the router has matched,
    ``http.request.method`` (``_OTHER`` plus ``http.request.method_original`` for unknown methods),
    ``url.scheme``, ``url.path``, ``url.query``, ``server.address``, ``server.port``,
    ``network.protocol.version``, ``client.address``, ``client.port``, ``user_agent.original``,
    ``http.response.status_code``, and for a 5xx or an exception the ERROR status with ``error.type``
    (an exception is recorded as the span's event). The span ends with the last body message.

    The sampler decides first, before any attribute is collected. A request it drops runs under an
    :class:`_UnsampledRequestSpan` (its context still propagates, with the sampled flag off, so a job it
    submits is not traced either); when such a request fails (``keep_errors``) or takes longer than
    ``keep_slower_than_s``, its SERVER span is written when it ends, with the same ids, attributes and
    status, plus ``trainyard.trace.kept`` (``error`` or ``slow``), straight to the provider's exporters
    (``TrainyardTracerProvider.replay``). Its children were never recorded.

    What it leaves out: every attribute computed twice (the ASGI middleware collects them, starts the
    span with them and then sets each again), the user-agent normalisation on every request, the
    environment lookup per request for the method list, OpenTelemetry HTTP metrics on a meter provider
    the platform never sets (the request metrics are Prometheus ones, in the API middleware), and the
    separate route-naming middleware with its own ``send`` wrapper (docs/benchmarks.md)."""

    def __init__(
        self,
        app: Any,
        tracer_provider: TracerProvider,
        excluded_urls: str | None = None,
        keep_errors: bool = True,
        keep_slower_than_s: float = DEFAULT_KEEP_SLOWER_THAN_S,
    ) -> None:
        from opentelemetry import propagate
        from opentelemetry.util.http import parse_excluded_urls

        self.app = app
        self.tracer = tracer_provider.get_tracer("trainyard.api", __version__, schema_url=_HTTP_SCHEMA_URL)
        self.scope = InstrumentationScope("trainyard.api", __version__, _HTTP_SCHEMA_URL)
        self.resource = tracer_provider.resource
        replay = getattr(tracer_provider, "replay", None)
        self.replay = replay if keep_errors or keep_slower_than_s > 0 else None
        self.keep_errors = keep_errors
        self.keep_slower_than_ns = int(keep_slower_than_s * 1e9) if keep_slower_than_s > 0 else 0
        self.excluded = parse_excluded_urls(excluded_urls or DEFAULT_EXCLUDED_URLS)
        self.propagator = propagate.get_global_textmap()
        self.fields = frozenset(f.lower().encode("latin-1") for f in self.propagator.fields)

    @staticmethod
    def _attributes(
        scope: dict[str, Any], path: str, scheme: str, host_text: str | None, agent: bytes | None
    ) -> dict[str, Any]:
        server = scope.get("server") or ("0.0.0.0", 80)
        raw_method: str = scope.get("method") or "HTTP"
        method = raw_method.upper()
        attrs: dict[str, Any] = {"url.scheme": scheme, "url.path": path}
        if method in _SERVER_METHODS:
            attrs["http.request.method"] = method
        else:
            attrs["http.request.method"] = "_OTHER"
            attrs["http.request.method_original"] = raw_method
        query = scope.get("query_string")
        if query:
            attrs["url.query"] = query.decode("latin-1")
        if host_text:
            if host_text.startswith("["):  # an IPv6 literal: [::1]:8000
                address, _, rest = host_text.partition("]")
                address, port = address + "]", rest.removeprefix(":")
            else:
                address, _, port = host_text.partition(":")
            attrs["server.address"] = address
            attrs["server.port"] = int(port) if port.isdigit() else (443 if scheme == "https" else 80)
        else:
            attrs["server.address"], attrs["server.port"] = server[0], server[1]
        version = scope.get("http_version")
        if version:
            attrs["network.protocol.version"] = version
        client = scope.get("client")
        if client:
            attrs["client.address"], attrs["client.port"] = client[0], client[1]
        if agent:
            attrs["user_agent.original"] = agent.decode("latin-1")
        return attrs

    @staticmethod
    def _outcome(
        scope: dict[str, Any], method: str, status: int, error: BaseException | None
    ) -> tuple[str, dict[str, Any], Status | None]:
        """The span's final name, the attributes known only at the end, and its ERROR status if any."""
        route = getattr(scope.get("route"), "path", None)
        late: dict[str, Any] = {}
        if route:
            late["http.route"] = route
        if status:
            late["http.response.status_code"] = status
        failed: Status | None = None
        if error is not None:
            late["error.type"] = type(error).__qualname__
            failed = Status(StatusCode.ERROR, f"{type(error).__name__}: {error}")
        elif status >= 500 or 0 < status < 100:
            late["error.type"] = str(status)
            failed = Status(StatusCode.ERROR)
        return (f"{method} {route}" if route else method), late, failed

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path") or ""
        scheme = scope.get("scheme") or "http"
        host = agent = None
        carrier: dict[str, str] | None = None
        fields = self.fields
        for name, value in scope.get("headers") or ():
            if name == b"host":
                host = value
            elif name == b"user-agent":
                agent = value
            elif name in fields:
                if carrier is None:
                    carrier = {}
                carrier[name.decode("latin-1")] = value.decode("latin-1")
        host_text = host.decode("latin-1") if host else None
        if self.excluded is not None:
            server = scope.get("server") or ("0.0.0.0", 80)
            url_host = host_text or (server[0] if server[1] == 80 else f"{server[0]}:{server[1]}")
            if self.excluded.url_disabled(f"{scheme}://{url_host}{path}"):
                await self.app(scope, receive, send)
                return
        method = (scope.get("method") or "HTTP").upper()
        if method not in _SERVER_METHODS:
            method = "HTTP"
        parent = self.propagator.extract(carrier) if carrier else Context()
        started_ns = time.time_ns()
        span: Any = self.tracer.start_span(
            method, context=parent, kind=SpanKind.SERVER, start_time=started_ns
        )
        recording = span.is_recording()
        if recording:
            span.set_attributes(self._attributes(scope, path, scheme, host_text, agent))
        else:
            span = _UnsampledRequestSpan(span.get_span_context())
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        status = 0
        ended = False

        def finish(error: BaseException | None = None) -> None:
            nonlocal ended
            ended = True
            if recording:
                name, late, status_obj = self._outcome(scope, method, status, error)
                if name != method:
                    span.update_name(name)
                span.set_attributes(late)
                if error is not None:
                    span.record_exception(error)
                if status_obj is not None:
                    span.set_status(status_obj)
                span.end()
                return
            if self.replay is None:
                return
            end_ns = time.time_ns()
            if self.keep_errors and (error is not None or status >= 500 or 0 < status < 100):
                kept = "error"
            elif self.keep_slower_than_ns and end_ns - started_ns > self.keep_slower_than_ns:
                kept = "slow"
            else:
                return
            name, late, status_obj = self._outcome(scope, method, status, error)
            attrs = self._attributes(scope, path, scheme, host_text, agent)
            attrs.update(span.kept_attributes)
            attrs.update(late)
            attrs[KEPT_ATTRIBUTE] = kept
            ctx = span.get_span_context()
            remote = trace.get_current_span(parent).get_span_context()
            self.replay(
                [
                    ReadableSpan(
                        name=name,
                        context=SpanContext(
                            ctx.trace_id,
                            ctx.span_id,
                            is_remote=False,
                            trace_flags=TraceFlags(ctx.trace_flags | TraceFlags.SAMPLED),
                            trace_state=ctx.trace_state,
                        ),
                        parent=remote if remote.is_valid else None,
                        resource=self.resource,
                        attributes=attrs,
                        events=[_exception_event(error, end_ns)] if error is not None else (),
                        kind=SpanKind.SERVER,
                        status=status_obj or Status(StatusCode.UNSET),
                        start_time=started_ns,
                        end_time=end_ns,
                        instrumentation_scope=self.scope,
                    )
                ]
            )

        async def traced_send(message: dict[str, Any]) -> None:
            nonlocal status
            kind = message["type"]
            if kind == "http.response.start":
                status = message["status"]
            await send(message)
            if kind == "http.response.body" and not message.get("more_body", False) and not ended:
                finish()

        try:
            await self.app(scope, receive, traced_send)
        except BaseException as exc:
            if not ended:
                finish(exc)
            raise
        finally:
            otel_context.detach(token)
            if not ended:
                finish()


def instrument_app(app: Any, provider: TracerProvider, cfg: ObservabilitySettings | None = None) -> None:
    """One SERVER span per HTTP request (``METHOD /route/{template}``), W3C context from the caller
    (:class:`TracingMiddleware`); ``/metrics``, ``/healthz``, ``/readyz`` and ``/static/`` are not traced
    unless ``OTEL_PYTHON_EXCLUDED_URLS`` (or the ASGI/FastAPI variants) says otherwise."""
    _stable_semconv()
    cfg = cfg or ObservabilitySettings()
    app.add_middleware(
        TracingMiddleware,
        tracer_provider=provider,
        excluded_urls=cfg.otel_fastapi_excluded_urls or DEFAULT_EXCLUDED_URLS,
        keep_errors=cfg.trace_keep_errors,
        keep_slower_than_s=cfg.trace_keep_slower_than_s,
    )


def instrument_engine(db: Any, provider: TracerProvider, enabled: bool = True) -> None:
    """CLIENT spans for the statements of ``db``'s engine (``TRAINYARD_TRACE_DB_STATEMENTS``); a second app
    over the same database moves the spans to its provider instead of adding listeners again, or, not
    ``enabled``, silences the listeners already there."""
    existing = getattr(db, "otel_engine_tracer", None)
    if not enabled:
        if existing is not None:
            existing.tracer = trace.NoOpTracer()
        return
    _stable_semconv()
    from opentelemetry.instrumentation.sqlalchemy import __name__ as scope
    from opentelemetry.instrumentation.sqlalchemy.engine import EngineTracer
    from opentelemetry.instrumentation.sqlalchemy.version import __version__ as version
    from opentelemetry.metrics import NoOpMeter

    tracer = provider.get_tracer(scope, version)
    if existing is not None:
        existing.tracer = tracer
        return
    usage = NoOpMeter(scope).create_up_down_counter("db.client.connections.usage")
    db.otel_engine_tracer = EngineTracer(tracer, db.engine, usage)


def instrument_httpx(client: Any, provider: TracerProvider) -> None:
    """CLIENT spans (and ``traceparent`` headers) for the requests of one httpx client."""
    _stable_semconv()
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    HTTPXClientInstrumentor.instrument_client(client, tracer_provider=provider)
