"""/v1/usage (ledger reports, invoices, reconciliation) and /v1/budgets (dollar budgets, alerts)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from trainyard.api.auth import AdminPrincipal, CurrentPrincipal
from trainyard.api.schemas import ErrorEnvelope

router = APIRouter(tags=["usage"])
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorEnvelope},
    403: {"model": ErrorEnvelope},
    404: {"model": ErrorEnvelope},
    422: {"model": ErrorEnvelope},
    429: {"model": ErrorEnvelope},
}
TenantName = Annotated[str, Path(min_length=1, max_length=63, description="Tenant name")]
DateQ = Annotated[str | None, Query(max_length=40, description="YYYY-MM-DD (UTC) or an ISO-8601 timestamp")]


def _gov(request: Request) -> Any:
    return request.app.state.platform.governance


@router.get("/v1/usage", responses=ERRORS, summary="Usage from the ledger, grouped")
async def usage(
    request: Request,
    principal: CurrentPrincipal,
    by: Annotated[
        str,
        Query(
            max_length=120,
            description="tenant, tag:KEY, model, deployment, accelerator, market, pool, kind, job or day",
        ),
    ] = "tenant",
    from_: Annotated[DateQ, Query(alias="from")] = None,
    to: DateQ = None,
    tenant: Annotated[str | None, Query(max_length=63, description="Only this tenant")] = None,
) -> JSONResponse:
    doc = await run_in_threadpool(
        _gov(request).usage, principal, by=by, from_=from_, to=to, tenant_name=tenant
    )
    return JSONResponse(doc)


@router.get("/v1/usage/invoice", responses=ERRORS, summary="A tenant's monthly invoice from the ledger")
async def invoice(
    request: Request,
    principal: CurrentPrincipal,
    tenant: Annotated[str | None, Query(max_length=63, description="Default: the caller's tenant")] = None,
    month: Annotated[str | None, Query(max_length=7, pattern=r"^\d{4}-\d{2}$")] = None,
) -> JSONResponse:
    return JSONResponse(await run_in_threadpool(_gov(request).invoice, principal, tenant, month))


@router.get(
    "/v1/usage/reconcile",
    responses={**ERRORS, 500: {"model": ErrorEnvelope, "description": "The ledger disagrees"}},
    summary="Check that the ledger and every job's cost_usd (and every budget's spent) agree (admin)",
)
async def reconcile(request: Request, principal: AdminPrincipal) -> JSONResponse:
    return JSONResponse(await run_in_threadpool(_gov(request).reconcile, principal))


class BudgetSet(BaseModel):
    model_config = ConfigDict(extra="forbid")
    usd: float = Field(ge=0, le=1e12, description="The budget in dollars per period")
    period: str = Field(default="month", pattern="^(month|day)$")
    hard: bool = Field(default=False, description="Refuse submissions and stop work at the limit")
    tag: str | None = Field(
        default=None, max_length=300, pattern=r"^[^=]+=.+$", description="One tag value, e.g. team=support"
    )


@router.put(
    "/v1/budgets/{tenant}",
    responses=ERRORS,
    tags=["budgets"],
    summary="Set a tenant's (or one tag value's) budget for a period (admin)",
)
async def set_budget(
    tenant: TenantName, body: BudgetSet, request: Request, _p: AdminPrincipal
) -> JSONResponse:
    doc = await run_in_threadpool(
        lambda: _gov(request).set_budget(
            tenant, usd=body.usd, period=body.period, hard=body.hard, tag=body.tag
        )
    )
    return JSONResponse(doc)


@router.get(
    "/v1/budgets", responses=ERRORS, tags=["budgets"], summary="Budgets (the caller's tenant; admin: all)"
)
async def list_budgets(
    request: Request,
    principal: CurrentPrincipal,
    tenant: Annotated[str | None, Query(max_length=63)] = None,
) -> JSONResponse:
    rows = await run_in_threadpool(_gov(request).list_budgets, principal, tenant)
    return JSONResponse({"budgets": rows})


@router.get("/v1/budgets/{tenant}", responses=ERRORS, tags=["budgets"], summary="One budget with its spend")
async def get_budget(
    tenant: TenantName,
    request: Request,
    principal: CurrentPrincipal,
    tag: Annotated[str | None, Query(max_length=300)] = None,
    period: Annotated[str, Query(pattern="^(month|day)$")] = "month",
) -> JSONResponse:
    doc = await run_in_threadpool(lambda: _gov(request).get_budget(principal, tenant, tag=tag, period=period))
    return JSONResponse(doc)


@router.get(
    "/v1/budgets/{tenant}/events",
    responses=ERRORS,
    tags=["budgets"],
    summary="Budget events: alerts at 50/80/100 %, stops and resumes",
)
async def budget_events(tenant: TenantName, request: Request, principal: CurrentPrincipal) -> JSONResponse:
    rows = await run_in_threadpool(_gov(request).events, principal, tenant)
    return JSONResponse({"events": rows})
