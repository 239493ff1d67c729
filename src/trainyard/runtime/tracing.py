"""Spans a worker records into its job's trace.

The executor hands each rank the attempt span's W3C context as ``TRACEPARENT`` (``TRAINYARD_TRACEPARENT``
too). A worker never talks to the server (it may have no network at all), so its spans travel like
everything else it reports: as ``span`` events in its event file (``executors.base`` names the fields),
which the server exports into the job's trace. A rank records ``worker.rank`` (the whole run, with its
outcome), ``train.steps`` (the training loop: steps, mean step time, tokens/s, last loss) and one
``checkpoint.save`` per checkpoint it commits. Without a ``TRACEPARENT`` (or when the job's trace is
not sampled) nothing is recorded.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from opentelemetry.trace import Span, StatusCode

from trainyard.tracecontext import TRACEPARENT_ENV, TRACEPARENT_ENV_ALIAS, context_from_traceparent

Emit = Callable[..., Any]


def span_document(span: ReadableSpan, host: str) -> dict[str, Any]:
    """The ``span`` event data of a finished span."""
    ctx = span.context
    assert ctx is not None
    return {
        "name": span.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_span_id": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "attributes": dict(span.attributes or {}),
        "status": "error" if span.status.status_code == StatusCode.ERROR else "unset",
        "status_message": span.status.description or "",
        "host": host,
    }


class EventSpanExporter(SpanExporter):
    """Writes each finished span as a ``span`` event through ``emit`` (the rank's event writer)."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self.host = socket.gethostname()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            for span in spans:
                self.emit("span", **span_document(span, self.host))
        except (OSError, ValueError):  # the event file is closed or gone: the spans are lost, not the run
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


class WorkerTrace:
    """The spans of one rank; :meth:`emit` wraps the rank's event writer and notes what it reports."""

    def __init__(self, traceparent: str, job_id: str, attempt: int, rank: int, emit: Emit) -> None:
        self._emit = emit
        self.provider = TracerProvider(
            resource=Resource({"service.name": "trainyard-worker"}), sampler=ParentBased(ALWAYS_OFF)
        )
        self.provider.add_span_processor(SimpleSpanProcessor(EventSpanExporter(emit)))
        self.tracer = self.provider.get_tracer("trainyard.runtime")
        self.attrs: dict[str, Any] = {
            "trainyard.job_id": job_id,
            "trainyard.attempt": attempt,
            "trainyard.rank": rank,
        }
        self.root: Span = self.tracer.start_span(
            "worker.rank", context=context_from_traceparent(traceparent), attributes=self.attrs
        )
        self.steps: Span | None = None
        self._lock = threading.Lock()
        self._first_step: int | None = None
        self._last: dict[str, Any] = {}
        self._step_time_sum = 0.0
        self._tokens_per_s_sum = 0.0
        self._heartbeats = 0
        self._checkpoints = 0
        self._done = False

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], job_id: str, attempt: int, rank: int, emit: Emit
    ) -> WorkerTrace | None:
        tp = env.get(TRACEPARENT_ENV) or env.get(TRACEPARENT_ENV_ALIAS)
        if not tp or context_from_traceparent(tp) is None:
            return None
        return cls(tp, job_id, attempt, rank, emit)

    @property
    def recording(self) -> bool:
        return self.root.is_recording()

    def start_training(self) -> None:
        """Open ``train.steps`` (the training loop), a child of ``worker.rank``."""
        with self._lock:
            if self.steps is None and not self._done:
                self.steps = self.tracer.start_span(
                    "train.steps", context=trace.set_span_in_context(self.root), attributes=self.attrs
                )

    def emit(self, kind: str, **data: Any) -> Any:
        """Report an event through the rank's writer, noting heartbeats and checkpoints for the spans."""
        if kind == "heartbeat":
            self._heartbeat(data)
        elif kind == "checkpoint":
            self._checkpoint(data)
        return self._emit(kind, **data)

    def _heartbeat(self, data: dict[str, Any]) -> None:
        with self._lock:
            step = data.get("step")
            if isinstance(step, int) and self._first_step is None:
                self._first_step = step
            self._last = data
            self._heartbeats += 1
            if isinstance(data.get("step_time_s"), int | float):
                self._step_time_sum += float(data["step_time_s"])
            if isinstance(data.get("tokens_per_s"), int | float):
                self._tokens_per_s_sum += float(data["tokens_per_s"])

    def _checkpoint(self, data: dict[str, Any]) -> None:
        save_s = data.get("save_s")
        now_ns = time.time_ns()
        with self._lock:
            if self._done:
                return
            self._checkpoints += 1
            parent = self.steps or self.root
        start_ns = now_ns - int(float(save_s) * 1e9) if isinstance(save_s, int | float) else now_ns
        span = self.tracer.start_span(
            "checkpoint.save",
            context=trace.set_span_in_context(parent),
            start_time=start_ns,
            attributes={
                **self.attrs,
                "trainyard.step": int(data.get("step") or 0),
                "trainyard.checkpoint.bytes": int(data.get("bytes") or 0),
                "trainyard.checkpoint.emergency": bool(data.get("emergency")),
                "trainyard.checkpoint.stall_s": float(data.get("stall_s") or 0.0),
            },
        )
        span.end(end_time=now_ns)

    def finish(self, outcome: str, data: Mapping[str, Any] | None = None) -> None:
        """End ``train.steps`` and ``worker.rank`` with the rank's outcome (before its terminal event)."""
        with self._lock:
            if self._done:
                return
            self._done = True
            steps, last, n = self.steps, dict(self._last), self._heartbeats
        summary: dict[str, Any] = {"trainyard.heartbeats": n, "trainyard.checkpoints": self._checkpoints}
        if isinstance(last.get("step"), int):
            summary["trainyard.final_step"] = last["step"]
            summary["trainyard.steps"] = last["step"] - (self._first_step or last["step"]) + 1
        if isinstance(last.get("loss"), int | float):
            summary["trainyard.loss"] = float(last["loss"])
        if n:
            summary["trainyard.step_time_s"] = self._step_time_sum / n
            summary["trainyard.tokens_per_s"] = self._tokens_per_s_sum / n
        error = outcome not in ("succeeded", "preempted")
        reason = str((data or {}).get("reason") or outcome)[:500]
        if steps is not None:
            steps.set_attributes(summary)
            if error:
                steps.set_status(StatusCode.ERROR, reason)
            steps.end()
        self.root.set_attributes({**summary, "trainyard.outcome": outcome})
        if error:
            self.root.set_status(StatusCode.ERROR, reason)
        self.root.end()
        self.provider.shutdown()
