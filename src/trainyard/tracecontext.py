"""W3C trace context (``traceparent``) as one string: what a job stores at submission so that every later
span of the job (admission, placement, attempts, checkpoints, completion) joins its trace, and what the
executors hand to the workers in the ``TRACEPARENT`` environment variable.

Only the OpenTelemetry API is used here (no SDK, no exporter), so the server and the worker runtime can
both import it.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

# the environment variables a worker reads its parent span from (OpenTelemetry's name, then ours)
TRACEPARENT_ENV = "TRACEPARENT"
TRACEPARENT_ENV_ALIAS = "TRAINYARD_TRACEPARENT"


def format_traceparent(ctx: SpanContext) -> str | None:
    """``00-<trace id>-<span id>-<flags>`` of a valid span context, else None."""
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def parse_traceparent(value: str | None) -> SpanContext | None:
    """The (remote) span context of a ``traceparent`` value, or None when it is missing or malformed."""
    if not value:
        return None
    parts = value.strip().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    if parts[0] == "ff":
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3][:2], 16)
    except ValueError:
        return None
    ctx = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags & 0xFF))
    return ctx if ctx.is_valid else None


def current_traceparent() -> str | None:
    """The ``traceparent`` of the span current in this context (None outside any span)."""
    return format_traceparent(trace.get_current_span().get_span_context())


def context_from_traceparent(value: str | None) -> Context | None:
    """An OpenTelemetry context whose current span is the one ``value`` names (for ``start_span``)."""
    ctx = parse_traceparent(value)
    if ctx is None:
        return None
    return trace.set_span_in_context(NonRecordingSpan(ctx))
