"""Dashboard pages for the model lifecycle: datasets, models (versions, aliases, lineage), evaluations,
deployments and usage; and the actions users expect there (promote an alias, change traffic). Every
page shows the logged-in tenant's resources only; another tenant's is the same 404 page as a missing
one, and every change goes through the services (and permission rules) the API uses."""

from __future__ import annotations

from typing import Any

import structlog
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from starlette.concurrency import run_in_threadpool

from trainyard.errors import NotFoundError, TrainyardError
from trainyard.web import actions, lifecycle
from trainyard.web.rendering import (
    current,
    error_page,
    first,
    not_found,
    posted_form,
    redirect,
    render,
    to_login,
)
from trainyard.web.routes import notice

log = structlog.get_logger("trainyard.web")
router = APIRouter(include_in_schema=False)


def _openai_url(request: Request) -> str:
    return str(request.base_url).rstrip("/") + "/openai/v1"


# ---- datasets ------------------------------------------------------------------------------------
@router.get("/datasets", response_class=HTMLResponse)
def datasets_page(request: Request) -> Response:
    principal = current(request)
    if principal is None:
        return to_login(request)
    groups = lifecycle.datasets_view(request.app.state.platform, principal)
    return render(request, "datasets.html", principal=principal, groups=groups)


@router.get("/datasets/{ref}", response_class=HTMLResponse)
def dataset_page(request: Request, ref: str) -> Response:
    principal = current(request)
    if principal is None:
        return to_login(request)
    try:
        d = lifecycle.dataset_view(request.app.state.platform, principal, ref)
    except (NotFoundError, TrainyardError):
        return not_found(request, principal, f"There is no dataset version {ref[:120]!r} in your datasets.")
    return render(request, "dataset.html", principal=principal, **d)


# ---- models --------------------------------------------------------------------------------------
@router.get("/models", response_class=HTMLResponse)
def models_page(request: Request, name: str | None = None, offset: str | None = None) -> Response:
    principal = current(request)
    if principal is None:
        return to_login(request)
    try:
        page = lifecycle.models_page(
            request.app.state.platform,
            principal,
            name=(name or "")[:100] or None,
            offset=lifecycle.page_offset(offset),
        )
    except TrainyardError as exc:
        return error_page(request, principal, exc.http_status, exc.message)
    return render(request, "models.html", principal=principal, page=page)


@router.get("/models/{ref}", response_class=HTMLResponse)
def model_page(request: Request, ref: str, offset: str | None = None) -> Response:
    principal = current(request)
    if principal is None:
        return to_login(request)
    try:
        d = lifecycle.model_view(
            request.app.state.platform, principal, ref[:200], offset=lifecycle.page_offset(offset)
        )
    except NotFoundError:
        return not_found(request, principal, f"There is no model {ref[:200]!r} in your models.")
    except TrainyardError as exc:
        return error_page(request, principal, exc.http_status, exc.message)
    return render(request, "model.html", principal=principal, notice=notice(request), **d)


@router.post("/models/{ref}/promote")
async def model_promote(request: Request, ref: str) -> Response:
    posted = await posted_form(request)
    if not isinstance(posted, tuple):
        return posted
    principal, form = posted
    alias = first(form, "alias").strip()
    evaluation = first(form, "evaluation").strip() or None
    try:
        doc: dict[str, Any] = await run_in_threadpool(
            actions.promote, request.app.state.platform, principal, ref[:200], alias, evaluation=evaluation
        )
    except NotFoundError:
        return not_found(request, principal, f"There is no model {ref[:200]!r} in your models.")
    except TrainyardError as exc:
        return error_page(request, principal, exc.http_status, exc.message, exc.hint or "")
    log.info("dashboard_promote", model=doc.get("id"), alias=alias, tenant=principal.tenant_name)
    return redirect(f"/models/{doc.get('id', ref)}?done=promoted")


# ---- evaluations ---------------------------------------------------------------------------------
@router.get("/evaluations", response_class=HTMLResponse)
def evaluations_page(request: Request, model: str | None = None) -> Response:
    principal = current(request)
    if principal is None:
        return to_login(request)
    docs = lifecycle.evaluations_view(
        request.app.state.platform, principal, model=(model or "")[:200] or None
    )
    return render(request, "evaluations.html", principal=principal, evaluations=docs, model_filter=model)


@router.get("/evaluations/{eval_id}", response_class=HTMLResponse)
def evaluation_page(request: Request, eval_id: str) -> Response:
    principal = current(request)
    if principal is None:
        return to_login(request)
    try:
        d = lifecycle.evaluation_view(request.app.state.platform, principal, eval_id)
    except NotFoundError:
        return not_found(request, principal, f"There is no evaluation {eval_id[:40]!r} in your evaluations.")
    return render(request, "evaluation.html", principal=principal, **d)


# ---- deployments ---------------------------------------------------------------------------------
@router.get("/deployments", response_class=HTMLResponse)
def deployments_page(request: Request) -> Response:
    principal = current(request)
    if principal is None:
        return to_login(request)
    docs = lifecycle.deployments_view(request.app.state.platform, principal, _openai_url(request))
    return render(request, "deployments.html", principal=principal, deployments=docs)


@router.get("/deployments/{name}", response_class=HTMLResponse)
def deployment_page(request: Request, name: str) -> Response:
    principal = current(request)
    if principal is None:
        return to_login(request)
    try:
        d = lifecycle.deployment_view(request.app.state.platform, principal, name, _openai_url(request))
    except NotFoundError:
        return not_found(request, principal, f"There is no deployment {name[:63]!r} in your deployments.")
    return render(request, "deployment.html", principal=principal, notice=notice(request), **d)


@router.post("/deployments/{name}/traffic")
async def deployment_traffic(request: Request, name: str) -> Response:
    posted = await posted_form(request, max_fields=80)
    if not isinstance(posted, tuple):
        return posted
    principal, form = posted
    try:
        routes = lifecycle.parse_traffic_form(form)
        await run_in_threadpool(actions.set_traffic, request.app.state.platform, principal, name[:63], routes)
    except NotFoundError:
        return not_found(request, principal, f"There is no deployment {name[:63]!r} in your deployments.")
    except TrainyardError as exc:
        errors = exc.details.get("errors") or []
        detail = "; ".join(f"{e.get('field')}: {e.get('message')}" for e in errors) if errors else ""
        return error_page(request, principal, exc.http_status, detail or exc.message)
    log.info("dashboard_traffic", deployment=name, tenant=principal.tenant_name)
    return redirect(f"/deployments/{name}?done=traffic")


# ---- usage ---------------------------------------------------------------------------------------
@router.get("/usage", response_class=HTMLResponse)
def usage_page(request: Request, tag: str | None = None) -> Response:
    principal = current(request)
    if principal is None:
        return to_login(request)
    try:
        d = lifecycle.usage_view(request.app.state.platform, principal, tag=(tag or "")[:100] or None)
    except TrainyardError as exc:
        return error_page(request, principal, exc.http_status, exc.message)
    return render(request, "usage.html", principal=principal, **d)


# ---- webhooks ------------------------------------------------------------------------------------
@router.get("/webhooks", response_class=HTMLResponse)
def webhooks_page(request: Request) -> Response:
    principal = current(request)
    if principal is None:
        return to_login(request)
    alerts = request.app.state.platform.alerts
    hooks = alerts.list_webhooks(principal)
    deliveries = alerts.list_deliveries(principal, limit=50)
    return render(
        request, "webhooks.html", principal=principal, webhooks=hooks, deliveries=deliveries, webhook=None
    )


@router.get("/webhooks/{webhook_id}", response_class=HTMLResponse)
def webhook_page(request: Request, webhook_id: str) -> Response:
    principal = current(request)
    if principal is None:
        return to_login(request)
    alerts = request.app.state.platform.alerts
    try:
        deliveries = alerts.list_deliveries(principal, webhook_id=webhook_id[:40], limit=200)
    except NotFoundError:
        return not_found(request, principal, f"There is no webhook {webhook_id[:40]!r} in your webhooks.")
    hook = next(h for h in alerts.list_webhooks(principal) if h["id"] == webhook_id)
    return render(
        request, "webhooks.html", principal=principal, webhooks=[hook], deliveries=deliveries, webhook=hook
    )
