"""OpenTelemetry GenAI semantic conventions for inference requests: one CLIENT span per request through
the gateway, named ``{gen_ai.operation.name} {gen_ai.request.model}`` (``chat my-deployment``), with the
request parameters, the model version that answered, token usage and finish reasons. Prompts and
completions are never recorded."""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

PROVIDER = "trainyard"
OPERATIONS = {"chat.completions": "chat", "completions": "text_completion"}


def start_span(tracer: Tracer, endpoint: str, req: Any, deployment: str, version: str) -> Span:
    op = OPERATIONS.get(endpoint, endpoint)
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": op,
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.system": PROVIDER,
        "gen_ai.request.model": deployment,
        "gen_ai.response.model": version,
        "trainyard.deployment": deployment,
        "trainyard.stream": bool(getattr(req, "stream", False)),
    }
    max_tokens = getattr(req, "max_completion_tokens", None) or getattr(req, "max_tokens", None)
    for key, value in (
        ("gen_ai.request.max_tokens", max_tokens),
        ("gen_ai.request.temperature", getattr(req, "temperature", None)),
        ("gen_ai.request.top_p", getattr(req, "top_p", None)),
        ("gen_ai.request.seed", getattr(req, "seed", None)),
        ("gen_ai.request.presence_penalty", getattr(req, "presence_penalty", None)),
        ("gen_ai.request.frequency_penalty", getattr(req, "frequency_penalty", None)),
        ("gen_ai.request.choice.count", getattr(req, "n", None)),
    ):
        if value is not None:
            attrs[key] = value
    stop = getattr(req, "stop", None)
    if stop:
        attrs["gen_ai.request.stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    return tracer.start_span(f"{op} {deployment}", kind=SpanKind.CLIENT, attributes=attrs)


def record_response(span: Span, doc: dict[str, Any]) -> None:
    """The response id and finish reasons of a (non-streamed) completion document."""
    if doc.get("id"):
        span.set_attribute("gen_ai.response.id", str(doc["id"]))
    reasons = [str(c.get("finish_reason")) for c in doc.get("choices") or [] if c.get("finish_reason")]
    if reasons:
        span.set_attribute("gen_ai.response.finish_reasons", reasons)


def end_span(
    span: Span,
    status: int,
    usage: dict[str, Any] | None,
    route: str,
    replica_url: str | None = None,
    ttft_s: float | None = None,
) -> None:
    u = usage or {}
    span.set_attribute("gen_ai.usage.input_tokens", int(u.get("prompt_tokens", 0) or 0))
    span.set_attribute("gen_ai.usage.output_tokens", int(u.get("completion_tokens", 0) or 0))
    span.set_attribute("http.response.status_code", status)
    span.set_attribute("trainyard.route", route)
    if replica_url:
        span.set_attribute("server.address", replica_url)
    if ttft_s is not None:
        span.set_attribute("trainyard.time_to_first_token_s", ttft_s)
    if status >= 400:
        span.set_attribute("error.type", str(status))
        span.set_status(Status(StatusCode.ERROR, f"status {status}"))
    span.end()
