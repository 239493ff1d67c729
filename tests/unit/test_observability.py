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
