"""Request bodies of the REST API; the response documents live in :mod:`trainyard.api_models` (shared
with the Python client) and are re-exported here for the routers."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from trainyard.api_models import (
    AcceleratorList,
    ApiKeyDoc,
    ApiKeyList,
    CheckpointDoc,
    CodeUploaded,
    DatasetDoc,
    DatasetEpochCost,
    DatasetList,
    DatasetRows,
    DeploymentDoc,
    DeploymentList,
    ErrorBody,
    ErrorEnvelope,
    EvaluationDoc,
    EvaluationList,
    EventDoc,
    EventList,
    JobDocument,
    JobList,
    LogChunk,
    MetricPoint,
    MetricsDocument,
    ModelList,
    ModelVersionDoc,
    PlacementDoc,
    PoolDoc,
    PoolList,
    QuoteOptionDoc,
    QuoteResponse,
    ResultDoc,
    SweepDoc,
    SweepList,
    TenantCreated,
    TenantDoc,
    TenantList,
    WhoAmI,
    WorkerDoc,
)
from trainyard.catalog.pools import Pool
from trainyard.enums import PoolBackend
from trainyard.spec.models import JobSpec

EXAMPLE_SPEC: dict[str, Any] = {
    "apiVersion": "trainyard/v1",
    "kind": "TrainingJob",
    "name": "tiny-cpu",
    "model": {"architecture": "decoder", "n_layers": 2, "d_model": 64, "n_heads": 4, "vocab_size": 256},
    "workload": {"seq_len": 64, "global_batch": 4, "steps": 20, "precision": "fp32"},
    "requirements": {"allow": ["cpu"]},
}


class SubmitJobRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"spec": EXAMPLE_SPEC}]})
    spec: JobSpec


class QuoteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"spec": EXAMPLE_SPEC}]})
    spec: JobSpec
    pools: Annotated[list[Pool] | None, Field(max_length=1000)] = None
    include_catalog: bool = Field(True, description="Also price the packaged cloud catalog.")


class PoolPatch(BaseModel):
    """Fields of a live pool that change at run time."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"available_devices": 2, "price_usd_per_device_hour": 0.7}]},
    )
    nodes: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    available_devices: Annotated[int, Field(ge=0, le=1_000_000_000)] | None = None
    price_usd_per_device_hour: Annotated[float, Field(ge=0, le=1e6)] | None = None
    interruption_rate_per_hour: Annotated[float, Field(ge=0, le=1000)] | None = None
    notice_s: Annotated[float, Field(ge=0, le=86400)] | None = None
    backend: PoolBackend | None = None


class TenantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"name": "research"}]})
    name: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9\-]*$")]
    admin: bool = False
    max_queued_jobs: Annotated[int, Field(ge=1, le=10_000_000)] | None = None
    max_active_devices: Annotated[int, Field(ge=1, le=10_000_000)] | None = None


__all__ = [
    "EXAMPLE_SPEC",
    "AcceleratorList",
    "ApiKeyDoc",
    "ApiKeyList",
    "CheckpointDoc",
    "CodeUploaded",
    "DatasetDoc",
    "DatasetEpochCost",
    "DatasetList",
    "DatasetRows",
    "DeploymentDoc",
    "DeploymentList",
    "ErrorBody",
    "ErrorEnvelope",
    "EvaluationDoc",
    "EvaluationList",
    "EventDoc",
    "EventList",
    "JobDocument",
    "JobList",
    "LogChunk",
    "MetricPoint",
    "MetricsDocument",
    "ModelList",
    "ModelVersionDoc",
    "PlacementDoc",
    "PoolDoc",
    "PoolList",
    "PoolPatch",
    "QuoteOptionDoc",
    "QuoteRequest",
    "QuoteResponse",
    "ResultDoc",
    "SubmitJobRequest",
    "SweepDoc",
    "SweepList",
    "TenantCreate",
    "TenantCreated",
    "TenantDoc",
    "TenantList",
    "WhoAmI",
    "WorkerDoc",
]
