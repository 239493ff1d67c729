"""Alert rules, the span buffer, tracing configuration and the traced scheduling round / executor."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from trainyard.errors import ServiceUnavailableError
from trainyard.observability.alerts import CRITICAL, RULES, WARNING, AlertThresholds, JobHealth, evaluate
from trainyard.observability.jobtrace import TracedExecutor, TracedRound
from trainyard.observability.metrics import ControlLoopMetrics
from trainyard.observability.tracing import ObservabilitySettings, make_tracer_provider


def health(**kw: Any) -> JobHealth:
    base: dict[str, Any] = {
        "job_id": "job-1",
        "tenant_id": "tn-1",
        "tenant_name": "t",
        "name": "j",
        "state": "running",
        "attempt": 1,
        "failures": 0,
        "preemptions": 0,
        "last_report_age_s": 5.0,
        "cost_usd": 1.0,
        "budget_usd": None,
    }
    return JobHealth(**{**base, **kw})


def rules(alerts: list[Any]) -> set[tuple[str, str]]:
    return {(a.rule, a.severity) for a in alerts}


def test_healthy_job_fires_nothing() -> None:
    assert evaluate([health()]) == []
    assert evaluate([]) == []


def test_repeated_failures_warn_then_page() -> None:
    t = AlertThresholds(failures_warning=2, failures_critical=4)
    assert evaluate([health(failures=1)], t) == []
    assert rules(evaluate([health(failures=2)], t)) == {("job_failing_repeatedly", WARNING)}
    assert rules(evaluate([health(failures=4, state="queued")], t)) == {("job_failing_repeatedly", CRITICAL)}


def test_heartbeat_missed_only_for_running_jobs() -> None:
    t = AlertThresholds(heartbeat_timeout_s=300)
    assert evaluate([health(last_report_age_s=299)], t) == []
    assert rules(evaluate([health(last_report_age_s=301)], t)) == {("heartbeat_missed", WARNING)}
    assert rules(evaluate([health(last_report_age_s=901)], t)) == {("heartbeat_missed", CRITICAL)}
    assert evaluate([health(state="queued", last_report_age_s=10_000)], t) == []
    assert rules(evaluate([health(state="starting", last_report_age_s=10_000)], t)) == {
        ("stuck_starting", WARNING)
    }


def test_budget_burn() -> None:
    assert evaluate([health(cost_usd=7.9, budget_usd=10)]) == []
    a = evaluate([health(cost_usd=8.0, budget_usd=10)])
    assert rules(a) == {("budget_burn", WARNING)} and a[0].value == pytest.approx(0.8)
    assert rules(evaluate([health(cost_usd=12, budget_usd=10)])) == {("budget_burn", CRITICAL)}


@settings(max_examples=60, deadline=None)
@given(
    failures=st.integers(0, 10),
    age=st.none() | st.floats(0, 1e5),
    cost=st.floats(0, 1e4),
    budget=st.none() | st.floats(0.01, 1e4),
    state=st.sampled_from(["pending", "queued", "starting", "running", "preempted"]),
)
def test_alerts_are_well_formed_and_sorted(
    failures: int, age: float | None, cost: float, budget: float | None, state: str
) -> None:
    alerts = evaluate(
        [health(failures=failures, last_report_age_s=age, cost_usd=cost, budget_usd=budget, state=state)]
    )
    assert all(a.rule in RULES and a.severity in (WARNING, CRITICAL) and a.job_id == "job-1" for a in alerts)
    sev = [a.severity == CRITICAL for a in alerts]
    assert sev == sorted(sev, reverse=True)  # critical first
    assert len({a.rule for a in alerts}) == len(alerts)  # one alert per rule and job


def test_ring_buffer_keeps_the_latest_spans() -> None:
    provider, buf = make_tracer_provider(ObservabilitySettings(trace_exporter="memory", trace_buffer_spans=3))
    assert provider is not None and buf is not None
    tracer = provider.get_tracer("t")
    for i in range(5):
        with tracer.start_as_current_span(f"s{i}"):
            pass
    assert [s.name for s in buf.spans()] == ["s2", "s3", "s4"]
    assert [s.name for s in buf.spans("s3")] == ["s3"]
    buf.clear()
    assert buf.spans() == []


def test_tracing_can_be_off_or_console(monkeypatch: pytest.MonkeyPatch) -> None:
    assert make_tracer_provider(ObservabilitySettings(trace_exporter="none")) == (None, None)
    provider, buf = make_tracer_provider(ObservabilitySettings(trace_exporter="console"))
    assert provider is not None and buf is None
    provider.shutdown()
    monkeypatch.setenv("TRAINYARD_TRACE_EXPORTER", "none")
    assert ObservabilitySettings().trace_exporter == "none"


def test_otlp_without_its_package_is_a_clear_error() -> None:
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
    except ImportError:
        with pytest.raises(ServiceUnavailableError, match="OTLP"):
            make_tracer_provider(ObservabilitySettings(trace_exporter="otlp"))
    else:
        provider, _ = make_tracer_provider(ObservabilitySettings(trace_exporter="otlp"))
        assert provider is not None


@dataclass
class Result:
    placements: dict[str, Any]
    unplaced: dict[str, str]


@dataclass
class Round:
    fail: bool = False
    calls: list[int] = field(default_factory=list)

    def __call__(self, jobs: Any, pools: Any, now_s: float) -> Result:
        self.calls.append(len(jobs))
        if self.fail:
            raise RuntimeError("solver exploded")
        return Result({"a": object()}, {"b": "waiting for capacity"})


def sample(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float:
    v = registry.get_sample_value(name, labels or {})
    return 0.0 if v is None else v


def test_traced_round_counts_and_spans() -> None:
    reg = CollectorRegistry()
    m = ControlLoopMetrics(reg)
    provider, buf = make_tracer_provider(ObservabilitySettings(trace_exporter="memory"))
    assert provider is not None and buf is not None
    inner = Round()
    traced = TracedRound(inner, provider.get_tracer("t"), m)
    res = traced(["a", "b"], ["p"], 0.0)
    assert res.placements and inner.calls == [2]
    assert sample(reg, "trainyard_scheduler_rounds_total") == 1
    assert sample(reg, "trainyard_scheduler_placements_total") == 1
    assert sample(reg, "trainyard_scheduler_last_round_unplaced") == 1
    assert sample(reg, "trainyard_scheduler_round_duration_seconds_count") == 1
    (span,) = buf.spans("scheduler.round")
    assert span.attributes is not None and span.attributes["trainyard.jobs"] == 2
    inner.fail = True
    with pytest.raises(RuntimeError):
        traced(["a"], [], 0.0)
    assert sample(reg, "trainyard_scheduler_round_errors_total") == 1
    assert sample(reg, "trainyard_scheduler_rounds_total") == 2
    failed = buf.spans("scheduler.round")[-1]
    assert not failed.status.is_ok


@dataclass
class Req:
    job_id: str = "job-1"
    attempt: int = 1
    world_size: int = 2
    pool: str = "p"
    market: str = "spot"


class Exec:
    name = "scripted"

    def __init__(self) -> None:
        self.fail = False

    def launch(self, req: Req) -> list[int]:
        if self.fail:
            raise RuntimeError("no capacity")
        return list(range(req.world_size))

    def poll(self) -> list[Any]:
        return []


def test_traced_executor_passes_through_and_counts_launches() -> None:
    reg = CollectorRegistry()
    m = ControlLoopMetrics(reg)
    provider, buf = make_tracer_provider(ObservabilitySettings(trace_exporter="memory"))
    assert provider is not None and buf is not None
    inner = Exec()
    ex = TracedExecutor(inner, provider.get_tracer("t"), m)
    assert ex.name == "scripted" and ex.poll() == []
    assert ex.launch(Req()) == [0, 1]
    inner.fail = True
    with pytest.raises(RuntimeError):
        ex.launch(Req(job_id="job-2"))
    assert sample(reg, "trainyard_executor_launches_total", {"outcome": "ok"}) == 1
    assert sample(reg, "trainyard_executor_launches_total", {"outcome": "error"}) == 1
    spans = buf.spans("executor.launch")
    assert [s.attributes["trainyard.job_id"] for s in spans if s.attributes] == ["job-1", "job-2"]


def test_store_collector_reports_down_instead_of_failing_the_scrape() -> None:
    from prometheus_client import generate_latest

    from trainyard.observability.metrics import PlatformCollector

    class BrokenDb:
        def session(self) -> Any:
            raise ConnectionError("database is away")

    class P:
        db = BrokenDb()

    reg = CollectorRegistry()
    reg.register(PlatformCollector(P(), clock=lambda: 0.0))
    text = generate_latest(reg).decode()
    assert "trainyard_store_metrics_up 0.0" in text


# ---- OpenTelemetry configuration ------------------------------------------------------------------

OTEL_VARS = (
    "TRAINYARD_TRACE_EXPORTER",
    "TRAINYARD_TRACE_OTLP_ENDPOINT",
    "OTEL_TRACES_EXPORTER",
    "OTEL_SDK_DISABLED",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "TRAINYARD_TRACE_DB_STATEMENTS",
    "TRAINYARD_TRACE_KEEP_ERRORS",
    "TRAINYARD_TRACE_KEEP_SLOWER_THAN_S",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in OTEL_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_otel_variables_configure_tracing_and_trainyard_ones_win(clean_env: pytest.MonkeyPatch) -> None:
    from trainyard.errors import InvalidInputError

    assert ObservabilitySettings().exporters() == ["memory"]
    clean_env.setenv("OTEL_TRACES_EXPORTER", "otlp, console")
    assert ObservabilitySettings().exporters() == ["otlp", "console"]
    clean_env.setenv("TRAINYARD_TRACE_EXPORTER", "memory")
    assert ObservabilitySettings().exporters() == ["memory"]
    clean_env.delenv("TRAINYARD_TRACE_EXPORTER")
    clean_env.setenv("OTEL_TRACES_EXPORTER", "none")
    assert make_tracer_provider() == (None, None)
    clean_env.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with pytest.raises(InvalidInputError, match="OTEL_TRACES_EXPORTER"):
        ObservabilitySettings().exporters()
    clean_env.setenv("OTEL_TRACES_EXPORTER", "console")
    clean_env.setenv("OTEL_SDK_DISABLED", "true")
    assert ObservabilitySettings().exporters() == []


def test_otlp_endpoint_resolution(clean_env: pytest.MonkeyPatch) -> None:
    assert ObservabilitySettings().otlp_endpoint() == "http://127.0.0.1:4318/v1/traces"
    clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    assert ObservabilitySettings().otlp_endpoint() == "http://collector:4318/v1/traces"
    clean_env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4318/custom")
    assert ObservabilitySettings().otlp_endpoint() == "http://traces:4318/custom"
    clean_env.setenv("TRAINYARD_TRACE_OTLP_ENDPOINT", "http://mine:4318/v1/traces")
    assert ObservabilitySettings().otlp_endpoint() == "http://mine:4318/v1/traces"
    clean_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    with pytest.raises(ServiceUnavailableError, match="grpc is not supported"):
        make_tracer_provider(ObservabilitySettings(trace_exporter="otlp"))


def test_service_name_and_sampler_from_otel_variables(clean_env: pytest.MonkeyPatch) -> None:
    from trainyard.errors import InvalidInputError

    provider, _ = make_tracer_provider()
    assert provider is not None and provider.resource.attributes["service.name"] == "trainyard"
    clean_env.setenv("OTEL_SERVICE_NAME", "yard-eu")
    clean_env.setenv("OTEL_TRACES_SAMPLER", "always_off")
    provider, buf = make_tracer_provider()
    assert provider is not None and buf is not None
    assert provider.resource.attributes["service.name"] == "yard-eu"
    with provider.get_tracer("t").start_as_current_span("dropped"):
        pass
    assert buf.spans() == []
    clean_env.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    clean_env.setenv("OTEL_TRACES_SAMPLER_ARG", "lots")
    with pytest.raises(InvalidInputError, match="OTEL_TRACES_SAMPLER_ARG"):
        make_tracer_provider()


def test_the_default_sampler_keeps_a_share_of_traces_decided_at_the_root(
    clean_env: pytest.MonkeyPatch,
) -> None:
    from opentelemetry.trace import SpanKind

    from trainyard.observability.tracing import DEFAULT_SAMPLE_RATIO

    provider, buf = make_tracer_provider()
    assert provider is not None and buf is not None
    assert DEFAULT_SAMPLE_RATIO < 1
    desc = provider.sampler.get_description()
    assert "ParentBased" in desc and f"TraceIdRatioBased{{{DEFAULT_SAMPLE_RATIO}}}" in desc, desc
    tracer = provider.get_tracer("t")
    n = 2000
    for i in range(n):
        with (
            tracer.start_as_current_span(f"root-{i}", kind=SpanKind.SERVER),
            tracer.start_as_current_span("child"),
        ):
            pass
    roots = [s for s in buf.spans() if s.name.startswith("root-")]
    children = buf.spans("child")
    # a trace is kept whole or not at all
    assert {s.context.trace_id for s in children} == {s.context.trace_id for s in roots}
    assert abs(len(roots) / n - DEFAULT_SAMPLE_RATIO) < 0.05, len(roots)
    # OTEL_TRACES_SAMPLER_ARG alone sets the default sampler's ratio; a ratio sampler named without an
    # argument keeps every trace (the specification's default)
    clean_env.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    provider, _ = make_tracer_provider()
    assert provider is not None and "TraceIdRatioBased{0.5}" in provider.sampler.get_description()
    clean_env.delenv("OTEL_TRACES_SAMPLER_ARG")
    clean_env.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    provider, _ = make_tracer_provider()
    assert provider is not None and "TraceIdRatioBased{1.0}" in provider.sampler.get_description()


def test_client_spans_without_a_parent_are_dropped(clean_env: pytest.MonkeyPatch) -> None:
    from opentelemetry.trace import SpanKind

    clean_env.setenv("OTEL_TRACES_SAMPLER", "always_on")
    provider, buf = make_tracer_provider()
    assert provider is not None and buf is not None
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("SELECT orphan", kind=SpanKind.CLIENT):
        pass
    with (
        tracer.start_as_current_span("GET /thing", kind=SpanKind.SERVER),
        tracer.start_as_current_span("SELECT child", kind=SpanKind.CLIENT),
    ):
        pass
    assert sorted(s.name for s in buf.spans()) == ["GET /thing", "SELECT child"]


def test_idle_or_empty_rounds_emit_no_span() -> None:
    reg = CollectorRegistry()
    provider, buf = make_tracer_provider(ObservabilitySettings(trace_exporter="memory"))
    assert provider is not None and buf is not None

    def nothing_placed(jobs: Any, pools: Any, now_s: float) -> Result:
        return Result({}, {"b": "waiting for capacity"})

    traced = TracedRound(nothing_placed, provider.get_tracer("t"), ControlLoopMetrics(reg))
    for _ in range(5):
        traced(["b"], ["p"], 0.0)
    assert buf.spans() == []
    assert sample(reg, "trainyard_scheduler_rounds_total") == 5  # still counted


def test_traceparent_round_trip_and_malformed_values() -> None:
    from trainyard.tracecontext import format_traceparent, parse_traceparent

    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    ctx = parse_traceparent(tp)
    assert ctx is not None and ctx.is_remote and ctx.trace_flags.sampled
    assert format_traceparent(ctx) == tp
    for bad in (
        None,
        "",
        "garbage",
        "00-" + "0" * 32 + "-00f067aa0ba902b7-01",
        "ff-" + tp[3:],
        "00-zz-yy-01",
    ):
        assert parse_traceparent(bad) is None, bad


def test_worker_span_documents_are_checked() -> None:
    from opentelemetry.sdk.resources import Resource

    from trainyard.observability.jobtrace import decode_worker_span

    res = Resource({"service.name": "w"})
    good = {
        "name": "train.steps",
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "span_id": "00f067aa0ba902b7",
        "parent_span_id": "00f067aa0ba902b8",
        "start_ns": 10,
        "end_ns": 20,
        "attributes": {"a": 1, "b": "x" * 5000, "c": {"nested": True}},
        "status": "error",
        "status_message": "boom",
        "host": "node-1",
    }
    span = decode_worker_span(good, res)
    assert span is not None and span.parent is not None and span.parent.span_id == 0x00F067AA0BA902B8
    assert span.attributes == {"a": 1, "b": "x" * 1024}  # no nested values, long strings cut
    assert not span.status.is_ok and span.resource.attributes["host.name"] == "node-1"
    for broken in ({**good, "trace_id": "0" * 32}, {**good, "end_ns": 5}, {**good, "span_id": "nothex"}, {}):
        assert decode_worker_span(broken, res) is None


def test_the_sandbox_passes_the_trace_context_and_nothing_else_new() -> None:
    from trainyard.executors.sandbox import scrubbed_env

    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    env = scrubbed_env(
        {"TRAINYARD_DATABASE_URL": "postgresql://x", "OTEL_EXPORTER_OTLP_HEADERS": "api-key=secret"},
        {"TRACEPARENT": tp, "TRAINYARD_TRACEPARENT": tp},
    )
    assert env["TRACEPARENT"] == tp and env["TRAINYARD_TRACEPARENT"] == tp
    assert "TRAINYARD_DATABASE_URL" not in env and "OTEL_EXPORTER_OTLP_HEADERS" not in env
