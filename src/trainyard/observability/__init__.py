"""Observability: Prometheus metrics (HTTP ones live in the API middleware; jobs, pools, budgets, the
training series of running jobs, the control loop and serving here), OpenTelemetry traces (one per job,
carried into the workers; the request middleware of ``observability.tracing``, OpenTelemetry's own
SQLAlchemy (opt-in) and httpx instrumentation), structured
logs (``observability.logging``) and alert rules (``observability.alerts`` for the built-in evaluation,
``observability.rules`` for Prometheus).

:func:`install_observability` wires them into an app built by ``trainyard.api.app.create_app``.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import GCCollector, ProcessCollector
from prometheus_client import PlatformCollector as PythonPlatformCollector

from trainyard.observability.alerts import Alert, AlertThresholds, evaluate
from trainyard.observability.jobtrace import JobTelemetry, TracedExecutor, TracedRound
from trainyard.observability.metrics import (
    ControlLoopMetrics,
    PlatformCollector,
    ServingMetrics,
    TrainingMetrics,
)
from trainyard.observability.tracing import (
    ObservabilitySettings,
    drops_children_of_unsampled,
    instrument_app,
    instrument_engine,
    instrument_httpx,
    make_tracer_provider,
)

__all__ = ["install_observability"]


def install_observability(
    app: Any,
    platform: Any,
    *,
    settings: ObservabilitySettings | None = None,
    thresholds: AlertThresholds | None = None,
) -> None:
    """Register the process, Python, store-backed, training, control-loop and serving metrics on the
    app's Prometheus registry; trace requests, statements and outgoing calls with OpenTelemetry's
    instrumentation; trace each job (``observability.jobtrace``) by wrapping the platform's scheduling
    round and executor and following the job events after each tick. Sets ``app.state.evaluate_alerts``
    (a call returning the alerts firing now, optionally for one tenant id only), ``app.state.trace_buffer``
    (the in-memory span buffer or None) and ``app.state.tracer_provider``."""
    from trainyard.observability import snapshot

    cfg = settings or ObservabilitySettings()
    registry = app.state.metrics.registry
    ProcessCollector(registry=registry)
    PythonPlatformCollector(registry=registry)
    GCCollector(registry=registry)
    clock = platform.options.clock
    provider, buffer = make_tracer_provider(cfg)
    tracer = provider.get_tracer("trainyard") if provider is not None else None
    training = TrainingMetrics(registry)
    telemetry = JobTelemetry(
        platform.db, tracer, provider, training, cfg.service_name(), keep_errors=cfg.trace_keep_errors
    )
    registry.register(
        PlatformCollector(
            platform,
            clock,
            thresholds,
            telemetry=telemetry,
            max_job_series=platform.settings.metrics_max_job_series,
        )
    )
    executor = platform.options.executor
    if executor is not None and hasattr(executor, "cluster_state"):  # the Ray executor's cluster
        from trainyard.observability.ray_metrics import RayClusterCollector

        registry.register(RayClusterCollector(executor))
    loop_metrics = ControlLoopMetrics(registry)
    serving = ServingMetrics(registry)
    app.state.tracer_provider = provider
    app.state.trace_buffer = buffer
    app.state.control_loop_metrics = loop_metrics
    app.state.job_telemetry = telemetry
    if provider is not None:
        instrument_app(app, provider, cfg)
        instrument_engine(platform.db, provider, enabled=cfg.trace_db_statements)
    platform.jobs.tracer = tracer
    alerts = getattr(platform, "alerts", None)
    if alerts is not None:
        alerts.tracer = tracer
        alerts.client_hook = (
            (lambda client: instrument_httpx(client, provider)) if provider is not None else None
        )
    gateway = getattr(platform, "serving_gateway", None)
    if gateway is not None:
        gateway.tracer = tracer
        gateway.skip_unsampled = drops_children_of_unsampled(provider)
        gateway.observe = serving.observe
    sup = getattr(platform, "supervisor", None)
    if sup is not None:
        if not isinstance(sup.schedule_round, TracedRound):
            sup.schedule_round = TracedRound(sup.schedule_round, tracer, loop_metrics)
        else:  # a second app over the same platform: report to the newest registry
            sup.schedule_round.tracer, sup.schedule_round.metrics = tracer, loop_metrics
        if not isinstance(sup.executor, TracedExecutor):
            sup.executor = TracedExecutor(sup.executor, tracer, loop_metrics, telemetry)
        else:
            sup.executor.tracer, sup.executor.metrics = tracer, loop_metrics
            sup.executor.telemetry = telemetry
        sup.observers[:] = [
            o for o in sup.observers if not isinstance(getattr(o, "__self__", None), JobTelemetry)
        ]
        sup.observers.append(telemetry.tick)

    def evaluate_alerts(tenant_id: str | None = None) -> list[Alert]:
        return evaluate(
            snapshot.take(platform, clock(), tenant_id, open_jobs_only=True).open_jobs, thresholds
        )

    app.state.evaluate_alerts = evaluate_alerts
