"""Dashboard pages (server-rendered HTML). Browser auth is a session cookie opened by the login form; every
page shows only the logged-in tenant's jobs, and a job of another tenant is a 404 page like any unknown id.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

import structlog
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from trainyard.errors import AuthenticationError, NotFoundError, TrainyardError
from trainyard.services.domain import Principal, iso
from trainyard.services.lifecycle import TERMINAL_STATES
from trainyard.web import charts, views
from trainyard.web.session import COOKIE_NAME, SessionStore

log = structlog.get_logger("trainyard.web")

TEMPLATES = Path(__file__).parent / "templates"
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
REFRESH_S = 15  # pages with live jobs reload themselves
MAX_FORM_BYTES = 262_144  # a pasted spec is a few kB
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
    "script-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

router = APIRouter(include_in_schema=False)

env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(["html"]))
env.filters["usd"] = views.fmt_usd
env.filters["duration"] = views.fmt_duration_s
env.filters["iso"] = iso


def _num(v: Any, digits: int = 4) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "–"
        return f"{v:.{digits}g}"
    return str(v)


env.filters["num"] = _num


def sessions(request: Request) -> SessionStore:
    store: SessionStore = request.app.state.web_sessions
    return store


def render(
    request: Request, template: str, status: int = 200, principal: Principal | None = None, **ctx: Any
) -> HTMLResponse:
    html = env.get_template(template).render(request_path=request.url.path, principal=principal, **ctx)
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def not_found(request: Request, principal: Principal | None, message: str) -> HTMLResponse:
    return render(request, "error.html", 404, principal, title="Not found", message=message)


def current(request: Request) -> Principal | None:
    token = request.cookies.get(COOKIE_NAME)
    sess = sessions(request).get(token)
    if sess is None:
        return None
    # a session lives only as long as the key it was opened with (revoked → logged out)
    if not request.app.state.platform.tenants.key_active(sess.principal.key_id):
        sessions(request).close(token)
        return None
    request.state.tenant = sess.principal.tenant_name
    return sess.principal


def to_login(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(
        f"/login?next={quote(target, safe='')}", status_code=303, headers=SECURITY_HEADERS
    )


class FormTooLarge(Exception):
    """The browser sent more than MAX_FORM_BYTES."""


def safe_next(value: str | None) -> str:
    """Only a local path may follow the login (no open redirect)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value


async def read_form(request: Request) -> dict[str, str]:
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise FormTooLarge()
    parsed = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True, max_num_fields=20)
    return {k: v[0] for k, v in parsed.items() if v}


def now_s(request: Request) -> float:
    return float(request.app.state.platform.options.clock())


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
    target = safe_next(form.get("next"))
    key = (form.get("api_key") or "").strip()
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
def logout(request: Request) -> Response:
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
        return render(
            request, "error.html", exc.http_status, principal, title="Bad request", message=exc.message
        )
    alerts = []
    evaluate = getattr(request.app.state, "evaluate_alerts", None)
    if evaluate is not None:
        alerts = [a for a in evaluate(principal.tenant_id) if a.tenant_id in (None, principal.tenant_id)]
    bars = [(st, float(n)) for st, n in data["counts"].items() if n]
    counts_svg = Markup(
        charts.bar_chart(
            bars,
            title="Jobs by state",
            unit="jobs",
            chart_id="state-counts",
            colors=[STATE_COLORS.get(st, "#6b7280") for st, _ in bars],
        )
    )
    return render(
        request,
        "jobs.html",
        principal=principal,
        counts_svg=counts_svg,
        alerts=alerts,
        refresh_s=REFRESH_S if data["open"] else None,
        **data,
    )


@router.get("/jobs/{job_id:path}", response_class=HTMLResponse)
def job_page(request: Request, job_id: str) -> Response:
    principal = current(request)
    if principal is None:
        return to_login(request)
    try:
        d = views.job_detail(request.app.state.platform, principal, job_id, now_s(request))
    except NotFoundError:
        return not_found(request, principal, f"There is no job {job_id[:64]!r} in your jobs.")
    loss = [charts.Series(f"attempt {a}", pts) for a, pts in sorted(d.loss_by_attempt.items())] or [
        charts.Series("loss", [])
    ]
    loss_svg = Markup(
        charts.line_chart(
            [charts.Series(s.label, charts.downsample(s.points)) for s in loss],
            x_label="step",
            y_label="loss",
            title="Training loss",
            chart_id="loss-chart",
        )
    )
    hlines = []
    if d.predicted_step_time_s is not None:
        hlines.append(charts.HLine("predicted", d.predicted_step_time_s, "#dc2626"))
    step_svg = Markup(
        charts.line_chart(
            [charts.Series("measured", charts.downsample(d.step_times))],
            x_label="step",
            y_label="step time (s)",
            title="Step time: predicted vs measured",
            hlines=hlines,
            chart_id="step-time-chart",
        )
    )
    ratio = (
        d.measured_step_time_s / d.predicted_step_time_s
        if d.measured_step_time_s and d.predicted_step_time_s
        else None
    )
    breakdown = {"start-up": 0.0, "checkpoints": 0.0, "lost work": 0.0, "compute": 0.0}
    for a in d.attempts:
        breakdown["start-up"] += a.startup_usd
        breakdown["checkpoints"] += a.checkpoint_usd
        breakdown["lost work"] += a.lost_work_usd
        breakdown["compute"] += a.compute_usd
    cost_svg = Markup(
        charts.bar_chart(
            [(k, v) for k, v in breakdown.items()], title="Cost breakdown", unit="USD", chart_id="cost-chart"
        )
    )
    events = d.events[-500:]
    return render(
        request,
        "job.html",
        principal=principal,
        d=d,
        job=d.job,
        row=d.row,
        loss_svg=loss_svg,
        step_svg=step_svg,
        cost_svg=cost_svg,
        ratio=ratio,
        breakdown=breakdown,
        events=list(reversed(events)),
        events_total=len(d.events),
        refresh_s=None if d.job.state in TERMINAL_STATES else REFRESH_S,
    )


@router.get("/pools", response_class=HTMLResponse)
def pools_page(request: Request) -> Response:
    principal = current(request)
    if principal is None:
        return to_login(request)
    rows = views.pools_view(request.app.state.platform)
    util = [(r["name"], float(r["in_use"])) for r in rows]
    util_svg = Markup(charts.bar_chart(util, title="Devices in use", unit="devices", chart_id="pool-use"))
    return render(request, "pools.html", principal=principal, pools=rows, util_svg=util_svg)


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
    text = form.get("spec", "")
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


def dashboard_404(request: Request) -> HTMLResponse:
    return not_found(request, current(request), "There is no page here.")


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
