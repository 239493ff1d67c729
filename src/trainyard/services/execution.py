"""The supervisor: turns placements into launches and executor events into job state and events.

It runs in the control loop (one thread). Every change it makes to a job happens in one transaction
that re-reads the job under a row lock, so a concurrent cancel from the API is never overwritten.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
from sqlalchemy.orm import Session

from trainyard.catalog.pools import Pool
from trainyard.errors import (
    ConflictError,
    NotFoundError,
    ServiceUnavailableError,
    StorageError,
    TrainyardError,
)
from trainyard.executors.base import (
    CLASSIFICATION_INFRA,
    TERMINAL_KINDS,
    Executor,
    ExecutorEvent,
    LaunchRequest,
    RestartPolicy,
    WorkerInfo,
)
from trainyard.services.domain import Job, Placement
from trainyard.services.jobs import JobService
from trainyard.services.lifecycle import ACTIVE_STATES, JobState
from trainyard.services.pools import PoolService, executor_serves, planning_only_reason
from trainyard.services.scheduling import GreedyCheapestRound, QueuedJobView, RoundResult, ScheduleRound
from trainyard.store.db import Database
from trainyard.store.repositories import EventRepo, JobRepo, TenantRepo
from trainyard.tenancy import ledger
from trainyard.tenancy.storage import StoragePolicy

log = structlog.get_logger("trainyard.supervisor")

HEARTBEAT_EVENT_EVERY_S = 10.0
ALERTING_KINDS = ("failed", "log", "metrics")  # executor events that alert rules look at
DEFAULT_NOTICE_S = 30.0


def launch_plan(spec_doc: dict[str, Any], pool: Pool | None, devices: int) -> dict[str, Any] | None:
    """The parallelism plan the predictor prices for this placement (what the trainer executes)."""
    if pool is None:
        return None
    try:
        from trainyard.cost.quote import pool_accelerator, predict_kwargs
        from trainyard.predict import predict
        from trainyard.spec.loader import spec_from_dict

        acc = pool_accelerator(pool)
        return dict(predict(spec_from_dict(spec_doc), acc, devices, **predict_kwargs(pool, acc)).plan)
    except (TrainyardError, ValueError, KeyError, TypeError) as exc:
        log.warning("launch_plan_failed", pool=pool.name, error=str(exc)[:300])
        return None


def attempt_cost_usd(
    placement: Placement | None, started_s: float | None, ended_s: float
) -> tuple[float, float]:
    """(device-seconds, dollars) of one attempt: devices × wall seconds × price per device-hour."""
    if placement is None or started_s is None:
        return 0.0, 0.0
    device_s = max(0.0, ended_s - started_s) * placement.devices
    return device_s, device_s * placement.price_usd_per_device_hour / 3600.0


class Supervisor:
    # set by the platform: where the run record of each attempt is stored
    records: Any = None

    def __init__(
        self,
        db: Database,
        jobs: JobService,
        pools: PoolService,
        executor: Executor,
        *,
        runs_dir: Path,
        checkpoint_url: str,
        schedule_round: ScheduleRound | None = None,
        restart_policy: RestartPolicy | None = None,
        clock: Callable[[], float] = time.time,
        spot_seed: int = 0,
        storage_policy: StoragePolicy | None = None,
    ) -> None:
        self.db = db
        self.jobs = jobs
        self.pools = pools
        self.executor = executor
        self.runs_dir = runs_dir
        self.checkpoint_url = checkpoint_url
        self.storage_policy = storage_policy
        self.schedule_round: ScheduleRound = schedule_round or GreedyCheapestRound()
        self._fallback_round = GreedyCheapestRound()
        self.restart_policy = restart_policy or RestartPolicy()
        self.clock = clock
        self._last_heartbeat_event: dict[str, float] = {}
        self.last_round: RoundResult | None = None
        self._spot_rng = random.Random(spot_seed)
        self._spot_last_s: float | None = None
        # When True, a failure restart waits RestartPolicy.backoff_s in `preempted` before re-entering the
        # queue (`trainyard up` turns it on); when False it is requeued at once.
        self.restart_backoff = False
        # set by the platform: extra launch environment for a job (the registered base model's weights),
        # and the hook that registers a finished job's model (returns the result fields to store)
        self.launch_env: Callable[[Job], dict[str, str]] | None = None
        self.on_job_succeeded: Callable[[Session, Job, dict[str, Any]], dict[str, Any]] | None = None
        self._restart_not_before: dict[str, float] = {}
        # set by the platform: budgets (hard-limit stops) and tenant limits (concurrent jobs)
        self.governance: Any = None
        # step metrics: every N-th step, at most this many rows a second (settings metrics_*)
        self.worker_logs: Any = None  # set by the platform: keeps rank logs of ended attempts
        self.alerts: Any = None  # set by the platform: the alert service (observe(ev, job), scan())
        self.metrics_every_steps = 1
        self.metrics_max_rows_per_s = 100.0
        self.tenant_limits: Callable[[], dict[str, Any]] | None = None
        # run after the phases of every tick (observability: job spans and counters from the new events)
        self.observers: list[Callable[[], Any]] = []

    # ---- one tick of the control loop ----------------------------------------------------------
    def tick(self) -> None:
        """One pass of the control loop; a failing phase is logged and does not stop the others."""
        phases: list[Callable[[], Any]] = [
            self.jobs.admit_pending,
            self.release_restarts,
            self.schedule_once,
            self.poll_once,
            self.sweep_cancelled,
            self.spot_interruptions,
            self.enforce_budgets,
            self.scan_alerts,
            *self.observers,
        ]
        for phase in phases:
            try:
                phase()
            except Exception:
                log.exception("control_loop_phase_failed", phase=phase.__name__)

    def scan_alerts(self) -> None:
        if self.alerts is not None:
            self.alerts.scan()

    # ---- scheduling ----------------------------------------------------------------------------
    def executable(self, pool: Pool) -> bool:
        """True when this supervisor's executor can start work on ``pool`` (DESIGN §3.4 backends)."""
        return executor_serves(self.executor, pool)

    def free_pools(self) -> list[Pool]:
        """Pools the executor serves, with their free capacity; planning-only pools are never offered."""
        pools = [p for p in self.pools.pools() if self.executable(p)]
        with self.db.session() as s:
            used = JobRepo(s).devices_in_use(by="pool")
        out = []
        for p in pools:
            free = max(0, p.free_devices - used.get(p.name, 0))
            out.append(p.model_copy(update={"available_devices": free}))
        return out

    def schedule_once(self, limit: int = 500) -> RoundResult | None:
        limits = self.tenant_limits() if self.tenant_limits is not None else {}
        with self.db.session() as s:
            queued = JobRepo(s).list(states=[JobState.QUEUED.value], limit=limit, newest_first=False)
            if not queued:
                return None
            in_use = JobRepo(s).devices_in_use(by="tenant")
            tenants = {t.id: t for t in TenantRepo(s).list()}
            capped = {tid: lim.max_concurrent_jobs for tid, lim in limits.items() if lim.max_concurrent_jobs}
            if capped:
                active = JobRepo(s).counts_by_tenant([st.value for st in ACTIVE_STATES])
                room = {tid: cap - active.get(tid, 0) for tid, cap in capped.items()}
                kept = []
                for j in queued:  # oldest first: each tenant's oldest jobs take its free slots
                    if j.tenant_id in room:
                        if room[j.tenant_id] <= 0:
                            continue
                        room[j.tenant_id] -= 1
                    kept.append(j)
                queued = kept
                if not queued:
                    return None
        views = [
            QueuedJobView(
                job_id=j.id,
                tenant_id=j.tenant_id,
                spec=j.spec,
                submitted_at_s=j.created_at_s,
                quote=list(j.quote or []),
                attempt=j.attempt,
                tenant_devices_in_use=in_use.get(j.tenant_id, 0),
                tenant_max_active_devices=tenants[j.tenant_id].max_active_devices
                if j.tenant_id in tenants
                else None,
            )
            for j in queued
        ]
        free = self.free_pools()
        try:
            result = self.schedule_round(views, free, self.clock())
        except Exception:
            log.exception("schedule_round_failed_using_greedy")
            result = self._fallback_round(views, free, self.clock())
        self.last_round = result
        pools = {p.name: p for p in self.pools.pools()}
        for job_id, placement in result.placements.items():
            self._start(job_id, placement, pools.get(placement.pool))
        by_id = {j.id: j for j in queued}
        result = self._explain_planning_only(result, by_id, pools)
        changed = {
            jid: why for jid, why in result.unplaced.items() if jid in by_id and by_id[jid].reason != why
        }
        if changed:
            with self.db.session() as s:
                for jid, why in changed.items():
                    JobRepo(s).update_if_state(jid, JobState.QUEUED, reason=why[:2000])
        return result

    def _explain_planning_only(
        self, result: RoundResult, by_id: dict[str, Job], pools: dict[str, Pool]
    ) -> RoundResult:
        """An unplaced job whose feasible options are all on capacity no executor serves says so."""
        served = {name for name, p in pools.items() if self.executable(p)}
        for jid in list(result.unplaced):
            job = by_id.get(jid)
            if job is None:
                continue
            feasible = [o for o in (job.quote or []) if o.get("feasible")]
            if not feasible or any(o.get("pool") in served for o in feasible):
                continue
            names = sorted(
                {str(o.get("pool") or o.get("instance_type") or o.get("accelerator")) for o in feasible}
            )
            result.unplaced[jid] = planning_only_reason(names)
        return result

    def _start(self, job_id: str, placement: Placement, pool: Pool | None) -> None:
        if pool is None or not self.executable(pool):  # never start work no executor serves
            log.warning("placement_not_executable", job_id=job_id, pool=placement.pool)
            return
        with self.db.session() as s:
            job = JobRepo(s).get(job_id, for_update=True)
            if job is None or job.state != JobState.QUEUED:
                return
            attempt = job.attempt + 1
            run_dir = self.runs_dir / job.id  # one dir per job; event files carry the attempt
            now = self.clock()
            self.jobs.transition(
                s,
                job,
                JobState.STARTING,
                f"placed on {placement.pool} ({placement.devices} devices)",
                attempt=attempt,
                placement=placement,
                run_dir=str(run_dir),
                attempt_started_at_s=now,
                workers=[],
            )
            EventRepo(s).append(job.id, "placement", {"attempt": attempt, **placement.to_dict()}, now)
            tenant = TenantRepo(s).by_id(job.tenant_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        spec = job.spec
        storage = (spec.get("checkpoint") or {}).get("storage") or self.checkpoint_url
        tenant_name, roots = (tenant.name if tenant is not None else ""), []
        if self.storage_policy is not None and tenant is not None:
            roots = self.storage_policy.roots(tenant.name, tenant.storage_roots)
            if not (spec.get("checkpoint") or {}).get("storage"):
                storage = self.storage_policy.area(tenant.name, "checkpoints")
        interval = placement.checkpoint_interval_s
        if interval is None:
            from trainyard.spec.models import parse_duration_s

            pinned = (spec.get("checkpoint") or {}).get("interval", "auto")
            interval = None if pinned == "auto" else parse_duration_s(pinned)
        try:
            env = self.launch_env(job) if self.launch_env is not None else {}
        except TrainyardError as exc:  # e.g. the base model version disappeared
            log.warning("launch_env_failed", job_id=job.id, error=exc.message[:500])
            self._end_attempt_with_failure(job.id, attempt, f"launch failed: {exc.message}", "user")
            return
        req = LaunchRequest(
            job_id=job.id,
            attempt=attempt,
            spec=spec,
            world_size=placement.devices,
            pool=placement.pool,
            market=placement.market,
            checkpoint_url=storage,
            checkpoint_interval_s=interval,
            run_dir=str(run_dir),
            notice_s=(pool.notice_s if pool is not None and pool.notice_s is not None else DEFAULT_NOTICE_S),
            accelerator=placement.accelerator,
            plan=launch_plan(spec, pool, placement.devices),
            tenant=tenant_name,
            storage_roots=roots,
            code_url=(spec.get("entrypoint") or {}).get("code"),
            env=env,
            metrics_every_steps=self.metrics_every_steps,
            metrics_max_rows_per_s=self.metrics_max_rows_per_s,
        )
        try:
            workers = self.executor.launch(req)
        except StorageError as exc:  # retrying cannot help: the checkpoint storage is unusable
            log.warning("launch_refused_storage", job_id=job.id, attempt=attempt, error=exc.message[:500])
            self._fail_for_storage(job.id, attempt, exc)
            return
        except Exception as exc:  # any other launch failure is an infrastructure failure of this attempt
            log.warning("launch_failed", job_id=job.id, attempt=attempt, error=str(exc)[:500])
            self._end_attempt_with_failure(
                job.id, attempt, f"launch failed: {exc}"[:1000], CLASSIFICATION_INFRA
            )
            return
        with self.db.session() as s:
            current = JobRepo(s).get(job.id, for_update=True)
            if current is None or current.attempt != attempt:
                return
            docs = [w.to_dict() for w in workers]
            JobRepo(s).update(job.id, workers=docs, updated_at_s=self.clock())
            EventRepo(s).append(job.id, "workers", {"attempt": attempt, "workers": docs}, self.clock())
        log.info("launched", job_id=job.id, attempt=attempt, pool=placement.pool, devices=placement.devices)

    # ---- executor events -----------------------------------------------------------------------
    def poll_once(self) -> int:
        events = self.executor.poll()
        for ev in events:
            try:
                self.apply_event(ev)
            except Exception:
                log.exception("event_apply_failed", job_id=ev.job_id, kind=ev.kind)
            if ev.kind in TERMINAL_KINDS:  # every rank has exited: its log of the attempt is whole
                self.archive_logs(ev.job_id, ev.attempt)
            if self.alerts is not None and ev.kind in ALERTING_KINDS:
                self._alert_on(ev)
        return len(events)

    def _alert_on(self, ev: ExecutorEvent) -> None:
        """Conditions an event shows (a NaN loss, a failing checkpoint, ...) become alerts."""
        try:
            with self.db.session() as s:
                job = JobRepo(s).get(ev.job_id)
            if job is not None and job.attempt == ev.attempt:
                self.alerts.observe(ev, job)
        except Exception:
            log.exception("alert_check_failed", job_id=ev.job_id, kind=ev.kind)

    def archive_logs(self, job_id: str, attempt: int) -> None:
        """Keep each rank's log of an ended attempt in the tenant's storage area (never fails the loop)."""
        if self.worker_logs is None:
            return
        try:
            with self.db.session() as s:
                job = JobRepo(s).get(job_id)
            if job is not None:
                self.worker_logs.archive(job, attempt)
        except Exception:
            log.exception("log_archive_failed", job_id=job_id, attempt=attempt)

    def apply_event(self, ev: ExecutorEvent) -> None:
        with self.db.session() as s:
            job = JobRepo(s).get(ev.job_id, for_update=True)
            if job is None or ev.attempt != job.attempt:
                return  # unknown job or a stale attempt's late event
            handler = getattr(self, f"_on_{ev.kind}", None)
            if handler is None:
                EventRepo(s).append(job.id, ev.kind, {"attempt": ev.attempt, **ev.data}, ev.time_s)
                return
            handler(s, job, ev)

    def _on_span(self, s: Session, job: Job, ev: ExecutorEvent) -> None:
        """A worker's trace span is telemetry, not a job event (observability exports it)."""
        return None

    def _ensure_running(self, s: Session, job: Job, reason: str) -> Job:
        if job.state == JobState.STARTING:
            self.jobs.transition(s, job, JobState.RUNNING, reason)
            refreshed = JobRepo(s).get(job.id)
            assert refreshed is not None
            return refreshed
        return job

    def _on_started(self, s: Session, job: Job, ev: ExecutorEvent) -> None:
        if job.state in (JobState.STARTING, JobState.RUNNING):
            rank = ev.data.get("rank")
            workers = [w for w in job.workers if w.get("rank") != rank]
            workers.append({"rank": rank, "pid": ev.data.get("pid"), "host": ev.data.get("host")})
            workers.sort(key=lambda w: (w.get("rank") is None, w.get("rank")))
            JobRepo(s).update(job.id, workers=workers)
            EventRepo(s).append(job.id, "started", {"attempt": ev.attempt, **ev.data}, ev.time_s)
            self._ensure_running(s, job, "workers started")

    def _on_record(self, s: Session, job: Job, ev: ExecutorEvent) -> None:
        if self.records is not None:
            self.records.store(s, job, ev.attempt, ev.data, ev.time_s)
        EventRepo(s).append(
            job.id,
            "record",
            {
                "attempt": ev.attempt,
                "spec_sha256": ev.data.get("spec_sha256"),
                "datasets": ev.data.get("datasets"),
            },
            ev.time_s,
        )

    def _on_heartbeat(self, s: Session, job: Job, ev: ExecutorEvent) -> None:
        if job.state not in ACTIVE_STATES:
            return
        job = self._ensure_running(s, job, "first heartbeat")
        progress = {**job.progress, **{k: v for k, v in ev.data.items() if k != "rank"}, "time_s": ev.time_s}
        JobRepo(s).update(job.id, progress=progress)
        last = self._last_heartbeat_event.get(job.id, 0.0)
        if ev.time_s - last >= HEARTBEAT_EVENT_EVERY_S:
            self._last_heartbeat_event[job.id] = ev.time_s
            EventRepo(s).append(job.id, "heartbeat", {"attempt": ev.attempt, **ev.data}, ev.time_s)

    def _on_metrics(self, s: Session, job: Job, ev: ExecutorEvent) -> None:
        """Step metrics at training resolution: stored as rows, never as job events."""
        from trainyard.services.training_metrics import ingest

        ingest(s, job.id, ev.attempt, ev.data)

    def _on_checkpoint(self, s: Session, job: Job, ev: ExecutorEvent) -> None:
        step = ev.data.get("step")
        entry: dict[str, Any] = {"step": step, "path": ev.data.get("path"), "attempt": ev.attempt}
        if isinstance(ev.data.get("bytes"), int):
            entry["bytes"] = ev.data["bytes"]  # what storage metering bills, with time_s and removed_at_s
            entry["time_s"] = ev.time_s
        removed = set(ev.data.get("removed_steps") or ())
        kept = []
        for c in job.checkpoints:
            if "removed_at_s" not in c and (c.get("step") in removed or c.get("step") == step):
                c = {**c, "removed_at_s": ev.time_s}  # deleted by retention, or overwritten by this one
            kept.append(c)
        JobRepo(s).update(job.id, checkpoints=[*kept, entry])
        EventRepo(s).append(job.id, "checkpoint", {"attempt": ev.attempt, **ev.data}, ev.time_s)

    def _close_attempt(self, s: Session, job: Job, ended_s: float) -> dict[str, Any]:
        device_s, usd = attempt_cost_usd(job.placement, job.attempt_started_at_s, ended_s)
        if job.attempt_started_at_s is None:
            return {}
        if job.placement is not None:
            # the ledger entry and the job's cost_usd change in this one transaction
            ledger.charge(
                s.connection(),
                ledger.device_charge(
                    tenant_id=job.tenant_id,
                    job_id=job.id,
                    attempt=job.attempt,
                    placement=job.placement,
                    device_s=device_s,
                    usd=usd,
                    time_s=ended_s,
                    spec=job.spec,
                ),
            )
        EventRepo(s).append(
            job.id,
            "cost",
            {
                "attempt": job.attempt,
                "device_s": round(device_s, 3),
                "usd": round(usd, 6),
                "price_usd_per_device_hour": job.placement.price_usd_per_device_hour
                if job.placement
                else 0.0,
                "pool": job.placement.pool if job.placement else None,
            },
            ended_s,
        )
        return {"cost_usd": job.cost_usd + usd, "attempt_started_at_s": None}

    def _requeue(self, s: Session, job: Job, reason: str, ended_s: float, data: dict[str, Any]) -> None:
        closing = self._close_attempt(s, job, ended_s)
        if job.state in ACTIVE_STATES:
            self.jobs.transition(s, job, JobState.PREEMPTED, reason, data=data, **closing)
            job = JobRepo(s).get(job.id)  # type: ignore[assignment]
        self.jobs.transition(s, job, JobState.QUEUED, "back in the queue; resumes from its last checkpoint")

    def _on_preempted(self, s: Session, job: Job, ev: ExecutorEvent) -> None:
        if job.state not in ACTIVE_STATES:
            return
        EventRepo(s).append(job.id, "preempted", {"attempt": ev.attempt, **ev.data}, ev.time_s)
        if self.governance is not None and self.governance.is_held(s, job.id):
            closing = self._close_attempt(s, job, ev.time_s)
            self.jobs.transition(
                s,
                job,
                JobState.PREEMPTED,
                "stopped at its hard budget; resumes from its last checkpoint when the budget is raised",
                data={"attempt": ev.attempt, "budget_hold": True},
                **closing,
            )
            return
        self._requeue(s, job, "preempted", ev.time_s, {"attempt": ev.attempt})

    def enforce_budgets(self) -> int:
        """Running work that reaches a hard budget gets a preemption notice (it checkpoints and stops) and
        is held in ``preempted`` until the budget is raised."""
        if self.governance is None:
            return 0
        stopped = 0
        for job_id, budget_id in self.governance.over_budget_running(DEFAULT_NOTICE_S):
            if not self.governance.hold(job_id, budget_id):
                continue
            try:
                self.preempt(job_id, by="budget")
                stopped += 1
            except TrainyardError as exc:
                log.warning("budget_stop_failed", job_id=job_id, error=exc.message)
        return stopped

    def _on_succeeded(self, s: Session, job: Job, ev: ExecutorEvent) -> None:
        if job.state not in ACTIVE_STATES:
            return
        job = self._ensure_running(s, job, "workers started")
        result = {
            "model_version": ev.data.get("model_version") or f"{job.name}@{job.id}",
            "model_sha256": ev.data.get("model_sha256"),
            "model_path": ev.data.get("model_path"),
            "final_step": ev.data.get("final_step"),
        }
        if ev.data.get("loss") is not None:
            result["loss"] = ev.data.get("loss")
        if self.on_job_succeeded is not None:
            try:
                with s.begin_nested():
                    result.update(self.on_job_succeeded(s, job, result))
            except Exception as exc:  # the model stays in the job's checkpoint directory
                log.exception("model_registration_failed", job_id=job.id)
                result["registry_error"] = str(exc)[:500]
        closing = self._close_attempt(s, job, ev.time_s)
        self.jobs.transition(s, job, JobState.SUCCEEDED, "training finished", result=result, **closing)

    def _on_failed(self, s: Session, job: Job, ev: ExecutorEvent) -> None:
        if job.state not in ACTIVE_STATES:
            return
        reason = str(ev.data.get("reason") or "the job failed")[:2000]
        classification = str(ev.data.get("classification") or CLASSIFICATION_INFRA)
        EventRepo(s).append(job.id, "failed", {"attempt": ev.attempt, **ev.data}, ev.time_s)
        self._fail_or_restart(s, job, reason, classification, ev.time_s)

    def _on_lost(self, s: Session, job: Job, ev: ExecutorEvent) -> None:
        if job.state not in ACTIVE_STATES:
            return
        EventRepo(s).append(job.id, "lost", {"attempt": ev.attempt, **ev.data}, ev.time_s)
        self._fail_or_restart(
            s, job, f"workers lost: {ev.data.get('reason', '')}", CLASSIFICATION_INFRA, ev.time_s
        )

    def _failure_restarts(self, s: Session, job_id: str) -> int:
        """Restarts after failures so far (preemptions are not failures and do not use up the budget)."""
        return EventRepo(s).count(job_id, "restart")

    def _record_restart(self, s: Session, job: Job, classification: str, reason: str, n: int) -> None:
        EventRepo(s).append(
            job.id,
            "restart",
            {
                "attempt": job.attempt,
                "classification": classification,
                "restart": n + 1,
                "max_restarts": self.restart_policy.max_restarts,
                "reason": reason[:500],
            },
            self.clock(),
        )

    def _fail_for_storage(self, job_id: str, attempt: int, exc: StorageError) -> None:
        with self.db.session() as s:
            job = JobRepo(s).get(job_id, for_update=True)
            if job is None or job.attempt != attempt or job.state not in ACTIVE_STATES:
                return
            now = self.clock()
            EventRepo(s).append(
                job.id,
                "failed",
                {
                    "attempt": attempt,
                    "classification": "storage",
                    "reason": exc.message[:1000],
                    "hint": exc.hint,
                    "details": exc.details,
                },
                now,
            )
            closing = self._close_attempt(s, job, now)
            self.jobs.transition(
                s,
                job,
                JobState.FAILED,
                f"checkpoint storage unusable: {exc.message}"[:2000],
                data={"classification": "storage"},
                **closing,
            )

    def _fail_or_restart(
        self, s: Session, job: Job, reason: str, classification: str, ended_s: float
    ) -> None:
        restarts_so_far = self._failure_restarts(s, job.id)
        if self.restart_policy.should_restart(classification, restarts_so_far):
            self._record_restart(s, job, classification, reason, restarts_so_far)
            if self.restart_backoff:
                self._hold_for_backoff(s, job, classification, reason, ended_s, restarts_so_far)
                return
            self._requeue(
                s,
                job,
                f"{classification} failure, restarting: {reason}",
                ended_s,
                {"classification": classification},
            )
            return
        closing = self._close_attempt(s, job, ended_s)
        self.jobs.transition(
            s,
            job,
            JobState.FAILED,
            f"{classification} failure: {reason}",
            data={"classification": classification},
            **closing,
        )

    def _hold_for_backoff(
        self, s: Session, job: Job, classification: str, reason: str, ended_s: float, restarts_so_far: int
    ) -> None:
        delay = self.restart_policy.backoff_s(restarts_so_far)
        self._restart_not_before[job.id] = self.clock() + delay
        closing = self._close_attempt(s, job, ended_s)
        self.jobs.transition(
            s,
            job,
            JobState.PREEMPTED,
            f"{classification} failure, restarting in {delay:g} s: {reason}"[:2000],
            data={"classification": classification, "backoff_s": delay},
            **closing,
        )

    def release_restarts(self) -> int:
        """Failure restarts whose back-off has passed re-enter the queue (preempted -> queued)."""
        if not self._restart_not_before:
            return 0
        now = self.clock()
        due = [jid for jid, t in self._restart_not_before.items() if t <= now]
        for jid in due:
            self._restart_not_before.pop(jid, None)
            with self.db.session() as s:
                job = JobRepo(s).get(jid, for_update=True)
                if job is None or job.state != JobState.PREEMPTED:
                    continue
                why = "back-off over; back in the queue, resumes from its last checkpoint"
                self.jobs.transition(s, job, JobState.QUEUED, why)
        return len(due)

    def _end_attempt_with_failure(self, job_id: str, attempt: int, reason: str, classification: str) -> None:
        with self.db.session() as s:
            job = JobRepo(s).get(job_id, for_update=True)
            if job is None or job.attempt != attempt or job.state not in ACTIVE_STATES:
                return
            restarts_so_far = self._failure_restarts(s, job.id)
            closing = self._close_attempt(s, job, self.clock())
            if self.restart_policy.should_restart(classification, restarts_so_far):
                self._record_restart(s, job, classification, reason, restarts_so_far)
                if self.restart_backoff:
                    delay = self.restart_policy.backoff_s(restarts_so_far)
                    self._restart_not_before[job.id] = self.clock() + delay
                    self.jobs.transition(
                        s,
                        job,
                        JobState.PREEMPTED,
                        f"{reason}; restarting in {delay:g} s",
                        data={"classification": classification, "backoff_s": delay},
                        **closing,
                    )
                else:
                    self.jobs.transition(s, job, JobState.QUEUED, reason, **closing)
            else:
                self.jobs.transition(s, job, JobState.FAILED, reason, **closing)

    # ---- preemption ------------------------------------------------------------------------------
    def preempt(self, job_id: str, notice_s: float | None = None, *, by: str = "user") -> Job:
        """Deliver a preemption notice to a running job's workers (a drill, or a spot reclaim).

        The workers finish their step, write an emergency checkpoint if it fits in the notice and exit as
        preempted; the executor reports that and the job goes preempted -> queued and is placed again,
        resuming from its last committed checkpoint.
        """
        with self.db.session() as s:
            job = JobRepo(s).get(job_id)
            if job is None:
                raise NotFoundError(f"no job {job_id!r}", hint="List your jobs with `trainyard jobs list`.")
            if job.state not in (JobState.STARTING, JobState.RUNNING):
                raise ConflictError(
                    f"job {job_id} is {job.state.value}; only a starting or running job can be preempted",
                    hint="See `trainyard jobs get ID` for its state.",
                )
        if notice_s is None:
            pool = {p.name: p for p in self.pools.pools()}.get(job.placement.pool) if job.placement else None
            notice_s = pool.notice_s if pool is not None and pool.notice_s is not None else DEFAULT_NOTICE_S
        try:
            self.executor.preempt(job.id, float(notice_s))
        except TrainyardError:
            raise
        except Exception as exc:
            raise ServiceUnavailableError(f"the executor could not deliver the notice: {exc}") from exc
        with self.db.session() as s:
            EventRepo(s).append(
                job.id,
                "preemption_notice",
                {"attempt": job.attempt, "notice_s": float(notice_s), "by": by},
                self.clock(),
            )
        log.info("preemption_notice", job_id=job.id, attempt=job.attempt, notice_s=notice_s, by=by)
        return job

    def spot_interruptions(self) -> int:
        """Reclaim spot capacity at each pool's ``interruption_rate_per_hour``: for every running job on a
        spot pool, a notice arrives in this tick's interval with probability 1 - exp(-rate x dt)
        (a Poisson process; seeded, on the injected clock)."""
        now = self.clock()
        last, self._spot_last_s = self._spot_last_s, now
        if last is None or now <= last:
            return 0
        spot = {
            p.name: p
            for p in self.pools.pools()
            if str(getattr(p.market, "value", p.market)) == "spot" and (p.interruption_rate_per_hour or 0) > 0
        }
        if not spot:
            return 0
        with self.db.session() as s:  # every running job (each holds devices, so capacity bounds them)
            running = JobRepo(s).list(states=[JobState.RUNNING.value], limit=None)
        hits = 0
        for job in sorted(running, key=lambda j: j.id):
            pool = spot.get(job.placement.pool) if job.placement else None
            if pool is None:
                continue
            rate_per_s = float(pool.interruption_rate_per_hour or 0.0) / 3600.0
            if self._spot_rng.random() < 1.0 - math.exp(-rate_per_s * (now - last)):
                try:
                    self.preempt(job.id, by="spot")
                    hits += 1
                except TrainyardError as exc:
                    log.warning("spot_preempt_failed", job_id=job.id, error=exc.message)
        return hits

    # ---- cancellation ----------------------------------------------------------------------------
    def sweep_cancelled(self, limit: int | None = None) -> int:
        """Stop the workers of jobs cancelled while they held capacity, and charge the attempt (at most
        ``limit`` a call, the rest on the next; None: all of them, which capacity bounds, since each one's
        open attempt holds devices). Only cancelled jobs whose attempt is still open are read: cancelled
        jobs stay cancelled, so a cap on all of them would skip an old job cancelled late."""
        with self.db.session() as s:
            cancelled = JobRepo(s).list(states=[JobState.CANCELLED.value], attempt_open=True, limit=limit)
        for job in cancelled:
            try:
                self.executor.cancel(job.id)
            except Exception as exc:
                log.warning("cancel_failed", job_id=job.id, error=str(exc)[:500])
            with self.db.session() as s:
                current = JobRepo(s).get(job.id, for_update=True)
                if current is None or current.attempt_started_at_s is None:
                    continue
                closing = self._close_attempt(s, current, self.clock())
                JobRepo(s).update(job.id, **closing)
            self.archive_logs(job.id, job.attempt)
        return len(cancelled)

    # ---- reconciliation on start ---------------------------------------------------------------
    def reconcile(self) -> dict[str, int]:
        """After a restart (clean or kill -9): adopt live workers, requeue the rest. Idempotent."""
        counts = {"adopted": 0, "requeued": 0, "cancelled_stopped": 0}
        with self.db.session() as s:
            active = JobRepo(s).list(  # all of them: each holds or held devices, so capacity bounds them
                states=[JobState.STARTING.value, JobState.RUNNING.value, JobState.PREEMPTED.value],
                limit=None,
            )
        for job in active:
            adopted = False
            if job.state in ACTIVE_STATES and job.run_dir and job.workers:
                workers = [
                    WorkerInfo(rank=int(w["rank"]), pid=w.get("pid"), host=str(w.get("host") or ""))
                    for w in job.workers
                    if w.get("rank") is not None
                ]
                try:
                    adopted = bool(self.executor.adopt(job.id, job.attempt, job.run_dir, workers))
                except Exception as exc:
                    log.warning("adopt_failed", job_id=job.id, error=str(exc)[:500])
            with self.db.session() as s:
                current = JobRepo(s).get(job.id, for_update=True)
                if current is None or current.state != job.state or current.attempt != job.attempt:
                    continue
                if adopted:
                    EventRepo(s).append(
                        job.id, "adopted", {"attempt": job.attempt, "workers": job.workers}, self.clock()
                    )
                    counts["adopted"] += 1
                    continue
                last_seen = float(current.progress.get("time_s") or current.updated_at_s)
                held = self.governance is not None and self.governance.is_held(s, current.id)
                if current.state == JobState.PREEMPTED and held:
                    continue  # stopped at its budget: stays held until the budget is raised
                if held:  # its workers are gone: charge the attempt and keep it held
                    closing = self._close_attempt(s, current, last_seen)
                    self.jobs.transition(
                        s, current, JobState.PREEMPTED, "stopped at its hard budget", **closing
                    )
                    counts["requeued"] += 1
                    continue
                if current.state == JobState.PREEMPTED:
                    self.jobs.transition(
                        s, current, JobState.QUEUED, "requeued after a control-plane restart"
                    )
                else:
                    self._requeue(s, current, "workers gone after a control-plane restart", last_seen, {})
                counts["requeued"] += 1
        self.sweep_cancelled()
        log.info("reconciled", **counts)
        return counts
