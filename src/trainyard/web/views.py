"""What the dashboard pages show, computed from the control plane's public services and repositories.

Every function takes the platform and the logged-in principal and reads only that tenant's jobs; a job
of another tenant is not found. Nothing here writes.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from trainyard.errors import NotFoundError, StorageNotAllowedError, TrainyardError
from trainyard.services.domain import Job, JobEvent, Principal, iso
from trainyard.services.execution import attempt_cost_usd
from trainyard.services.lifecycle import ACTIVE_STATES, TERMINAL_STATES, JobState
from trainyard.store.repositories import JobRepo
from trainyard.web.rendering import fmt_usd

MAX_EVENTS = 200_000  # a job page reads at most this many events (~23 days of heartbeats every 10 s)
JOBS_PAGE = 50
LIVE_EVENTS_PAGE = 5000  # events one poll of the live endpoint reads at most
LIVE_EVENT_ROWS = 200  # of which the newest are sent for the event log
MAX_CHECKPOINTS_CHECKED = 200  # the newest checkpoints whose manifests a job page looks for
MAX_CURVE_POINTS = 2000  # step metrics per curve on a page (downsampled by the database beyond)


def total_steps(job: Job) -> int | None:
    """Steps of the whole run: reported by the workers, else derived from the spec."""
    reported = job.progress.get("total_steps")
    if isinstance(reported, int | float) and reported > 0:
        return int(reported)
    workload = job.spec.get("workload") or {}
    if workload.get("steps"):
        return int(workload["steps"])
    try:
        from trainyard.spec.loader import spec_from_dict

        return spec_from_dict(job.spec).workload.total_steps()
    except (TrainyardError, AssertionError, ValueError, TypeError):
        return None


def cost_so_far_usd(job: Job, now_s: float) -> float:
    """Closed attempts' cost plus the running attempt's cost up to now."""
    running = 0.0
    if job.attempt_started_at_s is not None and job.state in ACTIVE_STATES:
        _, running = attempt_cost_usd(job.placement, job.attempt_started_at_s, now_s)
    return job.cost_usd + running


@dataclass(frozen=True)
class JobRow:
    id: str
    name: str
    state: str
    placement: str
    cost_usd: float
    step: int | None
    total_steps: int | None
    progress_fraction: float | None
    attempt: int
    created_at: str | None
    reason: str


def job_row(job: Job, now_s: float) -> JobRow:
    steps = total_steps(job)
    step = job.progress.get("step")
    step_i = int(step) if isinstance(step, int | float) else None
    if job.state == JobState.SUCCEEDED and steps:
        step_i = steps if step_i is None else step_i
    frac = min(1.0, step_i / steps) if steps and step_i is not None else None
    p = job.placement
    placement = f"{p.pool} · {p.devices}× {p.accelerator} ({p.market})" if p else "–"
    return JobRow(
        id=job.id,
        name=job.name,
        state=job.state.value,
        placement=placement,
        cost_usd=cost_so_far_usd(job, now_s),
        step=step_i,
        total_steps=steps,
        progress_fraction=frac,
        attempt=job.attempt,
        created_at=iso(job.created_at_s),
        reason=job.reason,
    )


def state_counts(platform: Any, principal: Principal) -> dict[str, int]:
    """Jobs per state of the tenant: one grouped query."""
    from sqlalchemy import func, select

    from trainyard.store.models import JobRow as JobTable

    with platform.db.session() as s:
        found = {
            str(st): int(n)
            for st, n in s.execute(
                select(JobTable.state, func.count())
                .where(JobTable.tenant_id == principal.tenant_id)
                .group_by(JobTable.state)
            )
        }
    return {st.value: found.get(st.value, 0) for st in JobState}


def overview(
    platform: Any,
    principal: Principal,
    *,
    state: str | None,
    cursor: str | None,
    now_s: float,
) -> dict[str, Any]:
    states = [state] if state in {s.value for s in JobState} else None
    page = platform.jobs.list(principal, states=states, cursor=cursor, limit=JOBS_PAGE)
    counts = state_counts(platform, principal)
    return {
        "counts": counts,
        "total": sum(counts.values()),
        "open": sum(n for st, n in counts.items() if JobState(st) not in TERMINAL_STATES),
        "rows": [job_row(j, now_s) for j in page.jobs],
        "next_cursor": page.next_cursor,
        "state_filter": states[0] if states else None,
    }


# ---- one job -------------------------------------------------------------------------------------
@dataclass
class AttemptCost:
    attempt: int
    pool: str
    devices: int
    price_usd_per_device_hour: float
    started_s: float | None
    ended_s: float | None
    outcome: str
    total_usd: float
    startup_usd: float = 0.0
    checkpoint_usd: float = 0.0
    lost_work_usd: float = 0.0
    running: bool = False

    @property
    def compute_usd(self) -> float:
        return max(0.0, self.total_usd - self.startup_usd - self.checkpoint_usd - self.lost_work_usd)

    @property
    def duration_s(self) -> float | None:
        if self.started_s is None or self.ended_s is None:
            return None
        return max(0.0, self.ended_s - self.started_s)


@dataclass
class JobDetail:
    job: Job
    row: JobRow
    events: list[JobEvent]
    loss_by_attempt: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    step_times: list[tuple[float, float]] = field(default_factory=list)
    predicted_step_time_s: float | None = None
    predicted_source: str = ""
    measured_step_time_s: float | None = None
    attempts: list[AttemptCost] = field(default_factory=list)
    quote_best: dict[str, Any] | None = None
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    runner_ups: list[dict[str, Any]] = field(default_factory=list)
    eval_loss: list[tuple[float, float]] = field(default_factory=list)
    curve_source: str = ""
    since_step: int = 0  # the step metrics a live page has (poll for later ones)


def _predicted(job: Job, platform: Any = None) -> tuple[float | None, str, dict[str, Any] | None]:
    """The step time predicted for the allocation the job is on (else, before any placement, the best
    quoted option). The stored quote keeps only the best options; when the job's pool × devices is not
    among them, that allocation is priced again (``trainyard.cost.quote.option_for`` on the live pool or
    catalog offer), so a measured step time is never compared with another accelerator's prediction."""
    quote = [o for o in (job.quote or []) if o.get("feasible")]
    pl = job.placement
    if pl is not None:
        for o in quote:
            if o.get("pool") == pl.pool and int(o.get("devices") or 0) == pl.devices:
                return float(o["step_time_s"]), f"quote for {pl.pool} × {pl.devices}", o
        repriced = _reprice_placement(job, platform) if platform is not None else None
        if repriced is not None:
            return float(repriced["step_time_s"]), f"predicted for {pl.pool} × {pl.devices}", repriced
        return None, f"no prediction for {pl.pool} × {pl.devices}", None
    if not quote:
        return None, "", None
    best = quote[0]
    st = best.get("step_time_s")
    return (float(st) if st is not None else None), f"best quoted option ({best.get('pool')})", best


def _reprice_placement(job: Job, platform: Any) -> dict[str, Any] | None:
    """The quote option of the job's own pool × devices, priced now (None when the pool is gone)."""
    from trainyard.cost.quote import option_for
    from trainyard.errors import TrainyardError
    from trainyard.services.quoting import option_document, quote_pools
    from trainyard.spec.loader import spec_from_dict

    pl = job.placement
    assert pl is not None
    try:
        pools = quote_pools(platform.pools.pools(), with_catalog=platform.options.with_catalog)
        pool = next((p for p in pools if p.name == pl.pool), None)
        if pool is None:
            return None
        opt = option_for(spec_from_dict(job.spec), pool, pl.devices)
    except (TrainyardError, ValueError):
        return None
    if opt.step_time_s <= 0:
        return None
    return option_document(opt)


def _attempt_costs(job: Job, events: list[JobEvent], now_s: float) -> list[AttemptCost]:
    """Split each attempt's dollars into start-up, checkpoint stalls, lost work and useful compute, as far
    as the events say: start-up runs from placement to the first heartbeat or start, checkpoint stalls are
    the workers' reported ``stall_s``, lost work is the time since the last checkpoint of an attempt that
    was preempted, failed or lost."""
    placed: dict[int, tuple[float, dict[str, Any]]] = {}
    first_progress: dict[int, float] = {}
    stalls_s: dict[int, float] = {}
    last_ckpt: dict[int, float] = {}
    closed: dict[int, tuple[float, dict[str, Any]]] = {}
    outcome: dict[int, str] = {}
    for e in events:
        a = int(e.data.get("attempt") or 0)
        if e.kind == "placement":
            placed[a] = (e.time_s, e.data)
        elif e.kind in ("started", "heartbeat") and a not in first_progress:
            first_progress[a] = e.time_s
        elif e.kind == "checkpoint":
            stalls_s[a] = stalls_s.get(a, 0.0) + float(e.data.get("stall_s") or 0.0)
            last_ckpt[a] = e.time_s
        elif e.kind == "cost":
            closed[a] = (e.time_s, e.data)
        elif e.kind in ("preempted", "failed", "lost"):
            outcome[a] = e.kind
    out: list[AttemptCost] = []
    for a in sorted(set(placed) | set(closed)):
        start_s, pdata = placed.get(a, (None, {}))
        devices = int(pdata.get("devices") or (job.placement.devices if job.placement else 0) or 0)
        price = float(pdata.get("price_usd_per_device_hour") or 0.0)
        pool = str(pdata.get("pool") or "")
        running = False
        if a in closed:
            end_s, cdata = closed[a]
            total = float(cdata.get("usd") or 0.0)
            price = float(cdata.get("price_usd_per_device_hour") or price)
            pool = str(cdata.get("pool") or pool)
        elif a == job.attempt and job.state in ACTIVE_STATES:
            end_s, running = now_s, True
            total = cost_so_far_usd(job, now_s) - job.cost_usd
        else:
            continue
        rate = devices * price / 3600.0  # dollars per wall second of this attempt
        res = AttemptCost(
            attempt=a,
            pool=pool,
            devices=devices,
            price_usd_per_device_hour=price,
            started_s=start_s,
            ended_s=end_s,
            outcome="running" if running else outcome.get(a, "finished" if a == job.attempt else "ended"),
            total_usd=total,
            running=running,
        )
        if start_s is not None:
            up = first_progress.get(a, end_s if outcome.get(a) else start_s)
            res.startup_usd = min(total, max(0.0, up - start_s) * rate)
        res.checkpoint_usd = min(total - res.startup_usd, stalls_s.get(a, 0.0) * rate)
        if outcome.get(a) in ("preempted", "failed", "lost"):
            since = last_ckpt.get(a, first_progress.get(a, start_s))
            if since is not None:
                res.lost_work_usd = min(
                    total - res.startup_usd - res.checkpoint_usd, max(0.0, end_s - since) * rate
                )
        if a == job.attempt and job.state == JobState.FAILED and a not in outcome:
            res.outcome = "failed"
        out.append(res)
    return out


def read_events(db: Any, job_id: str, limit: int = MAX_EVENTS, after_id: int = 0) -> list[JobEvent]:
    """A job's events after ``after_id``, oldest first, read as plain rows (no ORM objects: a long job
    has many)."""
    import orjson
    from sqlalchemy import Text, select, type_coerce

    from trainyard.store.models import JobEventRow

    # the JSON column read as its text and parsed by orjson: several times faster than the generic
    # JSON type for the thousands of heartbeats of a long job (PostgreSQL's driver hands back dicts)
    q = (
        select(JobEventRow.id, JobEventRow.kind, type_coerce(JobEventRow.data, Text), JobEventRow.time_s)
        .where(JobEventRow.job_id == job_id, JobEventRow.id > after_id)
        .order_by(JobEventRow.id)
        .limit(limit)
    )
    with db.session() as s:
        return [
            JobEvent(
                id=i,
                job_id=job_id,
                kind=k,
                data=(orjson.loads(d) if isinstance(d, str | bytes) else d) or {},
                time_s=t,
            )
            for i, k, d, t in s.execute(q)
        ]


def _curves(
    events: list[JobEvent],
) -> tuple[dict[int, list[tuple[float, float]]], list[tuple[float, float]], dict[int, list[float]]]:
    """Loss per attempt, step times, and the measured step times per attempt from heartbeats."""
    loss: dict[int, dict[float, float]] = {}
    step_times: list[tuple[float, float]] = []
    measured: dict[int, list[float]] = {}
    for e in events:
        if e.kind != "heartbeat":
            continue
        a = int(e.data.get("attempt") or 0)
        step, value, st = e.data.get("step"), e.data.get("loss"), e.data.get("step_time_s")
        if isinstance(step, int | float) and isinstance(value, int | float) and math.isfinite(value):
            loss.setdefault(a, {})[float(step)] = float(value)  # a step reported twice keeps its last value
        if isinstance(step, int | float) and isinstance(st, int | float) and st > 0:
            step_times.append((float(step), float(st)))
            measured.setdefault(a, []).append(float(st))
    return {a: sorted(pts.items()) for a, pts in loss.items()}, sorted(step_times), measured


def _metric_curves(
    points: list[dict[str, Any]],
) -> tuple[
    dict[int, list[tuple[float, float]]],
    list[tuple[float, float]],
    dict[int, list[float]],
    list[tuple[float, float]],
]:
    """Loss per attempt, step times, measured step times per attempt and eval loss from the step
    metrics of ``GET /v1/jobs/{id}/metrics`` (``TrainingMetricsService.curve``)."""
    loss: dict[int, list[tuple[float, float]]] = {}
    step_times: list[tuple[float, float]] = []
    measured: dict[int, list[float]] = {}
    eval_loss: list[tuple[float, float]] = []
    for p in points:
        step, a = float(p["step"]), int(p.get("attempt") or 0)
        if isinstance(p.get("loss"), float) and math.isfinite(p["loss"]):
            loss.setdefault(a, []).append((step, p["loss"]))
        st = p.get("step_time_s")
        if isinstance(st, float) and st > 0:
            step_times.append((step, st))
            measured.setdefault(a, []).append(st)
        if isinstance(p.get("eval_loss"), float) and math.isfinite(p["eval_loss"]):
            eval_loss.append((step, p["eval_loss"]))
    return loss, step_times, measured, eval_loss


def step_metrics(platform: Any, principal: Principal, job_id: str, since_step: int = 0) -> dict[str, Any]:
    """The job's step metrics after ``since_step`` (downsampled to MAX_CURVE_POINTS)."""
    doc: dict[str, Any] = platform.training_metrics.curve(
        principal, job_id, since_step=since_step, max_points=MAX_CURVE_POINTS
    )
    return doc


def existing_checkpoints(platform: Any, principal: Principal, job: Job) -> list[dict[str, Any]]:
    """The job's checkpoints that still exist for loading: their step directory holds a committed
    ``manifest.json`` (DESIGN §3.4). Retention deletes older steps, so the job's list of written
    checkpoints says more than there is. Paths outside the tenant's storage are never looked at."""
    import fsspec

    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for c in reversed(job.checkpoints[-MAX_CHECKPOINTS_CHECKED:]):
        path = str(c.get("path") or "").rstrip("/")
        if not path or path in seen:
            continue
        seen.add(path)
        try:
            url = platform.storage_policy.check(
                principal.tenant_name, path, extra_roots=principal.storage_roots, purpose="checkpoint"
            )
            fs, root = fsspec.core.url_to_fs(url)
            if not fs.exists(f"{root.rstrip('/')}/manifest.json"):
                continue
        except (StorageNotAllowedError, OSError, ValueError, ImportError):
            continue
        out.append({"step": c.get("step"), "attempt": c.get("attempt"), "path": path})
    return out


def runner_ups(job: Job, limit: int = 3) -> list[dict[str, Any]]:
    """The next-best feasible options of the quote stored at submission (the placement's own pool ×
    devices left out), with how much more each was expected to cost."""
    pl = job.placement
    chosen_cost = pl.expected_cost_usd if pl is not None else None
    out = []
    for o in job.quote or []:
        if not o.get("feasible"):
            continue
        if pl is not None and o.get("pool") == pl.pool and int(o.get("devices") or 0) == pl.devices:
            continue
        cost = o.get("expected_cost_usd")
        extra = (
            float(cost) - float(chosen_cost)
            if isinstance(cost, int | float) and isinstance(chosen_cost, int | float)
            else None
        )
        out.append({**o, "extra_cost_usd": extra})
        if len(out) >= limit:
            break
    return out


def job_detail(platform: Any, principal: Principal, job_id: str, now_s: float) -> JobDetail:
    if not job_id or len(job_id) > 64:
        raise NotFoundError(f"no job {job_id[:64]!r}")
    job = platform.jobs.get(principal, job_id)  # raises NotFoundError for another tenant's job
    events = read_events(platform.db, job.id)
    detail = JobDetail(job=job, row=job_row(job, now_s), events=events)
    metrics = step_metrics(platform, principal, job.id)
    if metrics["points"]:  # step metrics at training resolution
        detail.loss_by_attempt, detail.step_times, measured, detail.eval_loss = _metric_curves(
            metrics["points"]
        )
        detail.curve_source = "step metrics" + (
            f" (averaged over {metrics['bucket_steps']} steps per point)" if metrics["downsampled"] else ""
        )
    else:  # workers that report heartbeats only
        detail.loss_by_attempt, detail.step_times, measured = _curves(events)
        detail.curve_source = "heartbeats"
    detail.since_step = int(metrics["next_since_step"] or 0)
    # the latest attempt's steps, the ones run on the placement the prediction below is for
    detail.measured_step_time_s = statistics.median(measured[max(measured)]) if measured else None
    detail.predicted_step_time_s, detail.predicted_source, detail.quote_best = _predicted(job, platform)
    detail.attempts = _attempt_costs(job, events, now_s)
    detail.checkpoints = existing_checkpoints(platform, principal, job)
    detail.runner_ups = runner_ups(job)
    return detail


def live_update(
    platform: Any, principal: Principal, job_id: str, *, after_event: int, since_step: int, now_s: float
) -> dict[str, Any]:
    """What changed on a job page since event ``after_event`` and step ``since_step``: state, progress,
    cost, the new points of the curves (step metrics, or heartbeats from workers that send no step
    metrics), the new events (readable) and the checkpoints that exist now."""
    from trainyard.web.events import describe

    if not job_id or len(job_id) > 64:
        raise NotFoundError(f"no job {job_id[:64]!r}")
    job = platform.jobs.get(principal, job_id)
    events = read_events(platform.db, job.id, limit=LIVE_EVENTS_PAGE, after_id=after_event)
    metrics = step_metrics(platform, principal, job.id, since_step)
    eval_loss: list[tuple[float, float]] = []
    if metrics["points"] or metrics["attempts"]:
        loss, step_times, _, eval_loss = _metric_curves(metrics["points"])
    else:
        loss, step_times, _ = _curves(events)
    row = job_row(job, now_s)
    return {
        "id": job.id,
        "state": job.state.value,
        "reason": job.reason,
        "terminal": job.state in TERMINAL_STATES,
        "attempt": job.attempt,
        "step": row.step,
        "total_steps": row.total_steps,
        "progress": row.progress_fraction,
        "cost_usd": row.cost_usd,
        "cost_text": fmt_usd(row.cost_usd),
        "loss": {str(a): [[x, y] for x, y in pts] for a, pts in loss.items()},
        "step_times": [[x, y] for x, y in step_times],
        "eval_loss": [[x, y] for x, y in eval_loss],
        "next_since_step": int(metrics["next_since_step"] or since_step),
        "events": [
            describe(e.id, e.kind, e.data, e.time_s).to_dict() for e in reversed(events[-LIVE_EVENT_ROWS:])
        ],
        "checkpoints": existing_checkpoints(platform, principal, job),
        "next_after": events[-1].id if events else after_event,
        "more": len(events) >= LIVE_EVENTS_PAGE or not metrics["complete"],
    }


# ---- pools ---------------------------------------------------------------------------------------
def pools_view(platform: Any) -> list[dict[str, Any]]:
    with platform.db.session() as s:
        used = JobRepo(s).devices_in_use(by="pool")
    from trainyard.services.pools import executor_serves, pool_backend, pool_from_record

    rows = []
    ex = platform.options.executor
    for rec in platform.pools.list():
        d = rec.doc
        pool = pool_from_record(rec)
        total = int(d.get("nodes", 1)) * int(d.get("devices_per_node", 1))
        available = d.get("available_devices")
        free_now = (total if available is None else int(available)) - used.get(rec.name, 0)
        rows.append(
            {
                "name": rec.name,
                "accelerator": d.get("accelerator"),
                "market": d.get("market"),
                "cloud": d.get("cloud") or "–",
                "region": d.get("region"),
                "instance_type": d.get("instance_type") or "–",
                "nodes": d.get("nodes"),
                "devices_per_node": d.get("devices_per_node"),
                "total_devices": total,
                "available_devices": total if available is None else int(available),
                "in_use": used.get(rec.name, 0),
                "free_now": max(0, free_now),
                "price_usd_per_device_hour": d.get("price_usd_per_device_hour"),
                "interruption_rate_per_hour": d.get("interruption_rate_per_hour"),
                "source": rec.source,
                "updated_at": iso(rec.updated_at_s),
                "backend": pool_backend(pool, ex),
                "executable": executor_serves(ex, pool),
            }
        )
    return rows


# ---- quotes --------------------------------------------------------------------------------------
MAX_QUOTE_ROWS = 60


def quote_view(platform: Any, text: str) -> dict[str, Any]:
    """Quote a pasted spec on the live pools (and the packaged catalog when the platform uses it)."""
    from trainyard.services.quoting import cost_quote, option_document, quote_pools
    from trainyard.spec.loader import load_spec_text

    spec = load_spec_text(text, source="pasted spec")
    pools = quote_pools(platform.pools.pools(), with_catalog=platform.options.with_catalog)
    options = (platform.options.quoter or cost_quote)(spec, pools)
    docs = [option_document(o) for o in options]
    feasible = [d for d in docs if d.get("feasible")]
    infeasible = [d for d in docs if not d.get("feasible")]
    reasons: dict[str, int] = {}
    for d in infeasible:
        key = str(d.get("reason") or "infeasible")
        reasons[key] = reasons.get(key, 0) + 1
    return {
        "spec_name": spec.name,
        "options": feasible[:MAX_QUOTE_ROWS],
        "feasible_total": len(feasible),
        "infeasible_total": len(infeasible),
        "infeasible_reasons": sorted(reasons.items(), key=lambda kv: -kv[1])[:15],
        "pools_considered": len(pools),
    }
