"""Hyperparameter sweeps on the platform: create (quoted as a group), run trials as ordinary jobs,
stop losing trials by successive halving on their live step metrics, hold one dollar budget across all
trials, and register the best trial's model with lineage to the sweep.

The control loop calls :meth:`SweepService.tick` after the supervisor's phases. One tick of one sweep:

1. **Observe.** For every launched trial, the metric is read from ``job_metrics`` at each rung it has
   reached (the mean of the values logged in the last 10 % of the steps up to the rung's step, at least
   the last value logged at or before it).
2. **Halve.** A trial still running that reached a rung goes on only when it ranks in the best
   ``⌊k/η⌋`` of the ``k`` values recorded at that rung so far (:func:`trainyard.cost.sweep.promotes`);
   otherwise it is cancelled through :meth:`JobService.cancel`, the path a user's cancel takes: the
   supervisor stops its workers and charges the attempt, and its checkpoints stay where they are.
3. **Budget.** ``spent`` is what the trials' attempts have cost plus what their running attempts have
   accrued. When ``spent`` plus ``STOP_MARGIN_S`` seconds of the running trials' rates reaches
   ``budget_usd``, every running trial is cancelled and no trial starts again.
4. **Launch.** Trials start in order, at most ``max_parallel`` open at once, and only while
   ``spent`` + the predicted rest of every open trial (to its last step) + the new trial's predicted
   cost stays within the budget; a trial that can never fit is skipped.
   The scheduler then places the submitted trials as a group (:meth:`SweepService.scheduling_groups`):
   on the pool the sweep's first trial ran on, at most ``max_parallel`` running at once, and within the
   budget left by the trials' spend and the rest of the running ones (a hard row of its optimisation).
5. **Finish.** When no trial is open or waiting, the completed trial with the best final value is the
   best trial; its model (already registered by its job as ``<sweep>-tNNN@V``) is registered once more
   under the sweep's name, with the sweep, the trial and its parameters in the version's lineage.

Bound on the budget: the stop check runs every control-loop tick and a cancelled trial stops being
charged when the supervisor handles the cancel on its next tick, so with a tick shorter than
``STOP_MARGIN_S`` the sweep's spend stays within ``budget_usd``; in general it can pass it by at most
Σ (running trials' $/s) × max(0, Δ − ``STOP_MARGIN_S``), Δ being the time from one tick to the end of the
next.
"""

from __future__ import annotations

import builtins
import math
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import structlog
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from trainyard.cost.sweep import STOP_MARGIN_S, promotes, quote_sweep, rung_steps, rungs_for
from trainyard.errors import InfeasibleError, NotFoundError, TrainyardError
from trainyard.schedule.types import JobGroup
from trainyard.services.domain import Job, Principal, iso
from trainyard.services.jobs import JobService, spec_digest
from trainyard.services.lifecycle import ACTIVE_STATES, TERMINAL_STATES, JobState
from trainyard.services.quoting import quote_pools
from trainyard.spec.sweep import SweepSpec, sweep_from_dict, trial_specs
from trainyard.store.db import Database
from trainyard.store.governance_repo import GovernanceRepo
from trainyard.store.repositories import JobRepo, TenantRepo
from trainyard.store.sweep_models import SweepRow
from trainyard.store.telemetry_models import METRIC_COLUMNS, JobMetricRow

log = structlog.get_logger("trainyard.sweeps")

SMOOTH_FRACTION = 0.1  # a rung's value: the mean over the last 10 % of the steps up to it
OPEN_SWEEP_STATES = ("running", "cancelling")
MAX_LIST = 500

# a trial's states: waiting (not started) → running → completed | stopped (halving) | failed |
# cancelled (by the user, or by the budget stop) | skipped (never started: budget, or the sweep ended)


def _open(job: Job) -> bool:
    """Still running, or cancelled with its attempt not yet stopped and charged."""
    return job.state not in TERMINAL_STATES or (
        job.state == JobState.CANCELLED and job.attempt_started_at_s is not None
    )


def new_sweep_id() -> str:
    return f"sweep-{secrets.token_hex(6)}"


def _rate_usd_per_s(job: Job) -> float:
    p = job.placement
    return 0.0 if p is None else p.devices * p.price_usd_per_device_hour / 3600.0


def _job_spent_usd(job: Job, now_s: float) -> float:
    """What a job has cost: its closed attempts plus what its open attempt has accrued (a cancelled job's
    attempt stays open until the supervisor has stopped its workers and charged it)."""
    accrued = 0.0
    if job.attempt_started_at_s is not None and (
        job.state in ACTIVE_STATES or job.state == JobState.CANCELLED
    ):
        accrued = max(0.0, now_s - job.attempt_started_at_s) * _rate_usd_per_s(job)
    return float(job.cost_usd) + accrued


def _rest_usd(t: dict[str, Any], job: Job, now_s: float) -> float:
    """The predicted rest of an open trial, to its last step: its predicted cost less what it has cost, or
    what it really costs a step so far times its steps left, when that says more."""
    paid = _job_spent_usd(job, now_s)
    rest = max(0.0, float(t.get("predicted_cost_usd") or 0.0) - paid)
    done = int(t.get("last_step") or 0)
    if done > 0:
        rest = max(rest, paid / done * max(0, t["total_steps"] - done))
    return rest


def group_key(tenant_id: str, sweep_id: str) -> str:
    """The scheduler's group of a sweep's trials (a tenant's own sweep only: the key names the tenant)."""
    return f"{tenant_id}/{sweep_id}"


def _metric_values(s: Session, job_id: str, metric: str, upto_step: int) -> tuple[int | None, float | None]:
    """(last step logged, smoothed value at ``upto_step``) of a job's ``metric`` (newest attempt per step)."""
    last = s.execute(select(func.max(JobMetricRow.step)).where(JobMetricRow.job_id == job_id)).scalar()
    if last is None:
        return None, None
    window = max(1, math.ceil(upto_step * SMOOTH_FRACTION))
    q = (
        select(JobMetricRow)
        .where(JobMetricRow.job_id == job_id, JobMetricRow.step <= upto_step)
        .order_by(JobMetricRow.step.desc(), JobMetricRow.attempt.desc())
        .limit(max(window, 1) + 200)
    )
    seen: set[int] = set()
    values: list[tuple[int, float]] = []
    for row in s.scalars(q):
        if row.step in seen:
            continue
        seen.add(row.step)
        v = getattr(row, metric) if metric in METRIC_COLUMNS else (row.extra or {}).get(metric)
        if v is not None and math.isfinite(float(v)):
            values.append((row.step, float(v)))
    if not values:
        return int(last), None
    recent = [v for st, v in values if st > upto_step - window] or [values[0][1]]
    return int(last), sum(recent) / len(recent)


class SweepService:
    def __init__(
        self,
        db: Database,
        jobs: JobService,
        *,
        registry: Any = None,
        live_pools: Callable[[], list[Any]] | None = None,
        executable: Callable[[Any], bool] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.jobs = jobs
        self.registry = registry
        self._live_pools = live_pools
        self._executable = executable  # pools an executor serves (trials are priced on those first)
        self.clock = clock

    # ---- create and read ---------------------------------------------------------------------------
    def _pools(self) -> list[Any]:
        live = self._live_pools() if self._live_pools is not None else []
        return quote_pools(live, with_catalog=self.jobs.with_catalog)

    def create(self, principal: Principal, doc: dict[str, Any]) -> dict[str, Any]:
        """Validate a ``kind: Sweep`` document, check every trial against the tenant's walls, quote the
        whole search as a group and store the sweep (its trials start on the next ticks)."""
        sweep = sweep_from_dict(doc, "sweep")
        specs = trial_specs(sweep)
        for _, spec in specs:
            if self.jobs.spec_resolver is not None:
                spec = self.jobs.spec_resolver(principal, spec)
            self.jobs.check_walls(principal, spec)  # 4xx before anything is stored
        quoter = self.jobs._quoter
        q = quote_sweep(sweep, self._pools(), quoter=quoter, served=self._served())  # type: ignore[arg-type]
        infeasible = [t for t in q.trials if not t.feasible]
        if infeasible:
            raise InfeasibleError(
                f"sweep {sweep.name!r}: {q.reason}",
                hint="Widen the template's requirements or narrow the parameters to what a pool can run.",
                details={"trials": [{"name": t.name, "reason": t.reason} for t in infeasible[:20]]},
            )
        quote_doc = _finite(q.to_dict())
        steps = {t.index: t.total_steps for t in q.trials}
        trials = [
            {
                "index": t.index,
                "name": t.name,
                "parameters": t.parameters,
                "state": "waiting",
                "job_id": None,
                "total_steps": steps[t.index],
                "predicted_cost_usd": t.option.expected_cost_usd if t.option else None,
                "usd_per_step": t.option.usd_per_step if t.option else None,
                "rungs": {},
                "rung_times": {},
                "decisions": {},
                "last_step": None,
                "final_value": None,
                "cost_usd": 0.0,
                "reason": "",
            }
            for t in q.trials
        ]
        now = self.clock()
        row = SweepRow(
            id=new_sweep_id(),
            tenant_id=principal.tenant_id,
            name=sweep.name,
            state="running",
            spec={
                **sweep.model_dump(mode="json", by_alias=True, exclude={"template"}),
                "template": sweep.template.to_document(),
            },
            quote=quote_doc,
            trials=trials,
            doc={"spent_usd": 0.0, "best_trial": None, "model_version": None, "budget_stopped": False},
            reason="",
            created_at_s=now,
            updated_at_s=now,
        )
        with self.db.session() as s:
            s.add(row)
            s.flush()
            out = _document(row)
        log.info("sweep_created", sweep=out["id"], trials=len(trials), tenant=principal.tenant_name)
        return out

    def _row(self, s: Session, principal: Principal, sweep_id: str, *, for_update: bool = False) -> SweepRow:
        q = select(SweepRow).where(SweepRow.id == sweep_id, SweepRow.tenant_id == principal.tenant_id)
        if for_update:
            q = q.with_for_update()
        row = s.scalars(q).first()
        if row is None:
            raise NotFoundError(
                f"no sweep {sweep_id!r}", hint="List your sweeps with `trainyard sweeps list`."
            )
        return row

    def get(self, principal: Principal, sweep_id: str) -> dict[str, Any]:
        with self.db.session() as s:
            return _document(self._row(s, principal, sweep_id))

    def list(self, principal: Principal, *, limit: int = 100) -> builtins.list[dict[str, Any]]:
        limit = max(1, min(limit, MAX_LIST))
        with self.db.session() as s:
            rows = s.scalars(
                select(SweepRow)
                .where(SweepRow.tenant_id == principal.tenant_id)
                .order_by(SweepRow.created_at_s.desc(), SweepRow.id)
                .limit(limit)
            ).all()
            return [_document(r, with_trials=False) for r in rows]

    def cancel(self, principal: Principal, sweep_id: str) -> dict[str, Any]:
        """Stop a sweep: its running trials are cancelled on the next tick, the waiting ones never start.
        Cancelling a finished sweep changes nothing."""
        with self.db.session() as s:
            row = self._row(s, principal, sweep_id, for_update=True)
            if row.state == "running":
                row.state = "cancelling"
                row.reason = "cancelled by the user"
                row.updated_at_s = self.clock()
            out = _document(row)
        return out

    # ---- the control-loop phase ----------------------------------------------------------------------
    def tick(self) -> int:
        with self.db.session() as s:
            ids = list(s.scalars(select(SweepRow.id).where(SweepRow.state.in_(OPEN_SWEEP_STATES))))
        for sweep_id in ids:
            try:
                self.advance(sweep_id)
            except Exception:
                log.exception("sweep_tick_failed", sweep=sweep_id)
        return len(ids)

    def advance(self, sweep_id: str) -> None:
        now = self.clock()
        with self.db.session() as s:
            row = s.scalars(select(SweepRow).where(SweepRow.id == sweep_id)).one()
            sweep = sweep_from_dict(row.spec, row.id)
            trials = [dict(t) for t in row.trials]
            state, tenant_id = row.state, row.tenant_id
            quote_pool = (row.quote or {}).get("pool")
            doc = dict(row.doc)
            jobs: dict[str, Job] = {}
            repo = JobRepo(s)
            for t in trials:
                if t["job_id"]:
                    j = repo.get(t["job_id"])
                    if j is not None:
                        jobs[t["job_id"]] = j
            template_steps = max((t["total_steps"] for t in trials), default=1)
            rungs = rungs_for(sweep, len(trials), template_steps)
            # 1. observe the live metrics of every trial that ran or runs
            for t in trials:
                job = jobs.get(t["job_id"] or "")
                if job is None or t["state"] not in ("running",):
                    continue
                self._observe(s, sweep, t, job, rungs, iso(now))
        principal = self._principal(tenant_id)
        cancels: list[tuple[dict[str, Any], str, str]] = []  # (trial, new state, reason)
        # 2. successive halving on the rungs just reached
        if sweep.early_stopping is not None and state == "running":
            eta = sweep.early_stopping.reduction_factor
            for t in trials:
                job = jobs.get(t["job_id"] or "")
                if job is None or t["state"] != "running" or job.state in TERMINAL_STATES:
                    continue
                for r in sorted(int(k) for k in t["rungs"]):
                    key = str(r)
                    if key in t["decisions"] or t["rungs"][key] is None:
                        continue
                    competing = [float(o["rungs"][key]) for o in trials if o["rungs"].get(key) is not None]
                    value = float(t["rungs"][key])
                    go_on = promotes(value, competing, eta, sweep.metric.goal)
                    rank = 1 + sum(
                        1 for c in competing if (c < value if sweep.metric.goal == "minimize" else c > value)
                    )
                    t["decisions"][key] = {
                        "continue": go_on,
                        "value": value,
                        "rank": rank,
                        "of": len(competing),
                        "time": iso(now),
                    }
                    if not go_on:
                        cancels.append(
                            (
                                t,
                                "stopped",
                                f"successive halving: {sweep.metric.name} {value:.6g} at rung {r} "
                                f"ranks {rank} of {len(competing)}",
                            )
                        )
                        break
        for t, _, _ in cancels:
            t["state"] = "stopping"
        # 3. the budget across every trial
        spent = sum(_job_spent_usd(j, now) for j in jobs.values())
        running = [jobs[t["job_id"]] for t in trials if t["state"] == "running" and t["job_id"] in jobs]
        running = [j for j in running if j.state not in TERMINAL_STATES]
        budget = sweep.budget_usd
        if budget is not None and state == "running" and running:
            margin = sum(_rate_usd_per_s(j) for j in running) * STOP_MARGIN_S
            if spent + margin >= budget:
                doc["budget_stopped"] = True
                state = "cancelling"
                row_reason = (
                    f"budget: ${spent:,.4f} spent + ${margin:,.4f} for the next {STOP_MARGIN_S:g} s reaches "
                    f"the budget of ${budget:,.4f}"
                )
                doc["budget_stop"] = {"spent_usd": spent, "margin_usd": margin, "time": iso(now)}
                self._set_reason(sweep_id, row_reason)
        if state == "cancelling":
            why = "budget reached" if doc.get("budget_stopped") else "the sweep was cancelled"
            for t in trials:
                if t["state"] == "running":
                    cancels.append((t, "cancelled", why))
                    t["state"] = "stopping"
                elif t["state"] == "waiting":
                    t["state"], t["reason"] = "skipped", why
        for t, new_state, reason in cancels:
            job = jobs.get(t["job_id"] or "")
            if job is not None and job.state not in TERMINAL_STATES:
                try:
                    self.jobs.cancel(principal, job.id)
                except TrainyardError as exc:  # it ended meanwhile: its outcome is read below
                    log.info("sweep_trial_cancel_skipped", job_id=job.id, error=exc.message)
            t["state"], t["reason"] = new_state, reason
        # 4. trials that ended on their own
        with self.db.session() as s:
            for t in trials:
                if not t["job_id"]:
                    continue
                job = JobRepo(s).get(t["job_id"])
                if job is None:
                    continue
                jobs[job.id] = job
                t["cost_usd"] = round(_job_spent_usd(job, now), 6)
                if t["state"] == "running" and job.state in TERMINAL_STATES:
                    self._observe(s, sweep, t, job, rungs, iso(now))
                    if job.state == JobState.SUCCEEDED:
                        t["state"] = "completed"
                        _, final = _metric_values(s, job.id, sweep.metric.name, t["total_steps"])
                        t["final_value"] = final
                    elif job.state == JobState.FAILED:
                        t["state"], t["reason"] = "failed", job.reason
                    else:
                        t["state"], t["reason"] = "cancelled", job.reason
                if t["state"] in ("stopped", "cancelled") and job.checkpoints:
                    t["checkpoint"] = {
                        "step": job.checkpoints[-1].get("step"),
                        "path": job.checkpoints[-1].get("path"),
                    }
        spent = sum(_job_spent_usd(j, now) for j in jobs.values())
        # 5. launch the next trials within max_parallel and the budget
        if state == "running":
            spent = self._launch(sweep, sweep_id, principal, trials, jobs, spent, budget, quote_pool)
        open_trials = [
            t for t in trials if t["state"] == "waiting" or (t["job_id"] in jobs and _open(jobs[t["job_id"]]))
        ]
        finished_state: str | None = None
        if not open_trials:
            finished_state = "cancelled" if state == "cancelling" else "finished"
        with self.db.session() as s:
            row = s.scalars(select(SweepRow).where(SweepRow.id == sweep_id).with_for_update()).one()
            if row.state == "cancelling" and state == "running":
                state = "cancelling"  # a user's cancel arrived during this tick: the next one acts on it
                finished_state = None
            doc["spent_usd"] = round(spent, 6)
            if finished_state is not None:
                doc, final_state, reason = self._finish(s, row, sweep, trials, doc, finished_state)
                row.state = final_state
                if reason:
                    row.reason = reason
                log.info(
                    "sweep_finished",
                    sweep=sweep_id,
                    state=final_state,
                    spent_usd=doc["spent_usd"],
                    budget_usd=sweep.budget_usd,
                    trials={
                        k: sum(1 for t in trials if t["state"] == k) for k in {t["state"] for t in trials}
                    },
                    best=(doc.get("best_trial") or {}).get("name"),
                    model_version=doc.get("model_version"),
                )
            else:
                row.state = state
            row.trials = trials
            row.doc = doc
            row.updated_at_s = now

    def _set_reason(self, sweep_id: str, reason: str) -> None:
        with self.db.session() as s:
            row = s.scalars(select(SweepRow).where(SweepRow.id == sweep_id)).one()
            row.reason = reason

    def _observe(
        self,
        s: Session,
        sweep: SweepSpec,
        t: dict[str, Any],
        job: Job,
        rungs: Sequence[Any],
        observed_at: str | None,
    ) -> None:
        ends = rung_steps(rungs, t["total_steps"])
        last, _ = _metric_values(s, job.id, sweep.metric.name, t["total_steps"])
        if last is None:
            return
        t["last_step"] = last
        for r, end in zip(rungs[:-1], ends[:-1], strict=False):  # the last rung is the full run
            key = str(r.index)
            if key in t["rungs"] or last < end:
                continue
            _, value = _metric_values(s, job.id, sweep.metric.name, end)
            t["rungs"][key] = value
            t.setdefault("rung_times", {})[key] = observed_at  # older rows have no rung times

    def _principal(self, tenant_id: str) -> Principal:
        """The sweep's tenant as the submitter of its trials (its quotas, walls and user-code allowance)."""
        with self.db.session() as s:
            tenant = TenantRepo(s).by_id(tenant_id)
            if tenant is None:
                raise NotFoundError(f"tenant {tenant_id} is gone")
            governed = GovernanceRepo(s).has_budget(tenant_id)
        return Principal(
            tenant_id=tenant.id,
            tenant_name=tenant.name,
            key_id="sweep",
            admin=False,
            max_queued_jobs=tenant.max_queued_jobs,
            max_active_devices=tenant.max_active_devices,
            governed=governed,
            storage_roots=tuple(tenant.storage_roots or ()),
            allow_user_code=bool(tenant.allow_user_code),
        )

    def _served(self) -> set[str] | None:
        """The pools an executor serves (None: not known)."""
        if self._executable is None or self._live_pools is None:
            return None
        executable = self._executable
        return {p.name for p in self._live_pools() if executable(p)}

    def _prediction(
        self, spec_doc: dict[str, Any], fallback: tuple[float, float], pool: str | None = None
    ) -> tuple[float, float]:
        """(expected $ of the whole run, $/step) of a trial as admission quotes it: the cheapest feasible
        option on the sweep's pool (``pool``: where its trials run), else on a pool an executor serves
        (the catalog's cloud offers are priced too but never started), else the best option. The
        expected cost includes what the quote adds to the steps (start-up, checkpoints, expected
        preemption losses)."""
        quote = self.jobs.quote_for(spec_doc, spec_digest(spec_doc))
        if isinstance(quote, TrainyardError):
            return fallback
        feasible = [o for o in quote if o.get("feasible")]
        served = self._served() or set()
        mine = (
            [o for o in feasible if pool is not None and o.get("pool") == pool]
            or [o for o in feasible if o.get("pool") in served]
            or feasible
        )
        if not mine:
            return fallback
        return float(mine[0].get("expected_cost_usd") or 0.0), float(mine[0].get("usd_per_step") or 0.0)

    def _launch(
        self,
        sweep: SweepSpec,
        sweep_id: str,
        principal: Principal,
        trials: builtins.list[dict[str, Any]],
        jobs: dict[str, Job],
        spent: float,
        budget: float | None,
        quote_pool: str | None = None,
    ) -> float:
        open_jobs = [j for j in jobs.values() if j.state not in TERMINAL_STATES]
        if len(open_jobs) >= sweep.max_parallel or not any(t["state"] == "waiting" for t in trials):
            return spent
        specs = dict(enumerate(trial_specs(sweep)))
        now = self.clock()
        # the sweep's pool: where its first trial ran (the scheduler places the others there), else the
        # pool its quote priced the trials on
        placed = sorted((t["index"], jobs[t["job_id"]]) for t in trials if t.get("job_id") in jobs)
        pool = next((j.placement.pool for _, j in placed if j.placement is not None), quote_pool)
        committed = spent
        for j in open_jobs:  # the predicted rest of every open trial, to its last step
            t = next(x for x in trials if x["job_id"] == j.id)
            committed += _rest_usd(t, j, now)
        slots = sweep.max_parallel - len(open_jobs)
        for t in trials:
            if slots <= 0:
                break
            if t["state"] != "waiting":
                continue
            _, spec = specs[t["index"]]
            tags = {**spec.tags, "sweep_id": sweep_id}
            spec = spec.model_copy(update={"tags": tags})
            doc = spec.to_document()
            fallback = (float(t.get("predicted_cost_usd") or 0.0), float(t.get("usd_per_step") or 0.0))
            predicted, per_step = self._prediction(doc, fallback, pool)
            t["predicted_cost_usd"], t["usd_per_step"] = predicted, per_step
            if budget is not None and committed + predicted > budget:
                if not open_jobs:
                    t["state"] = "skipped"
                    t["reason"] = (
                        f"budget: ${committed:,.4f} committed + ${predicted:,.4f} predicted for this trial "
                        f"passes the budget of ${budget:,.4f}"
                    )
                    continue
                break  # wait: a running trial may be stopped early and leave room
            try:
                job, _ = self.jobs.submit(principal, spec, idempotency_key=f"{sweep_id}:trial:{t['index']}")
            except TrainyardError as exc:
                t["state"], t["reason"] = "failed", f"not submitted: {exc.message}"
                continue
            t["job_id"], t["state"] = job.id, "running"
            jobs[job.id] = job
            open_jobs.append(job)
            committed += predicted
            slots -= 1
        return spent

    def scheduling_groups(self, keys: Iterable[str]) -> dict[str, JobGroup]:
        """The scheduler's view of the sweeps whose trials wait in the queue (keys from :func:`group_key`):
        the pool the sweep's first started trial ran on (its later trials share it), how many more may run
        now (``max_parallel`` less the trials holding capacity), and the budget left for trials started
        now (``budget_usd`` less the spend and the predicted rest of the running trials). A key naming no
        open sweep of that tenant gets no starts."""
        wanted: dict[str, str] = {}
        for key in keys:
            tenant_id, _, sweep_id = key.partition("/")
            wanted[sweep_id] = tenant_id
        if not wanted:
            return {}
        now = self.clock()
        out: dict[str, JobGroup] = {group_key(t, sid): JobGroup(max_starts=0) for sid, t in wanted.items()}
        with self.db.session() as s:
            rows = s.scalars(select(SweepRow).where(SweepRow.id.in_(sorted(wanted)))).all()
            repo = JobRepo(s)
            for row in rows:
                if wanted[row.id] != row.tenant_id or row.state != "running":
                    continue
                spec = row.spec or {}
                trials = sorted(row.trials or [], key=lambda t: int(t["index"]))
                jobs = [(t, repo.get(t["job_id"])) for t in trials if t.get("job_id")]
                held = [  # holding capacity: starting, running, or cancelled with the attempt not yet stopped
                    (t, j)
                    for t, j in jobs
                    if j is not None
                    and (j.state in ACTIVE_STATES or (_open(j) and j.state == JobState.CANCELLED))
                ]
                pool = next((j.placement.pool for _, j in jobs if j is not None and j.placement), None)
                budget = spec.get("budget_usd")
                left = None
                if budget is not None:
                    spent = sum(_job_spent_usd(j, now) for _, j in jobs if j is not None)
                    rest = sum(_rest_usd(t, j, now) for t, j in held if j.state in ACTIVE_STATES)
                    left = float(budget) - spent - rest
                parallel = int(spec.get("max_parallel") or 1)
                out[group_key(row.tenant_id, row.id)] = JobGroup(
                    max_starts=max(0, parallel - len(held)), budget_usd=left, pool=pool
                )
        return out

    def _finish(
        self,
        s: Session,
        row: SweepRow,
        sweep: SweepSpec,
        trials: builtins.list[dict[str, Any]],
        doc: dict[str, Any],
        how: str,
    ) -> tuple[dict[str, Any], str, str]:
        done = [t for t in trials if t["state"] == "completed" and t.get("final_value") is not None]
        if not done:
            if how == "cancelled":
                return doc, "cancelled", ""
            skipped = [t["reason"] for t in trials if t["state"] == "skipped" and t.get("reason")]
            why = f"; {skipped[0]}" if skipped else ""
            return doc, "failed", f"no trial completed with a value of {sweep.metric.name}{why}"
        pick = min if sweep.metric.goal == "minimize" else max
        best = pick(done, key=lambda t: float(t["final_value"]))
        doc["best_trial"] = {
            "index": best["index"],
            "name": best["name"],
            "job_id": best["job_id"],
            "parameters": best["parameters"],
            "value": best["final_value"],
        }
        job = JobRepo(s).get(best["job_id"])
        if self.registry is not None and job is not None and job.result:
            try:
                with s.begin_nested():
                    lineage = {
                        "id": row.id,
                        "name": row.name,
                        "trial": best["index"],
                        "parameters": best["parameters"],
                        "metric": sweep.metric.name,
                        "goal": sweep.metric.goal,
                        "value": best["final_value"],
                        "trial_model_version": job.result.get("model_version"),
                    }
                    version = self.registry.register_job_output(
                        s, replace(job, name=row.name), job.result, sweep=lineage
                    )
                doc["model_version"] = version.id
            except TrainyardError as exc:
                doc["registry_error"] = exc.message
            except Exception as exc:
                log.exception("sweep_model_registration_failed", sweep=row.id)
                doc["registry_error"] = f"{type(exc).__name__}: {exc}"[:500]
        return doc, ("cancelled" if how == "cancelled" else "succeeded"), ""


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def _document(row: SweepRow, *, with_trials: bool = True) -> dict[str, Any]:
    trials = list(row.trials or [])
    counts: dict[str, int] = {}
    for t in trials:
        counts[t["state"]] = counts.get(t["state"], 0) + 1
    spec = row.spec or {}
    out: dict[str, Any] = {
        "id": row.id,
        "name": row.name,
        "state": row.state,
        "reason": row.reason,
        "method": spec.get("method"),
        "metric": spec.get("metric"),
        "early_stopping": spec.get("early_stopping"),
        "max_parallel": spec.get("max_parallel"),
        "budget_usd": spec.get("budget_usd"),
        "spent_usd": float((row.doc or {}).get("spent_usd") or 0.0),
        "budget_stopped": bool((row.doc or {}).get("budget_stopped")),
        "best_trial": (row.doc or {}).get("best_trial"),
        "model_version": (row.doc or {}).get("model_version"),
        "trial_counts": counts,
        "quote": {
            k: (row.quote or {}).get(k)
            for k in (
                "expected_cost_usd",
                "max_cost_usd",
                "expected_hours",
                "feasible",
                "reason",
                "rungs",
                "pool",
                "uncapped_cost_usd",
                "no_stopping_cost_usd",
                "budget_stop_share",
            )
        },
        "created_at": iso(row.created_at_s),
        "updated_at": iso(row.updated_at_s),
    }
    if (row.doc or {}).get("registry_error"):
        out["registry_error"] = row.doc["registry_error"]
    if with_trials:
        out["trials"] = trials
        out["spec"] = spec
    return out
