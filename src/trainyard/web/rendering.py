"""What every dashboard page shares: the Jinja environment and its filters (money and durations from
``trainyard.cost.money``), security headers, the logged-in principal from the session cookie, the CSRF
check for anything that changes state, and small form helpers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from trainyard.cost.money import format_duration_s, format_usd
from trainyard.errors import PermissionDeniedError
from trainyard.services.domain import Principal, iso
from trainyard.web.session import COOKIE_NAME, Session, SessionStore

TEMPLATES = Path(__file__).parent / "templates"
MAX_FORM_BYTES = 262_144  # a pasted spec is a few kB
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
    "script-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def fmt_usd(v: float | None) -> str:
    """Dollars for people (``$0.00056``, ``$12.40``, ``$1,234``); ``–`` when unknown."""
    if v is None or not isinstance(v, int | float) or not math.isfinite(v):
        return "–"
    return format_usd(float(v))


def fmt_duration_s(v: float | None) -> str:
    """A duration for people (``45 s``, ``15 min``, ``4.5 h``); ``–`` when unknown."""
    if v is None or not isinstance(v, int | float) or not math.isfinite(v):
        return "–"
    return format_duration_s(max(0.0, float(v)))


def fmt_num(v: Any, digits: int = 4) -> str:
    """A measured number with ``digits`` significant digits; never an exponent below 1e-4."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "–"
        if v != 0 and abs(v) < 1e-4:
            return f"{v:.2e}"
        return f"{v:.{digits}g}"
    return str(v)


def fmt_pct(v: float | None) -> str:
    if v is None or not math.isfinite(v):
        return "–"
    return f"{v:.0f} %"


def to_json_script(value: Any) -> Markup:
    """JSON for a ``<script type="application/json">`` block: ``<``, ``>`` and ``&`` are escaped so that
    no text inside can close the element."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False, default=str)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return Markup(text)


env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(["html"]))
env.filters["usd"] = fmt_usd
env.filters["duration"] = fmt_duration_s
env.filters["iso"] = iso
env.filters["num"] = fmt_num
env.filters["pct"] = fmt_pct
env.filters["json_script"] = to_json_script


def sessions(request: Request) -> SessionStore:
    store: SessionStore = request.app.state.web_sessions
    return store


def current_session(request: Request) -> Session | None:
    token = request.cookies.get(COOKIE_NAME)
    sess = sessions(request).get(token)
    if sess is None:
        return None
    # a session lives only as long as the key it was opened with (revoked → logged out)
    if not request.app.state.platform.tenants.key_active(sess.principal.key_id):
        sessions(request).close(token)
        return None
    request.state.tenant = sess.principal.tenant_name
    request.state.web_session = sess
    return sess


def current(request: Request) -> Principal | None:
    sess = current_session(request)
    return sess.principal if sess is not None else None


def can_act(principal: Principal | None) -> bool:
    """Viewers read; members and admins may act (the API's rule, ``trainyard.api.auth``)."""
    return principal is not None and principal.effective_role != "viewer"


def require_actor(principal: Principal) -> None:
    if not can_act(principal):
        raise PermissionDeniedError(
            "this API key has the viewer role: it can read, not change anything",
            hint="Log in with a member or admin key to act.",
        )


def render(
    request: Request, template: str, status: int = 200, principal: Principal | None = None, **ctx: Any
) -> HTMLResponse:
    sess: Session | None = getattr(request.state, "web_session", None)
    html = env.get_template(template).render(
        request_path=request.url.path,
        principal=principal,
        csrf_token=sess.csrf if sess is not None and principal is not None else "",
        can_act=can_act(principal),
        **ctx,
    )
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def json_response(doc: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(doc, status_code=status, headers=SECURITY_HEADERS)


def not_found(request: Request, principal: Principal | None, message: str) -> HTMLResponse:
    return render(request, "error.html", 404, principal, title="Not found", message=message)


def error_page(
    request: Request, principal: Principal | None, status: int, message: str, hint: str = ""
) -> HTMLResponse:
    titles = {400: "Bad request", 403: "Not allowed", 409: "Conflict", 413: "Too large", 422: "Bad request"}
    return render(
        request,
        "error.html",
        status,
        principal,
        title=titles.get(status, "Error"),
        message=message,
        hint=hint,
    )


def to_login(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(
        f"/login?next={quote(target, safe='')}", status_code=303, headers=SECURITY_HEADERS
    )


def redirect(path: str) -> RedirectResponse:
    return RedirectResponse(path, status_code=303, headers=SECURITY_HEADERS)


class FormTooLarge(Exception):
    """The browser sent more than MAX_FORM_BYTES."""


def safe_next(value: str | None) -> str:
    """Only a local path may follow the login (no open redirect)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value


async def read_form(request: Request, max_fields: int = 40) -> dict[str, list[str]]:
    """The url-encoded form, every value of each field (a traffic form repeats ``model``/``weight``)."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise FormTooLarge()
    return parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True, max_num_fields=max_fields)


def first(form: dict[str, list[str]], key: str, default: str = "") -> str:
    values = form.get(key)
    return values[0] if values else default


def csrf_ok(request: Request, form: dict[str, list[str]] | None = None) -> bool:
    """The request carries the session's CSRF token (form field or header)."""
    sess: Session | None = getattr(request.state, "web_session", None)
    if sess is None:
        return False
    sent = request.headers.get(CSRF_HEADER) or (first(form, CSRF_FIELD) if form is not None else "")
    return sess.csrf_ok(sent)


async def posted_form(
    request: Request, max_fields: int = 40
) -> tuple[Principal, dict[str, list[str]]] | RedirectResponse | HTMLResponse:
    """The signed-in principal and the form of an action POST, or the response that ends the request:
    the login page, 413 for a form too large, 403 without the session's CSRF token."""
    principal = current(request)
    if principal is None:
        return to_login(request)
    try:
        form = await read_form(request, max_fields=max_fields)
    except FormTooLarge:
        return error_page(request, principal, 413, "The form is too large.")
    if not csrf_ok(request, form):
        return error_page(request, principal, 403, "The form expired; reload the page and retry.")
    return principal, form


def now_s(request: Request) -> float:
    return float(request.app.state.platform.options.clock())
