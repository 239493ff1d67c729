"""Prometheus metrics beyond the HTTP ones.

- Read from the store on every scrape (:class:`PlatformCollector`): jobs per tenant and state, money
  (``*_usd_total`` counters), pool capacity, budgets, firing alerts, and the training series of each
  running job (step, step time, tokens/s, loss, MFU, memory, checkpoint duration, preemptions,
  restarts, heartbeat age) fed by the heartbeats and events the workers already send. A job's series
  exist while it is ``starting`` or ``running`` and are gone from the first scrape after it leaves;
  at most ``max_job_series`` jobs (newest first) get them, ``trainyard_job_series_dropped`` counts the
  rest.
- Counted as they happen: scheduler rounds and launches (:class:`ControlLoopMetrics`), checkpoints,
  preemptions, restarts and finished jobs (:class:`TrainingMetrics`), inference requests, tokens and
  latency per deployment and model version (:class:`ServingMetrics`, at most
  ``MAX_DEPLOYMENT_SERIES`` label sets; the rest are counted under ``deployment="(other)"``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from trainyard.observability import snapshot as snap
from trainyard.observability.alerts import RULES, AlertThresholds, evaluate
from trainyard.services.lifecycle import ACTIVE_STATES, JobState

log = structlog.get_logger("trainyard.metrics")

DEFAULT_MAX_JOB_SERIES = 500
MAX_DEPLOYMENT_SERIES = 1_000
ACTIVE = frozenset(st.value for st in ACTIVE_STATES)
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


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


class TrainingMetrics:
    """Counters and histograms fed by the job events (``observability.jobtrace.JobTelemetry``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.checkpoints = Counter(
            "trainyard_checkpoints_total", "Checkpoints committed by running jobs", registry=registry
        )
        self.checkpoint_duration = Histogram(
            "trainyard_checkpoint_duration_seconds",
            "Wall time of one checkpoint save, from staging to the committed manifest",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=registry,
        )
        self.checkpoint_failures = Counter(
            "trainyard_checkpoint_failures_total", "Checkpoint saves that failed", registry=registry
        )
        self.preemptions = Counter("trainyard_preemptions_total", "Attempts preempted", registry=registry)
        self.restarts = Counter(
            "trainyard_restarts_total",
            "Restarts after a failure, by classification (infra or user)",
            ["classification"],
            registry=registry,
        )
        self.finished = Counter(
            "trainyard_jobs_finished_total", "Jobs that reached a final state", ["state"], registry=registry
        )
        self.diverged = Counter(
            "trainyard_jobs_diverged_total",
            "Attempts that failed because the training loss became NaN or infinite",
            registry=registry,
        )


class ServingMetrics:
    """Inference requests, tokens and latency per tenant, deployment and model version."""

    def __init__(self, registry: CollectorRegistry, max_series: int = MAX_DEPLOYMENT_SERIES) -> None:
        labels = ["tenant", "deployment", "model_version"]
        self.requests = Counter(
            "trainyard_inference_requests_total",
            "Inference requests by outcome (HTTP status code) and route (primary, canary, shadow)",
            [*labels, "code", "route"],
            registry=registry,
        )
        self.tokens = Counter(
            "trainyard_inference_tokens_total",
            "Tokens processed, by kind (prompt or completion)",
            [*labels, "kind"],
            registry=registry,
        )
        self.latency = Histogram(
            "trainyard_inference_request_duration_seconds",
            "Latency of an inference request, from arrival to the last byte",
            labels,
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.ttft = Histogram(
            "trainyard_inference_time_to_first_token_seconds",
            "Time to the first streamed chunk",
            labels,
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.max_series = max_series
        self._seen: set[tuple[str, str, str]] = set()

    def _labels(self, tenant: str, deployment: str, version: str) -> tuple[str, str, str]:
        key = (tenant, deployment, version)
        if key in self._seen:
            return key
        if len(self._seen) >= self.max_series:
            return (tenant, "(other)", "(other)")
        self._seen.add(key)
        return key

    def observe(self, record: dict[str, Any]) -> None:
        """One metered request (the gateway's usage record)."""
        key = self._labels(
            str(record.get("tenant") or ""),
            str(record.get("deployment") or ""),
            str(record.get("model_version") or ""),
        )
        route = str(record.get("route") or "primary")
        self.requests.labels(*key, str(int(record.get("status") or 0)), route).inc()
        self.tokens.labels(*key, "prompt").inc(int(record.get("prompt_tokens") or 0))
        self.tokens.labels(*key, "completion").inc(int(record.get("completion_tokens") or 0))
        latency = record.get("latency_s")
        if isinstance(latency, int | float) and route != "shadow":
            self.latency.labels(*key).observe(float(latency))
        ttft = record.get("ttft_s")
        if isinstance(ttft, int | float) and route != "shadow":
            self.ttft.labels(*key).observe(float(ttft))


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


class PlatformCollector(Collector):
    """Gauges read from the store on every scrape."""

    def __init__(
        self,
        platform: Any,
        clock: Callable[[], float],
        thresholds: AlertThresholds | None = None,
        telemetry: Any = None,
        max_job_series: int = DEFAULT_MAX_JOB_SERIES,
    ) -> None:
        self.platform = platform
        self.clock = clock
        self.thresholds = thresholds or AlertThresholds()
        self.telemetry = telemetry  # JobTelemetry: checkpoint durations and failures per open job
        self.max_job_series = max_job_series
        # job id -> (model FLOPs per step, peak FLOP/s of its placement) or None when unknown: for MFU
        self._mfu_basis: dict[str, tuple[float, float] | None] = {}

    def _mfu_bases(self, job_ids: list[str]) -> dict[str, tuple[float, float] | None]:
        """Model FLOPs per step and the placement's dense peak FLOP/s of each job (computed once a job)."""
        missing = [j for j in job_ids if j not in self._mfu_basis]
        if missing:
            from sqlalchemy import select

            from trainyard.catalog.accelerators import get_accelerator
            from trainyard.predict.workload import compute_dtype, training_flops_per_step
            from trainyard.spec.loader import spec_from_dict
            from trainyard.store.models import JobRow

            with self.platform.db.session() as s:
                rows = s.execute(
                    select(JobRow.id, JobRow.spec, JobRow.placement).where(JobRow.id.in_(missing))
                ).all()
            for r in rows:
                basis = None
                try:
                    spec = spec_from_dict(r.spec)
                    place = r.placement or {}
                    peak = get_accelerator(str(place["accelerator"])).peak_flops(
                        compute_dtype(spec.workload.precision)
                    ) * int(place["devices"])
                    basis = (training_flops_per_step(spec), peak) if peak > 0 else None
                except Exception:  # a custom model without a shape, an unknown accelerator: no MFU
                    basis = None
                self._mfu_basis[r.id] = basis
            while len(self._mfu_basis) > 4 * self.max_job_series + 1000:
                self._mfu_basis.pop(next(iter(self._mfu_basis)))
        return {j: self._mfu_basis.get(j) for j in job_ids}

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
        cost = CounterMetricFamily(
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
        yield from self._job_series(s.open_jobs)
        try:
            budgets = list(self._budgets())
        except Exception as exc:  # budgets are extra: the rest of the scrape stands
            log.warning("metrics_budgets_failed", error_type=type(exc).__name__, error=str(exc)[:300])
            budgets = []
        yield from budgets
        firing = GaugeMetricFamily(
            "trainyard_alerts_firing", "Alerts firing now by rule and severity", labels=["rule", "severity"]
        )
        alerts = evaluate(s.open_jobs, self.thresholds)
        for rule in RULES:
            for sev in ("warning", "critical"):
                firing.add_metric([rule, sev], sum(1 for a in alerts if a.rule == rule and a.severity == sev))
        yield firing

    def _job_series(self, open_jobs: list[Any]) -> Iterator[Any]:
        active = [j for j in open_jobs if j.state in ACTIVE]  # newest first
        kept = active[: self.max_job_series]
        if self.telemetry is not None:
            self.telemetry.prune({j.job_id for j in open_jobs})
        labels = ["job_id", "tenant"]

        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels)

        def counter(name: str, doc: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=labels)

        age = gauge("trainyard_job_last_report_age_seconds", "Seconds since a running job's last heartbeat")
        step = gauge("trainyard_job_step", "Optimizer steps a running job has completed")
        total = gauge("trainyard_job_steps", "Optimizer steps a running job will run in all")
        step_time = gauge("trainyard_job_step_time_seconds", "Mean step time over the last heartbeat")
        tps = gauge("trainyard_job_tokens_per_second", "Training throughput over the last heartbeat")
        loss = gauge("trainyard_job_loss", "Training loss at the last heartbeat")
        mfu = gauge("trainyard_job_mfu_ratio", "Model FLOPs utilisation at the last heartbeat (0..1)")
        memory = gauge("trainyard_job_device_memory_bytes", "Device memory in use by rank 0")
        ckpt = gauge("trainyard_job_checkpoint_duration_seconds", "Duration of the job's last checkpoint")
        ckpt_fail = counter("trainyard_job_checkpoint_failures", "Failed checkpoint saves of a running job")
        preempt = counter("trainyard_job_preemptions", "Preemptions of a running job so far")
        restarts = counter("trainyard_job_restarts", "Restarts after failures of a running job so far")
        spent = counter("trainyard_job_cost_usd", "Dollars a running job has cost so far, all attempts")
        budget = gauge("trainyard_job_budget_usd", "The job's own budget (objective.budget_usd)")
        bases = (
            self._mfu_bases([j.job_id for j in kept if (j.progress or {}).get("mfu") is None]) if kept else {}
        )
        for j in kept:
            key = [j.job_id, j.tenant_name]
            p = dict(j.progress or {})
            basis, step_s = bases.get(j.job_id), _num(p.get("step_time_s"))
            if p.get("mfu") is None and basis is not None and step_s:
                p["mfu"] = basis[0] / step_s / basis[1]  # achieved over peak dense FLOP/s
            if j.last_report_age_s is not None:
                age.add_metric(key, j.last_report_age_s)
            for fam, field, scale in (
                (step, "step", 1.0),
                (total, "total_steps", 1.0),
                (step_time, "step_time_s", 1.0),
                (tps, "tokens_per_s", 1.0),
                (loss, "loss", 1.0),
                (mfu, "mfu", 1.0),
                (memory, "memory_gib", float(2**30)),
            ):
                v = _num(p.get(field))
                if v is not None:
                    fam.add_metric(key, v * scale)
            live = self.telemetry.live.get(j.job_id) if self.telemetry is not None else None
            if live is not None and live.checkpoint_save_s is not None:
                ckpt.add_metric(key, live.checkpoint_save_s)
            ckpt_fail.add_metric(key, float(live.checkpoint_failures if live is not None else 0))
            preempt.add_metric(key, float(j.preemptions))
            restarts.add_metric(key, float(j.restarts))
            spent.add_metric(key, j.cost_usd)
            if j.budget_usd is not None:
                budget.add_metric(key, j.budget_usd)
        yield from (age, step, total, step_time, tps, loss, mfu, memory, ckpt, ckpt_fail)
        yield from (preempt, restarts, spent, budget)
        dropped = GaugeMetricFamily(
            "trainyard_job_series_dropped",
            "Running jobs left out of the per-job series (over the cap of jobs with series)",
        )
        dropped.add_metric([], float(len(active) - len(kept)))
        yield dropped

    def _budgets(self) -> Iterator[Any]:
        gov = getattr(self.platform, "governance", None)
        if gov is None or not hasattr(gov, "all_budgets"):
            return
        labels = ["tenant", "budget", "period", "hard"]
        limit = GaugeMetricFamily(
            "trainyard_budget_limit_usd", "A budget's dollars per period", labels=labels
        )
        spent = GaugeMetricFamily(
            "trainyard_budget_spent_usd",
            "Dollars spent in the budget's current period (resets when a period starts)",
            labels=labels,
        )
        used = GaugeMetricFamily(
            "trainyard_budget_used_ratio", "Spent over limit in the current period", labels=labels
        )
        for b in gov.all_budgets():
            key = [
                str(b["tenant"]),
                str(b.get("tag") or "(all)"),
                str(b["period"]),
                str(bool(b["hard"])).lower(),
            ]
            limit.add_metric(key, float(b["usd"]))
            spent.add_metric(key, float(b["spent_usd"]))
            used.add_metric(key, float(b["used_pct"]) / 100.0)
        yield from (limit, spent, used)
