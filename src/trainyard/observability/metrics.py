"""Prometheus metrics beyond the HTTP ones: jobs per tenant and state, cost, pool capacity, heartbeat
ages, firing alerts (computed from the store at scrape time) and scheduler rounds and launches (counted
as they happen)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from trainyard.observability import snapshot as snap
from trainyard.observability.alerts import RULES, AlertThresholds, evaluate
from trainyard.services.lifecycle import JobState

log = structlog.get_logger("trainyard.metrics")


class ControlLoopMetrics:
    """Counters and histograms the traced scheduler round and executor update."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.rounds = Counter("trainyard_scheduler_rounds_total", "Scheduling rounds run", registry=registry)
        self.round_errors = Counter(
            "trainyard_scheduler_round_errors_total", "Scheduling rounds that raised", registry=registry
        )
        self.round_duration = Histogram(
            "trainyard_scheduler_round_duration_seconds",
            "Wall time of one scheduling round",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.placed = Counter(
            "trainyard_scheduler_placements_total", "Jobs placed by scheduling rounds", registry=registry
        )
        self.last_queued = Gauge(
            "trainyard_scheduler_last_round_jobs", "Queued jobs the last round considered", registry=registry
        )
        self.last_unplaced = Gauge(
            "trainyard_scheduler_last_round_unplaced", "Jobs the last round left unplaced", registry=registry
        )
        self.launches = Counter(
            "trainyard_executor_launches_total", "Gang launches by outcome", ["outcome"], registry=registry
        )
        self.launch_duration = Histogram(
            "trainyard_executor_launch_duration_seconds",
            "Wall time of one launch call",
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=registry,
        )


class PlatformCollector(Collector):
    """Gauges read from the store on every scrape."""

    def __init__(
        self,
        platform: Any,
        clock: Callable[[], float],
        thresholds: AlertThresholds | None = None,
    ) -> None:
        self.platform = platform
        self.clock = clock
        self.thresholds = thresholds or AlertThresholds()

    def describe(self) -> list[Any]:
        return []  # collected lazily; nothing is read at registration time

    def collect(self) -> Iterator[Any]:
        up = GaugeMetricFamily(
            "trainyard_store_metrics_up", "1 when the store-backed gauges could be read on this scrape"
        )
        try:
            s = snap.take(self.platform, self.clock())
        except Exception as exc:  # a scrape must not fail because the database is away
            log.warning("metrics_snapshot_failed", error_type=type(exc).__name__, error=str(exc)[:300])
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        jobs = GaugeMetricFamily(
            "trainyard_tenant_jobs", "Jobs by tenant and state", labels=["tenant", "state"]
        )
        for tid, name in sorted(s.tenants.items(), key=lambda kv: kv[1]):
            for st in JobState:
                jobs.add_metric([name, st.value], s.jobs_by_tenant_state.get((tid, st.value), 0))
        yield jobs
        cost = GaugeMetricFamily(
            "trainyard_tenant_cost_usd", "Dollars of finished attempts (closed) per tenant", labels=["tenant"]
        )
        for tid, name in sorted(s.tenants.items(), key=lambda kv: kv[1]):
            cost.add_metric([name], s.cost_usd_by_tenant.get(tid, 0.0))
        yield cost
        queued = GaugeMetricFamily("trainyard_scheduler_queue_depth", "Jobs waiting in the queue")
        queued.add_metric([], sum(n for (_, st), n in s.jobs_by_tenant_state.items() if st == "queued"))
        yield queued
        devices = GaugeMetricFamily(
            "trainyard_pool_devices",
            "Pool devices by kind (total, available, in_use)",
            labels=["pool", "kind"],
        )
        price = GaugeMetricFamily(
            "trainyard_pool_price_usd_per_device_hour", "Pool price per device-hour", labels=["pool"]
        )
        for p in s.pool_devices:
            for kind in ("total", "available", "in_use"):
                devices.add_metric([p["pool"], kind], p[kind])
            if p["price"] is not None:
                price.add_metric([p["pool"]], float(p["price"]))
        yield devices
        yield price
        age = GaugeMetricFamily(
            "trainyard_job_last_report_age_seconds",
            "Seconds since a running job's last heartbeat (or its start)",
            labels=["job_id", "tenant"],
        )
        running_cost = GaugeMetricFamily(
            "trainyard_job_cost_usd", "Cost so far of an open job", labels=["job_id", "tenant"]
        )
        for j in s.open_jobs:
            if j.last_report_age_s is not None:
                age.add_metric([j.job_id, j.tenant_name], j.last_report_age_s)
            running_cost.add_metric([j.job_id, j.tenant_name], j.cost_usd)
        yield age
        yield running_cost
        firing = GaugeMetricFamily(
            "trainyard_alerts_firing", "Alerts firing now by rule and severity", labels=["rule", "severity"]
        )
        alerts = evaluate(s.open_jobs, self.thresholds)
        for rule in RULES:
            for sev in ("warning", "critical"):
                firing.add_metric([rule, sev], sum(1 for a in alerts if a.rule == rule and a.severity == sev))
        yield firing
