"""/v1/deployments: serve registered model versions (DESIGN §3.9). Tenant-scoped: another tenant's
deployment answers 404."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from trainyard.api.auth import CurrentPrincipal
from trainyard.api.schemas import DeploymentDoc, DeploymentList, ErrorEnvelope
from trainyard.serving.autoscale import AutoscalingPolicy
from trainyard.serving.service import deployment_document
from trainyard.serving.traffic import CanaryPolicy

router = APIRouter(prefix="/v1/deployments", tags=["deployments"])
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorEnvelope},
    404: {"model": ErrorEnvelope},
    409: {"model": ErrorEnvelope},
    422: {"model": ErrorEnvelope},
}
DeploymentName = Annotated[str, Path(min_length=1, max_length=63, description="Deployment name")]
ModelRef = Annotated[str, Field(min_length=3, max_length=200, examples=["tiny@1", "tiny@production"])]


class DeploymentCreate(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"name": "chat", "model": "tiny@1"}]}
    )
    name: Annotated[str, Field(min_length=1, max_length=63)]
    model: ModelRef
    min_replicas: Annotated[int, Field(ge=0, le=64)] = 1
    max_replicas: Annotated[int, Field(ge=1, le=64)] | None = None
    target_in_flight: Annotated[float, Field(gt=0, le=1024)] = 4.0
    scale_up_delay_s: Annotated[float, Field(ge=0, le=3600)] = 0.0
    scale_down_delay_s: Annotated[float, Field(ge=0, le=86400)] = 30.0
    cold_start_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 120.0
    engine: Literal["transformers", "vllm"] = "transformers"
    tags: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=256)]] = Field(
        default_factory=dict
    )


class RouteIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: ModelRef
    weight: Annotated[float, Field(ge=0, le=1e6)] = 0.0
    shadow: bool = False
    canary: bool = False


class CanaryIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_error_rate: Annotated[float, Field(ge=0, le=1)] = 0.05
    max_p95_latency_s: Annotated[float, Field(gt=0, le=3600)] | None = None
    window_s: Annotated[float, Field(gt=0, le=86400)] = 60.0
    min_requests: Annotated[int, Field(ge=1, le=100000)] = 10


class TrafficUpdate(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "routes": [
                        {"model": "tiny@1", "weight": 90},
                        {"model": "tiny@2", "weight": 10, "canary": True},
                    ]
                }
            ]
        },
    )
    routes: Annotated[list[RouteIn], Field(min_length=1, max_length=16)]
    canary: CanaryIn | None = None


def _openai_url(request: Request) -> str:
    return str(request.base_url).rstrip("/") + "/openai/v1"


def _service(request: Request) -> Any:
    return request.app.state.platform.serving


@router.post("", status_code=201, response_model=DeploymentDoc, responses=ERRORS, summary="Deploy a model")
async def create_deployment(
    body: DeploymentCreate, request: Request, principal: CurrentPrincipal
) -> JSONResponse:
    svc = _service(request)
    policy = AutoscalingPolicy(
        min_replicas=body.min_replicas,
        max_replicas=body.max_replicas if body.max_replicas is not None else max(1, body.min_replicas),
        target_in_flight=body.target_in_flight,
        scale_up_delay_s=body.scale_up_delay_s,
        scale_down_delay_s=body.scale_down_delay_s,
        cold_start_timeout_s=body.cold_start_timeout_s,
    )

    def work() -> dict[str, Any]:
        row = svc.create(
            principal.tenant_id,
            principal.tenant_name,
            body.name,
            body.model,
            policy=policy,
            tags=body.tags,
            engine=body.engine,
        )
        return deployment_document(svc, row, _openai_url(request))

    return JSONResponse(await run_in_threadpool(work), status_code=201)


@router.get("", response_model=DeploymentList, responses=ERRORS, summary="The tenant's deployments")
async def list_deployments(request: Request, principal: CurrentPrincipal) -> JSONResponse:
    svc = _service(request)

    def work() -> dict[str, Any]:
        url = _openai_url(request)
        return {"deployments": [deployment_document(svc, r, url) for r in svc.list(principal.tenant_id)]}

    return JSONResponse(await run_in_threadpool(work))


@router.get("/{name}", response_model=DeploymentDoc, responses=ERRORS, summary="One deployment")
async def get_deployment(name: DeploymentName, request: Request, principal: CurrentPrincipal) -> JSONResponse:
    svc = _service(request)

    def work() -> dict[str, Any]:
        return deployment_document(svc, svc.get(principal.tenant_id, name), _openai_url(request))

    return JSONResponse(await run_in_threadpool(work))


@router.put(
    "/{name}/traffic",
    response_model=DeploymentDoc,
    responses=ERRORS,
    summary="Set the routes: weights (A/B), shadows, a canary with automatic rollback",
)
async def set_traffic(
    name: DeploymentName, body: TrafficUpdate, request: Request, principal: CurrentPrincipal
) -> JSONResponse:
    svc = _service(request)
    canary = CanaryPolicy(**body.canary.model_dump()) if body.canary is not None else None

    def work() -> dict[str, Any]:
        row = svc.set_traffic(
            principal.tenant_id,
            principal.tenant_name,
            name,
            [r.model_dump() for r in body.routes],
            canary=canary,
        )
        return deployment_document(svc, row, _openai_url(request))

    return JSONResponse(await run_in_threadpool(work))


@router.get(
    "/{name}/shadow-report",
    responses=ERRORS,
    summary="Primary and shadow answers to the same requests: latency, tokens, agreement",
)
async def shadow_report(name: DeploymentName, request: Request, principal: CurrentPrincipal) -> JSONResponse:
    svc = _service(request)

    def work() -> dict[str, Any]:
        row = svc.get(principal.tenant_id, name)
        return {"deployment": row.name, **svc.shadow_report(row)}

    return JSONResponse(await run_in_threadpool(work))


@router.delete(
    "/{name}", status_code=204, responses=ERRORS, summary="Delete a deployment (its replicas stop)"
)
async def delete_deployment(name: DeploymentName, request: Request, principal: CurrentPrincipal) -> Response:
    svc = _service(request)
    await run_in_threadpool(svc.delete, principal.tenant_id, name)
    return Response(status_code=204)
