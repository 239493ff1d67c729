"""Observability: Prometheus metrics (HTTP ones live in the API middleware; jobs, pools, scheduler,
launches and alerts here), OpenTelemetry traces and alert rules.

:func:`install_observability` wires them into an app built by ``trainyard.api.app.create_app``.
"""

from __future__ import annotations

from typing import Any

from trainyard.observability.alerts import Alert, AlertThresholds, evaluate
from trainyard.observability.metrics import ControlLoopMetrics, PlatformCollector
from trainyard.observability.tracing import (
    ObservabilitySettings,
    TracedExecutor,
    TracedRound,
    TracingMiddleware,
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
    """Register the store-backed metrics and the control-loop metrics on the app's Prometheus registry,
    add the request-tracing middleware, and wrap the platform's scheduling round and executor so that
    rounds and launches are traced and counted. Sets ``app.state.evaluate_alerts`` (a call returning the
    alerts firing now, optionally for one tenant id only) and ``app.state.trace_buffer`` (the in-memory
    span buffer or None)."""
    from trainyard.observability import snapshot

    registry = app.state.metrics.registry
    clock = platform.options.clock
    registry.register(PlatformCollector(platform, clock, thresholds))
    loop_metrics = ControlLoopMetrics(registry)
    provider, buffer = make_tracer_provider(settings)
    tracer = provider.get_tracer("trainyard") if provider is not None else None
    app.state.tracer_provider = provider
    app.state.trace_buffer = buffer
    app.state.control_loop_metrics = loop_metrics
    if tracer is not None:
        app.add_middleware(TracingMiddleware, tracer=tracer)
    sup = getattr(platform, "supervisor", None)
    if sup is not None:
        if not isinstance(sup.schedule_round, TracedRound):
            sup.schedule_round = TracedRound(sup.schedule_round, tracer, loop_metrics)
        else:  # a second app over the same platform: report to the newest registry
            sup.schedule_round.tracer, sup.schedule_round.metrics = tracer, loop_metrics
        if not isinstance(sup.executor, TracedExecutor):
            sup.executor = TracedExecutor(sup.executor, tracer, loop_metrics)
        else:
            sup.executor.tracer, sup.executor.metrics = tracer, loop_metrics

    def evaluate_alerts(tenant_id: str | None = None) -> list[Alert]:
        return evaluate(snapshot.take(platform, clock(), tenant_id).open_jobs, thresholds)

    app.state.evaluate_alerts = evaluate_alerts
