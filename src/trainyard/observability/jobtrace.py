"""One trace per job, and the control-loop wrappers that feed it.

A job's trace starts at submission: the ``POST /v1/jobs`` request span (or, for a job submitted outside
a request, a ``job.submit`` span of its own) is its root, and its ``traceparent`` is kept in the job's
first event. Every later span of the job is a child of it:

- ``job.admit`` (submission → admitted or rejected), ``job.place`` (queued → placed, with the pool),
  ``job.checkpoint`` (one per committed checkpoint, as long as the save took) and ``job.complete``
  come from the job's events, read after each control-loop tick (:meth:`JobTelemetry.tick`), so they
  hold whatever path the job took (admission batches, restarts, cancellation, budgets);
- ``job.attempt`` is opened when the executor launches the gang and closed by the event that ends the
  attempt; ``executor.launch`` is its child, and the workers receive its context as ``TRACEPARENT``
  (and ``TRAINYARD_TRACEPARENT``). Spans the workers record (``worker.rank``, ``train.steps``,
  ``checkpoint.save``) come back through their event files as ``span`` events and are exported by this
  process: they share the job's trace id. A worker span whose trace id is not its attempt's is dropped.

A job whose submission the sampler dropped (``observability.tracing``: the default samples a share of
traces) gets none of these spans, and its workers record none (their ``TRACEPARENT`` says not sampled),
except that a rejection at admission and a failed completion are still recorded (``trainyard.trace.kept
= error``) unless ``TRAINYARD_TRACE_KEEP_ERRORS=false``.

The same events feed the training counters (checkpoint durations and failures, preemptions, restarts).
A scheduling round that places, migrates or fails emits a ``scheduler.round`` span; an idle one emits
nothing.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import structlog
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
)
from sqlalchemy import func, select

from trainyard.observability.metrics import ControlLoopMetrics, TrainingMetrics
from trainyard.observability.tracing import KEPT_ATTRIBUTE
from trainyard.store.models import JobEventRow
from trainyard.tracecontext import (
    TRACEPARENT_ENV,
    TRACEPARENT_ENV_ALIAS,
    context_from_traceparent,
    format_traceparent,
)

log = structlog.get_logger("trainyard.tracing")

TAIL_KINDS = ("state", "placement", "checkpoint", "log", "restart", "failed")
TAIL_BATCH = 2000
CONTEXT_CACHE = 10_000
MAX_OPEN_ATTEMPTS = 10_000
MAX_WORKER_SPANS_PER_ATTEMPT = 1_000
MAX_SPAN_ATTRIBUTES = 64
MAX_ATTRIBUTE_CHARS = 1_024
TERMINAL = ("succeeded", "failed", "cancelled")
ACTIVE = ("starting", "running")
WORKER_SCOPE = InstrumentationScope("trainyard.runtime")


def _ns(time_s: float) -> int:
    return int(time_s * 1e9)


@dataclass
class JobLive:
    """What the event stream says about one open job beyond its stored progress."""

    checkpoint_save_s: float | None = None
    checkpoint_failures: int = 0
    queued_at_s: float | None = None
    worker_spans: dict[int, int] = field(default_factory=dict)  # attempt -> spans accepted


class JobTelemetry:
    """Job spans and training counters from the job events; the open attempt spans."""

    def __init__(
        self,
        db: Any,
        tracer: Tracer | None,
        provider: Any,
        metrics: TrainingMetrics,
        service_name: str = "trainyard",
        *,
        keep_errors: bool = True,
    ) -> None:
        self.db = db
        self.keep_errors = keep_errors
        self.tracer = tracer
        self.provider = provider
        self.metrics = metrics
        self.worker_resource = Resource({"service.name": f"{service_name}-worker"})
        self._lock = threading.Lock()
        self._contexts: OrderedDict[str, tuple[Context | None, float | None]] = OrderedDict()
        self._attempts: OrderedDict[tuple[str, int], Span] = OrderedDict()
        self.live: dict[str, JobLive] = {}
        self.cursor: int | None = None
        try:
            self._start_cursor()
        except Exception as exc:  # the database is away: the first tick tries again
            log.warning("telemetry_cursor_failed", error=str(exc)[:300])

    # ---- job contexts --------------------------------------------------------------------------
    def _start_cursor(self) -> None:
        with self.db.session() as s:
            self.cursor = int(s.scalar(select(func.max(JobEventRow.id))) or 0)

    def job_context(self, job_id: str) -> tuple[Context | None, float | None]:
        """The context of the job's ``job.submit`` span (None when it was submitted untraced) and the
        submission time."""
        with self._lock:
            hit = self._contexts.get(job_id)
            if hit is not None:
                self._contexts.move_to_end(job_id)
                return hit
        with self.db.session() as s:
            row = s.execute(
                select(JobEventRow.data, JobEventRow.time_s)
                .where(JobEventRow.job_id == job_id, JobEventRow.kind == "state")
                .order_by(JobEventRow.id)
                .limit(1)
            ).first()
        value: tuple[Context | None, float | None] = (None, None)
        if row is not None:
            value = (context_from_traceparent((row.data or {}).get("traceparent")), float(row.time_s))
        with self._lock:
            self._contexts[job_id] = value
            while len(self._contexts) > CONTEXT_CACHE:
                self._contexts.popitem(last=False)
        return value

    def _span(
        self,
        name: str,
        parent: Context,
        start_s: float,
        end_s: float,
        attributes: dict[str, Any],
        error: str | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
    ) -> None:
        if self.tracer is None:
            return
        sc = trace.get_current_span(parent).get_span_context()
        if not sc.trace_flags.sampled:  # the job's trace was not sampled at its submission
            if error is None or not self.keep_errors:
                return
            # an error is kept anyway: a span of the job's trace, under its (unrecorded) root
            attributes = {**attributes, KEPT_ATTRIBUTE: "error"}
            flags = TraceFlags(sc.trace_flags | TraceFlags.SAMPLED)
            parent = trace.set_span_in_context(
                NonRecordingSpan(SpanContext(sc.trace_id, sc.span_id, True, flags, sc.trace_state))
            )
        span = self.tracer.start_span(
            name, context=parent, kind=kind, attributes=attributes, start_time=_ns(min(start_s, end_s))
        )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error[:500]))
        span.end(end_time=_ns(end_s))

    # ---- attempts --------------------------------------------------------------------------------
    def start_attempt(self, req: Any) -> Span | None:
        """Open the ``job.attempt`` span of a launch (a child of the job's span)."""
        if self.tracer is None:
            return None
        parent, _ = self.job_context(req.job_id)
        if parent is None:
            return None
        span = self.tracer.start_span(
            "job.attempt",
            context=parent,
            attributes={
                "trainyard.job_id": req.job_id,
                "trainyard.attempt": req.attempt,
                "trainyard.pool": req.pool,
                "trainyard.market": req.market,
                "trainyard.world_size": req.world_size,
                "trainyard.accelerator": req.accelerator or "cpu",
            },
        )
        with self._lock:
            old = self._attempts.pop((req.job_id, req.attempt), None)
            self._attempts[(req.job_id, req.attempt)] = span
            evicted = []
            while len(self._attempts) > MAX_OPEN_ATTEMPTS:
                evicted.append(self._attempts.popitem(last=False)[1])
        for sp in [*([old] if old is not None else []), *evicted]:
            sp.end()
        return span

    def attempt_span(self, job_id: str, attempt: int) -> Span | None:
        with self._lock:
            return self._attempts.get((job_id, attempt))

    def _end_attempt(self, job_id: str, attempt: int, outcome: str, reason: str, end_s: float) -> None:
        with self._lock:
            span = self._attempts.pop((job_id, attempt), None)
        if span is None:
            return
        span.set_attribute("trainyard.outcome", outcome)
        if reason:
            span.set_attribute("trainyard.reason", reason[:500])
        if outcome not in ("succeeded", "running"):
            span.set_status(Status(StatusCode.ERROR, f"{outcome}: {reason}"[:500]))
        span.end(end_time=_ns(end_s))

    # ---- worker spans ---------------------------------------------------------------------------
    def worker_span(self, job_id: str, attempt: int, data: dict[str, Any]) -> bool:
        """Export one span a worker recorded (a ``span`` event's data); False when it is refused."""
        if self.provider is None:
            return False
        expected = None
        span = self.attempt_span(job_id, attempt)
        if span is not None:
            expected = span.get_span_context().trace_id
        else:
            parent, _ = self.job_context(job_id)
            if parent is not None:
                expected = trace.get_current_span(parent).get_span_context().trace_id
        live = self.live.setdefault(job_id, JobLive())
        count = live.worker_spans.get(attempt, 0)
        readable = decode_worker_span(data, self.worker_resource)
        if (
            readable is None
            or expected is None
            or readable.context is None
            or readable.context.trace_id != expected
            or count >= MAX_WORKER_SPANS_PER_ATTEMPT
        ):
            return False
        live.worker_spans[attempt] = count + 1
        self.provider.replay([readable])
        return True

    # ---- the event stream ---------------------------------------------------------------------------
    def tick(self) -> int:
        """Turn the job events written since the last call into spans and counters; returns how many."""
        if self.cursor is None:
            self._start_cursor()
            return 0
        with self.db.session() as s:
            rows = s.execute(
                select(
                    JobEventRow.id, JobEventRow.job_id, JobEventRow.kind, JobEventRow.data, JobEventRow.time_s
                )
                .where(JobEventRow.id > self.cursor, JobEventRow.kind.in_(TAIL_KINDS))
                .order_by(JobEventRow.id)
                .limit(TAIL_BATCH)
            ).all()
        for r in rows:
            self.cursor = max(self.cursor, int(r.id))
            try:
                self._apply(r.job_id, r.kind, dict(r.data or {}), float(r.time_s))
            except Exception:
                log.exception("telemetry_event_failed", job_id=r.job_id, kind=r.kind)
        return len(rows)

    def _apply(self, job_id: str, kind: str, data: dict[str, Any], time_s: float) -> None:
        live = self.live.setdefault(job_id, JobLive())
        attrs: dict[str, Any] = {"trainyard.job_id": job_id}
        if kind == "log":
            if data.get("checkpoint_failed"):
                live.checkpoint_failures += 1
                self.metrics.checkpoint_failures.inc()
            return
        if kind == "failed":
            if "TrainingDiverged" in str(data.get("reason") or ""):
                self.metrics.diverged.inc()
            return
        if kind == "restart":
            self.metrics.restarts.labels(str(data.get("classification") or "infra")).inc()
            return
        if kind == "checkpoint":
            save_s = data.get("save_s")
            if isinstance(save_s, int | float):
                live.checkpoint_save_s = float(save_s)
                self.metrics.checkpoint_duration.observe(float(save_s))
            self.metrics.checkpoints.inc()
            attempt = int(data.get("attempt") or 0)
            attempt_span = self.attempt_span(job_id, attempt)
            parent = trace.set_span_in_context(attempt_span) if attempt_span else self.job_context(job_id)[0]
            if parent is not None:
                attrs.update(
                    {
                        "trainyard.attempt": attempt,
                        "trainyard.step": int(data.get("step") or 0),
                        "trainyard.checkpoint.bytes": int(data.get("bytes") or 0),
                        "trainyard.checkpoint.emergency": bool(data.get("emergency")),
                    }
                )
                dur = float(save_s) if isinstance(save_s, int | float) else 0.0
                self._span("job.checkpoint", parent, time_s - dur, time_s, attrs)
            return
        if kind == "placement":
            parent, _ = self.job_context(job_id)
            if parent is not None:
                attrs.update(
                    {
                        "trainyard.attempt": int(data.get("attempt") or 0),
                        "trainyard.pool": str(data.get("pool")),
                        "trainyard.devices": int(data.get("devices") or 0),
                        "trainyard.market": str(data.get("market")),
                        "trainyard.accelerator": str(data.get("accelerator")),
                        "trainyard.expected_cost_usd": float(data.get("expected_cost_usd") or 0.0),
                    }
                )
                start = live.queued_at_s if live.queued_at_s is not None else time_s
                self._span("job.place", parent, start, time_s, attrs)
            return
        # a state change
        src, dst, reason = data.get("from"), data.get("to"), str(data.get("reason") or "")
        if src is None and dst == "pending":  # the submission: its context, without a query later
            with self._lock:
                self._contexts[job_id] = (context_from_traceparent(data.get("traceparent")), time_s)
                while len(self._contexts) > CONTEXT_CACHE:
                    self._contexts.popitem(last=False)
            return
        if dst == "queued":
            live.queued_at_s = time_s
        if src in ACTIVE and dst != "running":
            ended = data.get("attempt")
            for (jid, att), _span in list(self._attempts.items()):
                if jid == job_id and (ended is None or att == ended):
                    self._end_attempt(jid, att, str(dst), reason, time_s)
        if dst == "preempted":
            self.metrics.preemptions.inc()
        parent, submitted_s = self.job_context(job_id)
        if src == "pending" and parent is not None:
            attrs["trainyard.outcome"] = str(dst)
            error = None if dst == "queued" else reason
            self._span("job.admit", parent, submitted_s or time_s, time_s, attrs, error)
        if dst in TERMINAL:
            self.metrics.finished.labels(str(dst)).inc()
            for (jid, att), _span in list(self._attempts.items()):
                if jid == job_id:
                    self._end_attempt(jid, att, str(dst), reason, time_s)
            if parent is not None:
                attrs.update({"trainyard.state": str(dst), "trainyard.reason": reason[:500]})
                self._span("job.complete", parent, time_s, time_s, attrs, None if dst != "failed" else reason)
            self.live.pop(job_id, None)
            with self._lock:
                self._contexts.pop(job_id, None)

    def prune(self, open_job_ids: set[str]) -> None:
        """Forget the live values of jobs that are no longer open (their series go with them)."""
        for jid in [j for j in self.live if j not in open_job_ids]:
            self.live.pop(jid, None)


def _attr_value(v: Any) -> Any:
    if isinstance(v, bool | int | float):
        return v
    if isinstance(v, str):
        return v[:MAX_ATTRIBUTE_CHARS]
    return None


def decode_worker_span(doc: dict[str, Any], resource: Resource) -> ReadableSpan | None:
    """A finished span from a worker's ``span`` event (``runtime.tracing.span_document``), or None."""
    try:
        trace_id = int(str(doc["trace_id"]), 16)
        span_id = int(str(doc["span_id"]), 16)
        parent_id = int(str(doc["parent_span_id"]), 16) if doc.get("parent_span_id") else None
        start_ns, end_ns = int(doc["start_ns"]), int(doc["end_ns"])
        name = str(doc["name"])[:200]
    except (KeyError, TypeError, ValueError):
        return None
    if not trace_id or not span_id or end_ns < start_ns:
        return None
    attributes: dict[str, Any] = {}
    for k, v in list((doc.get("attributes") or {}).items())[:MAX_SPAN_ATTRIBUTES]:
        value = _attr_value(v)
        if value is not None:
            attributes[str(k)[:200]] = value
    ctx = SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    parent = (
        SpanContext(trace_id, parent_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        if parent_id
        else None
    )
    status = (
        Status(StatusCode.ERROR, str(doc.get("status_message") or "")[:500])
        if doc.get("status") == "error"
        else Status(StatusCode.UNSET)
    )
    host = doc.get("host")
    res = resource.merge(Resource({"host.name": str(host)})) if host else resource
    return ReadableSpan(
        name=name,
        context=ctx,
        parent=parent,
        resource=res,
        attributes=attributes,
        kind=SpanKind.INTERNAL,
        status=status,
        start_time=start_ns,
        end_time=end_ns,
        instrumentation_scope=WORKER_SCOPE,
    )


class TracedRound:
    """Wraps a ScheduleRound: round metrics always; a ``scheduler.round`` span only for a round that
    placed or migrated a job, or failed (an idle round exports nothing)."""

    def __init__(self, inner: Any, tracer: Tracer | None, metrics: ControlLoopMetrics) -> None:
        self.inner = inner
        self.tracer = tracer
        self.metrics = metrics

    def __call__(self, jobs: Sequence[Any], pools: Sequence[Any], now_s: float) -> Any:
        started = time.perf_counter()
        started_ns = time.time_ns()
        try:
            result = self.inner(jobs, pools, now_s)
        except BaseException as exc:
            self.metrics.round_errors.inc()
            self.metrics.rounds.inc()
            self.metrics.round_duration.observe(time.perf_counter() - started)
            if self.tracer is not None:
                span = self.tracer.start_span("scheduler.round", start_time=started_ns)
                span.set_attribute("trainyard.jobs", len(jobs))
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                span.end()
            raise
        self.metrics.rounds.inc()
        self.metrics.round_duration.observe(time.perf_counter() - started)
        self.metrics.placed.inc(len(result.placements))
        self.metrics.last_queued.set(len(jobs))
        self.metrics.last_unplaced.set(len(result.unplaced))
        migrations = getattr(result, "migrations", None) or {}
        if self.tracer is not None and (result.placements or migrations):
            span = self.tracer.start_span(
                "scheduler.round",
                start_time=started_ns,
                attributes={
                    "trainyard.jobs": len(jobs),
                    "trainyard.pools": len(pools),
                    "trainyard.placed": len(result.placements),
                    "trainyard.unplaced": len(result.unplaced),
                    "trainyard.migrations": len(migrations),
                },
            )
            span.end()
        return result


class TracedExecutor:
    """Wraps an Executor: each launch opens the attempt's span, hands its context to the workers and
    records an ``executor.launch`` span and launch metrics; ``poll`` takes the workers' ``span`` events
    out of the stream and exports them. Everything else passes through."""

    def __init__(
        self,
        inner: Any,
        tracer: Tracer | None,
        metrics: ControlLoopMetrics,
        telemetry: JobTelemetry | None = None,
    ) -> None:
        self.inner = inner
        self.tracer = tracer
        self.metrics = metrics
        self.telemetry = telemetry

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
        attempt = self.telemetry.start_attempt(req) if self.telemetry is not None else None
        parent = trace.set_span_in_context(attempt) if attempt is not None else None
        try:
            if self.tracer is None:
                workers = self.inner.launch(req)
            else:
                with self.tracer.start_as_current_span(
                    "executor.launch", context=parent, attributes=attrs
                ) as sp:
                    if attempt is not None:
                        tp = format_traceparent(attempt.get_span_context())
                        if tp is not None:
                            env = {**req.env, TRACEPARENT_ENV: tp, TRACEPARENT_ENV_ALIAS: tp}
                            req = replace(req, env=env)
                    workers = self.inner.launch(req)
                    sp.set_attribute("trainyard.workers", len(workers))
        except BaseException as exc:
            self.metrics.launches.labels("error").inc()
            if attempt is not None:
                attempt.record_exception(exc)
            raise
        finally:
            self.metrics.launch_duration.observe(time.perf_counter() - started)
        self.metrics.launches.labels("ok").inc()
        return workers

    def poll(self) -> list[Any]:
        events = self.inner.poll()
        if not any(ev.kind == "span" for ev in events):
            return list(events)
        out = []
        for ev in events:
            if ev.kind != "span":
                out.append(ev)
            elif self.telemetry is not None:
                self.telemetry.worker_span(ev.job_id, ev.attempt, ev.data)
        return out
