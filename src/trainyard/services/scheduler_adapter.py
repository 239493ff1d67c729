"""The queue-wide optimiser (:func:`trainyard.schedule.schedule_round`) behind the ScheduleRound protocol,
and the supervisor that re-plans running work with it.

Live pools go in with their free capacity. :class:`OptimizerRound` also takes the running jobs (pool,
devices, market, when the attempt started, progress from the latest heartbeat), so a round can move a
running job when the savings over its remaining work beat the cost of moving (the scheduler's hysteresis)
or take a spot job that fell behind its deadline to on-demand capacity.

:class:`ReplanningSupervisor` feeds arrivals, completions, preemptions and pool price/capacity changes to
the scheduler's :class:`~trainyard.schedule.Replanner`. Queued work is placed every tick, as before; the
debounced rounds that include running jobs run when the Replanner says one is due. A migration asks the
executor for an emergency checkpoint (``preempt``) and records why; the job comes back to the queue with
its checkpointed progress and the next round places it, on the new pool when that is still the best
choice. A move between accelerator families records the checkpoint conversion in the job's events.
It also hands heartbeats and finished attempts to :class:`~trainyard.services.feedback.Feedback`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import structlog
from sqlalchemy.orm import Session

from trainyard.catalog.names import ACCELERATOR_FAMILY
from trainyard.catalog.pools import Pool
from trainyard.errors import TrainyardError
from trainyard.executors.base import ExecutorEvent
from trainyard.predict.params import Calibration
from trainyard.schedule import (
    CandidateCache,
    EventKind,
    JobGroup,
    QueuedJob,
    Replanner,
    RunningJob,
    SchedulerConfig,
    SchedulerEvent,
    TenantQuota,
    schedule_round,
)
from trainyard.schedule.candidates import CalibrationHook
from trainyard.services.domain import Job, Placement
from trainyard.services.execution import DEFAULT_NOTICE_S, Supervisor
from trainyard.services.lifecycle import ACTIVE_STATES, JobState
from trainyard.services.scheduling import (
    Migration,
    QueuedJobView,
    RoundResult,
    RunningJobView,
)
from trainyard.spec.loader import spec_from_dict
from trainyard.spec.models import JobSpec
from trainyard.store.repositories import EventRepo, JobRepo

log = structlog.get_logger("trainyard.replan")
MAX_ACTIVE_READ = 100_000  # active jobs a round reads (the newest first) for re-planning and its events


def _fmt_usd(usd: float) -> str:
    return f"${usd:,.2f}" if abs(usd) >= 0.995 else f"${usd:.4f}"


def calibrated_predictions(calibration: Calibration | None) -> CalibrationHook | None:
    """The scheduler's calibration hook for a feedback calibration: predictions on ``calibration`` for
    accelerators it has measured (as :func:`~trainyard.services.feedback.calibrated_quote` prices
    quotes), the packaged predictor's for the others; None when nothing has been measured."""
    from trainyard.services.feedback import calibrated_accelerators

    measured = calibrated_accelerators(calibration) if calibration is not None else set()
    if calibration is None or not measured:
        return None
    from trainyard.predict import predict

    cal = calibration

    def calibrated(spec: JobSpec, accelerator: Any, devices: int, topology: Mapping[str, Any]) -> Any:
        if accelerator.name not in measured:
            return None
        try:
            return predict(spec, accelerator, devices, calibration=cal, **topology)
        except ValueError:
            return None  # the packaged predictor answers (and says why it cannot, if it cannot)

    return calibrated


def job_group(tenant_id: str, spec_doc: Mapping[str, Any]) -> str | None:
    """The scheduling group of a job: a sweep's trial (tagged ``sweep_id``) is scheduled with its sweep."""
    tags = spec_doc.get("tags") or {}
    sweep_id = tags.get("sweep_id") if isinstance(tags, Mapping) else None
    if not sweep_id:
        return None
    from trainyard.services.sweeps import group_key

    return group_key(tenant_id, str(sweep_id))


class OptimizerRound:
    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        self.cache = CandidateCache()
        # the limits of the groups the queue names (``SweepService.scheduling_groups``); None: the groups
        # only share a pool
        self.groups: Callable[[Iterable[str]], Mapping[str, JobGroup]] | None = None
        self.calibration: Calibration | None = None  # feedback-corrected predictor calibration
        self._calibration_version: int | None = None

    def set_calibration(self, calibration: Calibration | None, version: int) -> None:
        """Price rounds with ``calibration`` (step-time feedback); a new version drops the memo."""
        if version != self._calibration_version:
            self._calibration_version = version
            self.calibration = calibration
            self.cache = CandidateCache(calibrated=calibrated_predictions(calibration))

    def __call__(
        self,
        jobs: Sequence[QueuedJobView],
        pools: Sequence[Pool],
        now_s: float,
        running: Sequence[RunningJobView] = (),
        progress: dict[str, float] | None = None,
    ) -> RoundResult:
        """One round. ``running`` (optional) are the jobs holding allocations; ``progress`` (optional)
        overrides the queued jobs' done share (job id -> fraction)."""
        queued: list[QueuedJob] = []
        unplaced: dict[str, str] = {}
        quotas: dict[str, TenantQuota] = {}
        for view in jobs:
            try:
                spec = spec_from_dict(view.spec)
            except TrainyardError as exc:
                unplaced[view.job_id] = f"stored spec no longer validates: {exc.message}"
                continue
            done = (progress or {}).get(view.job_id, view.progress_fraction)
            queued.append(
                QueuedJob(
                    job_id=view.job_id,
                    tenant=view.tenant_id,
                    spec=spec,
                    submit_s=view.submitted_at_s,
                    progress_fraction=min(max(float(done), 0.0), 0.999),
                    group=job_group(view.tenant_id, view.spec),
                )
            )
            if view.tenant_max_active_devices is not None:
                # with the running jobs given, the scheduler subtracts what they hold itself
                left = view.tenant_max_active_devices
                if not running:
                    left = max(0, left - view.tenant_devices_in_use)
                quotas[view.tenant_id] = TenantQuota(max_devices=left)
        moving: list[RunningJob] = []
        for rv in running:
            try:
                spec = spec_from_dict(rv.spec)
            except TrainyardError:
                continue
            moving.append(
                RunningJob(
                    job_id=rv.job_id,
                    tenant=rv.tenant_id,
                    spec=spec,
                    submit_s=rv.submitted_at_s,
                    pool=rv.pool,
                    devices=rv.devices,
                    market=rv.market,
                    placed_s=rv.placed_s,
                    progress_fraction=min(max(rv.progress_fraction, 0.0), 0.999),
                    group=job_group(rv.tenant_id, rv.spec),
                )
            )
        if not queued and not moving:
            return RoundResult(placements={}, unplaced=unplaced)
        cfg = self.config
        if quotas:
            cfg = replace(cfg, quotas={**dict(cfg.quotas), **quotas})
        named = sorted({q.group for q in queued if q.group is not None})
        groups = dict(self.groups(named)) if self.groups is not None and named else {}
        result = schedule_round(queued, list(pools), moving, now_s, cfg, cache=self.cache, groups=groups)
        by_name = {p.name: p for p in pools}
        running_by_id = {r.job_id: r for r in moving}
        placements: dict[str, Placement] = {}
        migrations: dict[str, Migration] = {}
        for pl in result.placements:
            pool = by_name[pl.pool]
            price = pool.price_usd_per_device_hour
            placement = Placement(
                pool=pl.pool,
                devices=pl.devices,
                market=pl.market,
                accelerator=pl.accelerator,
                price_usd_per_device_hour=float(price or 0.0),
                expected_cost_usd=pl.expected_cost_usd,
                checkpoint_interval_s=pl.checkpoint_interval_s,
                reason=pl.reason,
            )
            if not pl.migration:
                placements[pl.job_id] = placement
                continue
            rj = running_by_id.get(pl.job_id)
            current = by_name.get(pl.from_pool or "")
            if rj is None or current is None:
                continue
            migrations[pl.job_id] = _migration(rj, current, pool, placement, pl.from_pool or "")
        for u in result.unplaced:
            unplaced[u.job_id] = u.reason
        return RoundResult(placements=placements, unplaced=unplaced, migrations=migrations)


def _remaining_usd(spec: JobSpec, pool: Pool, devices: int, progress: float) -> float:
    from trainyard.cost.quote import option_for

    done = min(max(progress, 0.0), 0.999)
    opt = option_for(spec, pool, devices, elapsed_fraction=done, deadline_s=math.inf)
    return float(opt.expected_cost_usd)


def _migration(
    rj: RunningJob, current: Pool, target: Pool, placement: Placement, from_pool: str
) -> Migration:
    """Savings and cost of a move, in the words the job's events keep."""
    stay = _remaining_usd(rj.spec, current, rj.devices, rj.progress_fraction)
    there = _remaining_usd(rj.spec, target, placement.devices, rj.progress_fraction)
    total = float(placement.expected_cost_usd or there)
    cost = max(0.0, total - there)
    savings = stay - there
    if savings > cost:
        reason = f"migrating to {target.name}: saves {_fmt_usd(savings)} > cost {_fmt_usd(cost)}"
    else:
        reason = f"migrating to {target.name}: {placement.reason}"
    return Migration(
        job_id=rj.job_id,
        from_pool=from_pool,
        placement=placement,
        savings_usd=savings,
        cost_usd=cost,
        reason=reason,
    )


def total_steps(spec_doc: dict[str, Any]) -> int | None:
    try:
        return int(spec_from_dict(spec_doc).total_steps)
    except (TrainyardError, ValueError, TypeError):
        return None


def progress_fraction(step: Any, total: int | None) -> float:
    if not total or not isinstance(step, int | float) or isinstance(step, bool):
        return 0.0
    return min(max(float(step) / total, 0.0), 0.999)


class ReplanningSupervisor(Supervisor):
    """The supervisor with debounced re-planning of running jobs and step-time feedback."""

    def __init__(
        self,
        *args: Any,
        feedback: Any | None = None,
        replanner: Replanner | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.feedback = feedback
        self.replanner = replanner or Replanner()
        self.migrating: dict[str, Migration] = {}  # asked to checkpoint and move; not back in the queue yet
        self.moved: dict[str, Migration] = {}  # checkpointed and queued: resume on the migration's target
        self._pools_seen: dict[str, tuple[float | None, int, str]] | None = None
        self._active_seen: set[str] | None = None
        self._queued_seen: set[str] = set()
        self._steps: dict[str, int | None] = {}
        self.last_replan: RoundResult | None = None

    # ---- control loop ----------------------------------------------------------------------------
    def tick(self) -> None:
        if self.feedback is not None:
            try:
                if self.feedback.refresh():
                    self._calibration_changed()
            except Exception:
                log.exception("feedback_refresh_failed")
        super().tick()

    def _calibration_changed(self) -> None:
        # quotes priced on the old calibration are stale (the job service memoises them per spec)
        cache = getattr(self.jobs, "_quote_cache", None)
        if isinstance(cache, dict):
            cache.clear()

    # ---- events for the Replanner ----------------------------------------------------------------
    def _observe(self, now_s: float, queued: list[Job], active: list[Job], pools: list[Pool]) -> None:
        seen = {p.name: (p.price_usd_per_device_hour, p.free_devices, str(p.market)) for p in pools}
        if self._pools_seen is not None:
            for name, (price, free, _market) in seen.items():
                old = self._pools_seen.get(name)
                if old is None:
                    self.replanner.observe(SchedulerEvent(EventKind.CAPACITY_CHANGE, now_s, pool=name))
                    continue
                if old[0] != price:
                    self.replanner.observe(
                        SchedulerEvent(
                            EventKind.PRICE_CHANGE,
                            now_s,
                            pool=name,
                            old_price_usd_per_hour=old[0],
                            new_price_usd_per_hour=price,
                        )
                    )
                if old[1] != free:
                    self.replanner.observe(SchedulerEvent(EventKind.CAPACITY_CHANGE, now_s, pool=name))
            for name in set(self._pools_seen) - set(seen):
                self.replanner.observe(SchedulerEvent(EventKind.CAPACITY_CHANGE, now_s, pool=name))
        self._pools_seen = seen
        active_ids = {j.id for j in active}
        queued_ids = {j.id for j in queued}
        if self._active_seen is not None:
            for jid in self._active_seen - active_ids:
                kind = EventKind.PREEMPTION if jid in queued_ids else EventKind.COMPLETION
                self.replanner.observe(SchedulerEvent(kind, now_s, job_id=jid))
        for job in queued:
            if job.id not in self._queued_seen and job.id not in (self._active_seen or set()):
                urgent = bool((job.spec.get("objective") or {}).get("deadline"))
                self.replanner.observe(SchedulerEvent(EventKind.ARRIVAL, now_s, job_id=job.id, urgent=urgent))
        self._active_seen = active_ids
        self._queued_seen = queued_ids
        for jid in list(self.migrating):
            if jid not in active_ids:
                mig = self.migrating.pop(jid)  # checkpointed: back in the queue (or finished)
                if jid in queued_ids:
                    self.moved[jid] = mig
        for jid in list(self.moved):
            if jid not in queued_ids:
                self.moved.pop(jid, None)

    def _total_steps(self, job: Job) -> int | None:
        if job.id not in self._steps:
            if len(self._steps) > 10_000:
                self._steps.clear()
            self._steps[job.id] = total_steps(job.spec)
        return self._steps[job.id]

    # ---- scheduling --------------------------------------------------------------------------------
    def schedule_once(self, limit: int = 500) -> RoundResult | None:
        rnd = self.schedule_round
        if not isinstance(rnd, OptimizerRound):
            return super().schedule_once(limit)
        if self.feedback is not None:
            rnd.set_calibration(self.feedback.calibration, self.feedback.version)
        now = self.clock()
        with self.db.session() as s:
            queued = JobRepo(s).list(states=[JobState.QUEUED.value], limit=limit, newest_first=False)
            active = JobRepo(s).list(states=[st.value for st in ACTIVE_STATES], limit=MAX_ACTIVE_READ)
        pools = self.pools.pools()
        self._observe(now, queued, active, pools)
        if self.moved:
            self._resume_moved(queued)
        progress = {
            j.id: progress_fraction(max((c.get("step") or 0) for c in j.checkpoints), self._total_steps(j))
            for j in queued
            if j.checkpoints
        }
        running: list[RunningJobView] = []
        due = self.replanner.due(now)
        if due:
            running = [
                RunningJobView(
                    job_id=j.id,
                    tenant_id=j.tenant_id,
                    spec=j.spec,
                    submitted_at_s=j.created_at_s,
                    pool=j.placement.pool,
                    devices=j.placement.devices,
                    market=j.placement.market,
                    placed_s=j.attempt_started_at_s if j.attempt_started_at_s is not None else now,
                    progress_fraction=progress_fraction(j.progress.get("step"), self._total_steps(j)),
                )
                for j in active
                if j.placement is not None
            ]
        self.schedule_round = functools.partial(rnd, running=running, progress=progress)
        try:
            result = super().schedule_once(limit)
            if result is None and due and running:
                result = rnd([], self.free_pools(), now, running=running)
        finally:
            self.schedule_round = rnd
        if due:
            self.replanner.planned(now)
            self.last_replan = result
        if result is not None and result.migrations:
            self._migrate(result.migrations, {p.name: p for p in pools})
        return result

    def _resume_moved(self, queued: list[Job]) -> None:
        """A job the round moved resumes on its target pool when that still has room (otherwise the
        next round places it like any queued job)."""
        free = {p.name: p for p in self.free_pools()}
        for job in queued:
            mig = self.moved.pop(job.id, None)
            if mig is None:
                continue
            pool = free.get(mig.placement.pool)
            if pool is None or pool.free_devices < mig.placement.devices:
                continue
            self._start(job.id, replace(mig.placement, reason=mig.reason), pool)
            free[pool.name] = pool.model_copy(
                update={"available_devices": pool.free_devices - mig.placement.devices}
            )

    def _migrate(self, migrations: dict[str, Migration], pools: dict[str, Pool]) -> None:
        for jid, mig in migrations.items():
            if jid in self.migrating:
                continue
            with self.db.session() as s:
                job = JobRepo(s).get(jid, for_update=True)
                if job is None or job.state != JobState.RUNNING or job.placement is None:
                    continue
                if job.placement.pool != mig.from_pool:
                    continue
                now = self.clock()
                EventRepo(s).append(
                    jid,
                    "migration",
                    {
                        "attempt": job.attempt,
                        "from_pool": mig.from_pool,
                        "to_pool": mig.placement.pool,
                        "to_accelerator": mig.placement.accelerator,
                        "to_devices": mig.placement.devices,
                        "to_market": mig.placement.market,
                        "savings_usd": round(mig.savings_usd, 6),
                        "cost_usd": round(mig.cost_usd, 6),
                        "reason": mig.reason,
                        "scheduler_reason": mig.placement.reason,
                    },
                    now,
                )
                JobRepo(s).update(jid, reason=mig.reason[:2000], updated_at_s=now)
            self.migrating[jid] = mig
            current = pools.get(mig.from_pool)
            notice = current.notice_s if current is not None and current.notice_s is not None else None
            try:
                self.executor.preempt(jid, DEFAULT_NOTICE_S if notice is None else notice)
            except Exception as exc:
                log.warning("migration_preempt_failed", job_id=jid, error=str(exc)[:500])
                self.migrating.pop(jid, None)
                continue
            log.info("migrating", job_id=jid, reason=mig.reason)

    def _start(self, job_id: str, placement: Placement, pool: Pool | None) -> None:
        with self.db.session() as s:
            before = JobRepo(s).get(job_id)
        super()._start(job_id, placement, pool)
        if before is None or before.placement is None or not before.checkpoints:
            return
        prev = before.placement
        cross = ACCELERATOR_FAMILY.get(prev.accelerator) != ACCELERATOR_FAMILY.get(placement.accelerator)
        if not cross and prev.devices == placement.devices:
            return
        with self.db.session() as s:
            job = JobRepo(s).get(job_id)
            if job is None or job.attempt != before.attempt + 1:
                return
            EventRepo(s).append(
                job_id,
                "checkpoint_conversion",
                {
                    "attempt": job.attempt,
                    "step": max((c.get("step") or 0) for c in before.checkpoints),
                    "from_pool": prev.pool,
                    "to_pool": placement.pool,
                    "from_accelerator": prev.accelerator,
                    "to_accelerator": placement.accelerator,
                    "from_devices": prev.devices,
                    "to_devices": placement.devices,
                    "cross_family": cross,
                },
                self.clock(),
            )

    # ---- feedback ----------------------------------------------------------------------------------
    def _on_started(self, s: Session, job: Job, ev: ExecutorEvent) -> None:
        super()._on_started(s, job, ev)
        if self.feedback is not None:
            self.feedback.observe_started(job, ev)

    def _on_heartbeat(self, s: Session, job: Job, ev: ExecutorEvent) -> None:
        super()._on_heartbeat(s, job, ev)
        if self.feedback is not None and job.state in ACTIVE_STATES:
            self.feedback.observe_heartbeat(job, ev)

    def _close_attempt(self, s: Session, job: Job, ended_s: float) -> dict[str, Any]:
        if self.feedback is not None and job.attempt_started_at_s is not None:
            try:
                self.feedback.attempt_closed(s, job, ended_s)
            except Exception:
                log.exception("feedback_store_failed", job_id=job.id)
        return super()._close_attempt(s, job, ended_s)
