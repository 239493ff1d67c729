"""/v1/evaluations: run (as a job), get, list."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from trainyard.api.auth import CurrentPrincipal
from trainyard.api.schemas import ErrorEnvelope, EvaluationDoc, EvaluationList

router = APIRouter(prefix="/v1/evaluations", tags=["evaluations"])

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorEnvelope, "description": "Missing or wrong API key"},
    404: {"model": ErrorEnvelope, "description": "No such evaluation, model or dataset for this tenant"},
    422: {"model": ErrorEnvelope, "description": "Invalid input; `details.errors` names each field"},
}


class GuardrailDataset(BaseModel):
    dataset: str = Field(min_length=1, max_length=500, examples=["ds://safety@2"])
    split: str = Field(default="eval", max_length=32)
    metric: str = Field(default="loss", max_length=64, description="The guarded metric (default loss).")
    margin: float = Field(gt=0, description="Non-inferiority margin in the metric's units.", examples=[0.05])


class EvaluationRequest(BaseModel):
    model: str = Field(min_length=3, max_length=200, examples=["my-finetune@2"])
    baseline: str | None = Field(default=None, max_length=200, description="Default: the model's base.")
    dataset: str = Field(min_length=1, max_length=500, examples=["ds://support@3"])
    split: str = Field(default="eval", max_length=32)
    max_examples: int | None = Field(default=None, ge=1, le=100_000)
    guardrails: dict[str, float] | None = Field(
        default=None, description="Thresholds: latency_s_per_token, cost_usd_per_1k_tokens."
    )
    primary_metric: str | None = Field(
        default=None,
        max_length=64,
        description="The metric that must be significantly better for the gate (default: loss).",
    )
    non_inferiority: dict[str, float] | None = Field(
        default=None,
        max_length=32,
        description="Guardrail metrics and their margins in the metric's units, e.g. {exact_match: 0.02}: "
        "each must be shown non-inferior within its margin (one-sided test at alpha).",
        examples=[{"exact_match": 0.02}],
    )
    alpha: float | None = Field(default=None, gt=0, lt=0.5, description="Significance level (default 0.05).")
    correction: Literal["holm", "none"] | None = Field(
        default=None, description="Multiple-comparison correction across the guardrails (default holm)."
    )
    guardrail_datasets: list[GuardrailDataset] | None = Field(
        default=None,
        max_length=16,
        description="Other dataset versions the model and the baseline are also run on (in the same "
        "job); on each the metric must be non-inferior within its margin. One family with the "
        "non_inferiority guardrails for the correction.",
    )


def _platform(request: Request) -> Any:
    return request.app.state.platform


@router.post(
    "",
    status_code=201,
    response_model=EvaluationDoc,
    responses=ERRORS,
    summary="Evaluate a model against a baseline",
)
def run_evaluation(body: EvaluationRequest, request: Request, principal: CurrentPrincipal) -> JSONResponse:
    doc = _platform(request).evaluations.create(
        principal,
        model=body.model,
        baseline=body.baseline,
        dataset=body.dataset,
        split=body.split,
        max_examples=body.max_examples,
        guardrails=body.guardrails,
        primary_metric=body.primary_metric,
        non_inferiority=body.non_inferiority,
        alpha=body.alpha,
        correction=body.correction,
        guardrail_datasets=(
            [g.model_dump() for g in body.guardrail_datasets] if body.guardrail_datasets else None
        ),
    )
    return JSONResponse(doc, status_code=201, headers={"Location": f"/v1/evaluations/{doc['id']}"})


@router.get("", response_model=EvaluationList, responses=ERRORS, summary="List evaluations, newest first")
def list_evaluations(
    request: Request,
    principal: CurrentPrincipal,
    model: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> JSONResponse:
    docs = _platform(request).evaluations.list(principal, model=model, limit=limit)
    return JSONResponse({"evaluations": docs})


@router.get(
    "/{eval_id}",
    response_model=EvaluationDoc,
    responses=ERRORS,
    summary="One evaluation with its paired statistics",
)
def get_evaluation(
    eval_id: Annotated[str, Path(min_length=1, max_length=40)], request: Request, principal: CurrentPrincipal
) -> JSONResponse:
    return JSONResponse(_platform(request).evaluations.get(principal, eval_id))
