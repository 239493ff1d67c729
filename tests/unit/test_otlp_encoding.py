"""The span encoder of observability.otlp against opentelemetry's own: decoded with the library's message
classes, its request equals the library's for spans with every kind of field."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from trainyard.observability import otlp
from trainyard.observability.otlp import encode_request


def same_as_library(spans: list[ReadableSpan]) -> ExportTraceServiceRequest:
    ours = ExportTraceServiceRequest.FromString(encode_request(spans))
    theirs = encode_spans(spans)
    assert ours == theirs
    return ours


def recorded_spans() -> list[ReadableSpan]:
    """Spans made by the SDK: attributes of every type, an exception event, links, a remote parent, a
    trace state, every kind, an error status, attributes dropped by the limits, two scopes."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource({"service.name": "trainyard", "n": 3}),
        span_limits=SpanLimits(max_span_attributes=20, max_events=2, max_links=1),
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    api = provider.get_tracer("trainyard.api", "1.2.3", schema_url="https://opentelemetry.io/schemas/1.21.0")
    plain = provider.get_tracer("trainyard")
    remote = SpanContext(
        0x4BF92F3577B34DA6A3CE929D0E0E4736,
        0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=TraceFlags(1),
        trace_state=TraceState([("vendor", "v1"), ("other", "x")]),
    )
    attrs: dict[str, Any] = {
        "http.request.method": "POST",
        "server.port": 8000,
        "negative": -5,
        "big": 2**62,
        "ratio": 0.25,
        "flag": True,
        "off": False,
        "empty": "",
        "zero": 0,
        "names": ("a", "b"),
        "numbers": [1, 2, 3],
        "floats": (0.5, -1.5),
        "unicode": "größe ✓",
    }
    with api.start_as_current_span(
        "POST /v1/jobs", context=set_span_in_context(NonRecordingSpan(remote)), kind=SpanKind.SERVER
    ) as server:
        server.set_attributes(attrs)
        with plain.start_as_current_span("job.submit", links=[Link(remote, {"why": "caller"})]) as sub:
            sub.set_attribute("trainyard.job_id", "job-1")
            try:
                raise RuntimeError("boom")
            except RuntimeError as exc:
                sub.record_exception(exc)
            sub.add_event("note", {"n": 1})
            sub.add_event("dropped")  # over max_events
            sub.set_status(Status(StatusCode.ERROR, "failed: boom"))
        for kind in (SpanKind.CLIENT, SpanKind.PRODUCER, SpanKind.CONSUMER):
            plain.start_span(f"kind-{kind.name}", kind=kind).end()
        many = plain.start_span("many attributes")
        many.set_attributes({f"k{i}": i for i in range(25)})  # 5 over the limit: dropped_attributes
        many.set_status(Status(StatusCode.OK))
        many.end()
    return list(exporter.get_finished_spans())


def test_the_request_equals_the_librarys_for_recorded_spans() -> None:
    spans = recorded_spans()
    req = same_as_library(spans)
    (rs,) = req.resource_spans
    assert {s.scope.name for s in rs.scope_spans} == {"trainyard.api", "trainyard"}
    assert sum(len(s.spans) for s in rs.scope_spans) == len(spans) == 6
    # the encoding of recurring attribute pairs is reused: the second time is the same bytes
    assert encode_request(spans) == encode_request(spans)


def test_groups_resources_by_value_and_spans_without_a_scope() -> None:
    ctx = SpanContext(1, 2, is_remote=False, trace_flags=TraceFlags(1))
    a = Resource({"service.name": "trainyard"}, schema_url="https://example.com/r")
    same_as_a = Resource({"service.name": "trainyard"}, schema_url="https://example.com/r")
    worker = Resource({"service.name": "trainyard-worker", "host.name": "h"})
    spans = [
        ReadableSpan("a", context=ctx, resource=a, start_time=1, end_time=2),
        ReadableSpan(
            "w",
            context=ctx,
            parent=SpanContext(1, 3, is_remote=False),
            resource=worker,
            attributes={"trainyard.rank": 0},
            events=[Event("e", {"x": "y"}, timestamp=5)],
            start_time=3,
            end_time=4,
            instrumentation_scope=InstrumentationScope("trainyard.runtime"),
        ),
        ReadableSpan("b", context=ctx, resource=same_as_a, start_time=5, end_time=6),
    ]
    req = same_as_library(spans)
    assert len(req.resource_spans) == 2
    # the same pair as a span's, an event's and a resource's attribute (each its own field number)
    pair = {"service.name": "trainyard"}
    shared = ReadableSpan(
        "p", context=ctx, resource=a, attributes=pair, events=[Event("e", pair, timestamp=7)], start_time=1
    )
    same_as_library([shared, shared])
    assert encode_request([]) == encode_spans([]).SerializePartialToString() == b""


def test_a_value_otlp_cannot_hold_leaves_out_that_attribute_only() -> None:
    ctx = SpanContext(1, 2, is_remote=False)
    span = ReadableSpan(
        "s",
        context=ctx,
        resource=Resource({}),
        attributes={"huge": 2**70, "ok": "yes"},
        start_time=1,
        end_time=2,
    )
    (kv,) = (
        ExportTraceServiceRequest.FromString(encode_request([span]))
        .resource_spans[0]
        .scope_spans[0]
        .spans[0]
        .attributes
    )
    assert kv.key == "ok" and kv.value.string_value == "yes"


scalars = st.one_of(
    st.text(max_size=20),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
)
values = st.one_of(
    scalars, st.lists(st.text(max_size=5), max_size=3), st.lists(st.integers(-100, 100), max_size=3)
)


@settings(max_examples=200, deadline=None)
@given(
    attrs=st.dictionaries(st.text(min_size=1, max_size=12), values, max_size=8),
    name=st.text(max_size=30),
    kind=st.sampled_from(list(SpanKind)),
    code=st.sampled_from(list(StatusCode)),
    message=st.one_of(st.none(), st.text(max_size=10)),
    times=st.tuples(st.integers(0, 2**63), st.integers(0, 2**63)),
    remote=st.booleans(),
)
def test_the_request_equals_the_librarys_for_any_span(
    attrs: dict[str, Any],
    name: str,
    kind: SpanKind,
    code: StatusCode,
    message: str | None,
    times: tuple[int, int],
    remote: bool,
) -> None:
    ctx = SpanContext(2**127 + 5, 2**63 + 7, is_remote=False, trace_flags=TraceFlags(1))
    parent = SpanContext(2**127 + 5, 9, is_remote=remote)
    status = Status(code, message if code is StatusCode.ERROR else None)
    span = ReadableSpan(
        name,
        context=ctx,
        parent=parent,
        resource=Resource({"service.name": "t"}),
        attributes=attrs,
        kind=kind,
        status=status,
        start_time=times[0],
        end_time=times[1],
    )
    same_as_library([span])


def test_the_pair_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(otlp, "_PAIR_CACHE_MAX", 10)
    otlp._pair_cache.clear()
    ctx = SpanContext(1, 2, is_remote=False)
    for i in range(50):
        span = ReadableSpan(
            "s", context=ctx, resource=Resource({}), attributes={"i": i}, start_time=1, end_time=2
        )
        same_as_library([span])
        assert len(otlp._pair_cache) <= 10
