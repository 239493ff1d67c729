"""Dashboard pages (server-rendered HTML). Browser auth is a session cookie opened by the login form; every
page shows only the logged-in tenant's jobs, and a job of another tenant is a 404 page like any unknown id.
"""

from __future__ import annotations

import structlog
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from trainyard.errors import AuthenticationError, NotFoundError, TrainyardError
from trainyard.services.domain import iso
from trainyard.services.lifecycle import TERMINAL_STATES
from trainyard.web import actions, charts, views
from trainyard.web.events import describe
from trainyard.web.rendering import (
    SECURITY_HEADERS,
    FormTooLarge,
    csrf_ok,
    current,
    error_page,
    first,
    json_response,
    not_found,
    now_s,
    posted_form,
    read_form,
    redirect,
    render,
    safe_next,
    sessions,
    to_login,
)
from trainyard.web.session import COOKIE_NAME

log = structlog.get_logger("trainyard.web")

STATE_COLORS = {
    "pending": "#9ca3af",
    "queued": "#d97706",
    "starting": "#60a5fa",
    "running": "#2563eb",
    "preempted": "#ea580c",
    "succeeded": "#16a34a",
    "failed": "#dc2626",
    "cancelled": "#6b7280",
}
MAX_TRACE_ROWS = 300
MAX_EVENTS_SHOWN = 500
LIVE_POLL_S = 2.0  # how often an open job page asks for news
NOTICES = {
    "cancelled": "The job was cancelled.",
    "preempted": "A preemption notice was sent; the job checkpoints, goes back in the queue and resumes.",
    "promoted": "The alias was moved.",
    "traffic": "The traffic routes were changed.",
}

router = APIRouter(include_in_schema=False)


def notice(request: Request) -> str | None:
    return NOTICES.get(request.query_params.get("done", ""))


# ---- login / logout ------------------------------------------------------------------------------
@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, next: str | None = None) -> Response:
    if current(request) is not None:
        return RedirectResponse(safe_next(next), status_code=303)
    return render(request, "login.html", next=safe_next(next), error=None)


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    try:
        form = await read_form(request)
    except FormTooLarge:
        return render(request, "login.html", 413, next="/", error="The form is too large.")
    target = safe_next(first(form, "next"))
    key = first(form, "api_key").strip()
    try:
        principal = request.app.state.platform.tenants.authenticate(key)
    except AuthenticationError:
        log.info("dashboard_login_failed")
        return render(request, "login.html", 401, next=target, error="That API key is not valid.")
    sess = sessions(request).open(principal)
    request.state.tenant = principal.tenant_name
    log.info("dashboard_login", tenant=principal.tenant_name)
    resp = RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)
    resp.set_cookie(
        COOKIE_NAME,
        sess.token,
        max_age=int(sessions(request).ttl_s),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return resp


@router.post("/logout")
async def logout(request: Request) -> Response:
    if current(request) is not None:
        try:
            form = await read_form(request)
        except FormTooLarge:
            form = {}
        if not csrf_ok(request, form):
            return error_page(request, current(request), 403, "The form expired; reload the page and retry.")
    sessions(request).close(request.cookies.get(COOKIE_NAME))
    resp = RedirectResponse("/login", status_code=303, headers=SECURITY_HEADERS)
    resp.delete_cookie(COOKIE_NAME, path="/", httponly=True, samesite="strict")
    return resp


# ---- pages ---------------------------------------------------------------------------------------
@router.get("/", response_class=HTMLResponse)
def jobs_overview(request: Request, state: str | None = None, cursor: str | None = None) -> Response:
    principal = current(request)
    if principal is None:
        return to_login(request)
    platform = request.app.state.platform
    try:
        data = views.overview(platform, principal, state=state, cursor=cursor, now_s=now_s(request))
    except TrainyardError as exc:
        return error_page(request, principal, exc.http_status, exc.message)
    alerts = []
    evaluate = getattr(request.app.state, "evaluate_alerts", None)
    if evaluate is not None:
        alerts = [a for a in evaluate(principal.tenant_id) if a.tenant_id in (None, principal.tenant_id)]
    bars = [(st, float(n)) for st, n in data["counts"].items() if n]
    counts_chart = charts.bars(
        "state-counts",
        title="Jobs by state",
        unit="jobs",
        values=bars,
        colors=[STATE_COLORS.get(st, "#6b7280") for st, _ in bars],
    )
    return render(request, "jobs.html", principal=principal, counts_chart=counts_chart, alerts=alerts, **data)


def _job_charts(d: views.JobDetail) -> dict[str, dict[str, object]]:
    loss = [(f"attempt {a}", charts.downsample(pts)) for a, pts in sorted(d.loss_by_attempt.items())]
    if d.eval_loss:
        loss.append(("eval loss", charts.downsample(d.eval_loss)))
    breakdown = {"start-up": 0.0, "checkpoints": 0.0, "lost work": 0.0, "compute": 0.0}
    for a in d.attempts:
        breakdown["start-up"] += a.startup_usd
        breakdown["checkpoints"] += a.checkpoint_usd
        breakdown["lost work"] += a.lost_work_usd
        breakdown["compute"] += a.compute_usd
    return {
        "loss": charts.line(
            "loss-chart", title="Training loss", x_label="step", y_label="loss", series=loss or [("loss", [])]
        ),
        "step": charts.line(
            "step-time-chart",
            title="Step time: predicted vs measured",
            x_label="step",
            y_label="step time (s)",
            y_unit="s",
            series=[("measured", charts.downsample(d.step_times))],
            hlines=[("predicted", d.predicted_step_time_s)],
        ),
        "cost": charts.bars("cost-chart", title="Cost breakdown", unit="USD", values=list(breakdown.items())),
    }


@router.get("/jobs/{job_id}/live")
def job_live(request: Request, job_id: str, after: int = 0, since_step: int = 0) -> Response:
    """What changed on a job page since event ``after`` (JSON, for the page's polling)."""
    principal = current(request)
    if principal is None:
        return json_response({"error": {"code": "unauthenticated", "message": "log in again"}}, 401)
    try:
        doc = views.live_update(
            request.app.state.platform,
            principal,
            job_id,
            after_event=max(0, after),
            since_step=max(0, min(since_step, 2**31)),
            now_s=now_s(request),
        )
    except NotFoundError:
        return json_response({"error": {"code": "not_found", "message": "no such job"}}, 404)
    return json_response(doc)


@router.get("/jobs/{job_id:path}", response_class=HTMLResponse)
def job_page(request: Request, job_id: str) -> Response:
    principal = current(request)
    if principal is None:
        return to_login(request)
    try:
        d = views.job_detail(request.app.state.platform, principal, job_id, now_s(request))
    except NotFoundError:
        return not_found(request, principal, f"There is no job {job_id[:64]!r} in your jobs.")
    ratio = (
        d.measured_step_time_s / d.predicted_step_time_s
        if d.measured_step_time_s and d.predicted_step_time_s
        else None
    )
    events = [describe(e.id, e.kind, e.data, e.time_s) for e in reversed(d.events[-MAX_EVENTS_SHOWN:])]
    live = {
        "url": f"/jobs/{d.job.id}/live",
        "after": d.events[-1].id if d.events else 0,
        "since_step": d.since_step,
        "poll_s": LIVE_POLL_S,
        "terminal": d.job.state in TERMINAL_STATES,
    }
    return render(
        request,
        "job.html",
        principal=principal,
        d=d,
        job=d.job,
        row=d.row,
        charts=_job_charts(d),
        ratio=ratio,
        events=events,
        events_total=len(d.events),
        live=live,
        notice=notice(request),
        terminal=d.job.state in TERMINAL_STATES,
    )


async def _job_action(request: Request, job_id: str, what: str) -> Response:
    posted = await posted_form(request)
    if not isinstance(posted, tuple):
        return posted
    principal, _form = posted
    platform = request.app.state.platform
    from starlette.concurrency import run_in_threadpool

    try:
        if what == "cancel":
            await run_in_threadpool(actions.cancel_job, platform, principal, job_id)
        else:
            await run_in_threadpool(actions.preempt_job, platform, principal, job_id)
    except NotFoundError:
        return not_found(request, principal, f"There is no job {job_id[:64]!r} in your jobs.")
    except TrainyardError as exc:
        return error_page(request, principal, exc.http_status, exc.message)
    log.info("dashboard_job_action", action=what, job_id=job_id, tenant=principal.tenant_name)
    return redirect(f"/jobs/{job_id}?done={'cancelled' if what == 'cancel' else 'preempted'}")


@router.post("/jobs/{job_id}/cancel")
async def job_cancel(request: Request, job_id: str) -> Response:
    return await _job_action(request, job_id, "cancel")


@router.post("/jobs/{job_id}/preempt")
async def job_preempt(request: Request, job_id: str) -> Response:
    return await _job_action(request, job_id, "preempt")


@router.get("/pools", response_class=HTMLResponse)
def pools_page(request: Request) -> Response:
    principal = current(request)
    if principal is None:
        return to_login(request)
    rows = views.pools_view(request.app.state.platform)
    util = charts.bars(
        "pool-use",
        title="Devices in use",
        unit="devices",
        values=[(r["name"], float(r["in_use"])) for r in rows],
    )
    return render(request, "pools.html", principal=principal, pools=rows, util_chart=util)


EXAMPLE_SPEC = """\
apiVersion: trainyard/v1
kind: TrainingJob
name: tiny-cpu
model: {architecture: decoder, n_layers: 2, d_model: 64, n_heads: 4, vocab_size: 256}
workload: {seq_len: 64, global_batch: 4, steps: 200, precision: fp32}
requirements: {allow: [cpu]}
"""


@router.get("/quote", response_class=HTMLResponse)
def quote_page(request: Request) -> Response:
    principal = current(request)
    if principal is None:
        return to_login(request)
    return render(request, "quote.html", principal=principal, spec_text=EXAMPLE_SPEC, result=None, error=None)


@router.post("/quote", response_class=HTMLResponse)
async def quote_submit(request: Request) -> Response:
    principal = current(request)
    if principal is None:
        return to_login(request)
    try:
        form = await read_form(request)
    except FormTooLarge:
        return render(
            request, "quote.html", 413, principal, spec_text="", result=None, error="The spec is too large."
        )
    if not csrf_ok(request, form):
        return error_page(request, principal, 403, "The form expired; reload the page and retry.")
    text = first(form, "spec")
    from starlette.concurrency import run_in_threadpool

    try:
        result = await run_in_threadpool(views.quote_view, request.app.state.platform, text)
    except TrainyardError as exc:
        return render(
            request,
            "quote.html",
            422,
            principal,
            spec_text=text,
            result=None,
            error=exc.message,
            hint=exc.hint,
            field_errors=exc.details.get("errors") or [],
        )
    return render(request, "quote.html", principal=principal, spec_text=text, result=result, error=None)


@router.get("/traces", response_class=HTMLResponse)
def traces_page(request: Request) -> Response:
    """The newest spans of the in-process trace buffer (admins only; others get the 404 page)."""
    principal = current(request)
    if principal is None:
        return to_login(request)
    if not principal.admin:
        return not_found(request, principal, "There is no page here.")
    buf = getattr(request.app.state, "trace_buffer", None)
    spans = []
    for s in reversed(buf.spans()[-MAX_TRACE_ROWS:] if buf is not None else []):
        start, end = s.start_time or 0, s.end_time or s.start_time or 0
        spans.append(
            {
                "name": s.name,
                "start": iso(start / 1e9),
                "duration_ms": (end - start) / 1e6,
                "ok": s.status.is_ok,
                "trace_id": f"{s.context.trace_id:032x}" if s.context else "",
                "attributes": dict(s.attributes or {}),
            }
        )
    return render(request, "traces.html", principal=principal, spans=spans, enabled=buf is not None)
