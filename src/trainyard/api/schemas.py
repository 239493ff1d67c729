"""Request and response bodies of the REST API (they define the OpenAPI document)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trainyard.catalog.pools import Pool
from trainyard.spec.models import JobSpec

EXAMPLE_SPEC: dict[str, Any] = {
    "apiVersion": "trainyard/v1",
    "kind": "TrainingJob",
    "name": "tiny-cpu",
    "model": {"architecture": "decoder", "n_layers": 2, "d_model": 64, "n_heads": 4, "vocab_size": 256},
    "workload": {"seq_len": 64, "global_batch": 4, "steps": 20, "precision": "fp32"},
    "requirements": {"allow": ["cpu"]},
}


class ErrorBody(BaseModel):
    code: str = Field(examples=["not_found"])
    message: str = Field(examples=["no job 'job-0123456789ab'"])
    hint: str = Field(examples=["List your jobs with `trainyard jobs list`."])
    details: dict[str, Any] = Field(default_factory=dict)


class ErrorEnvelope(BaseModel):
    error: ErrorBody


class SubmitJobRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"spec": EXAMPLE_SPEC}]})
    spec: JobSpec


class QuoteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"spec": EXAMPLE_SPEC}]})
    spec: JobSpec
    pools: Annotated[list[Pool] | None, Field(max_length=1000)] = None
    include_catalog: bool = Field(True, description="Also price the packaged cloud catalog.")


class QuoteOptionDoc(BaseModel):
    model_config = ConfigDict(extra="allow")
    accelerator: str
    devices: int
    cloud: str | None = None
    region: str
    instance_type: str | None = None
    market: str
    step_time_s: float | None = None
    price_usd_per_hour: float | None = None
    usd_per_step: float | None = None
    expected_hours: float | None = None
    expected_cost_usd: float | None = None
    preemption_overhead_usd: float | None = None
    checkpoint_interval_s: float | None = None
    feasible: bool
    reason: str = ""
    pool: str | None = None


class QuoteResponse(BaseModel):
    options: list[QuoteOptionDoc]


class PlacementDoc(BaseModel):
    pool: str
    devices: int
    market: str
    accelerator: str
    price_usd_per_device_hour: float
    expected_cost_usd: float | None = None
    checkpoint_interval_s: float | None = None
    reason: str = ""


class CheckpointDoc(BaseModel):
    step: int | None
    path: str | None


class WorkerDoc(BaseModel):
    rank: int | None
    pid: int | None
    host: str | None


class EventDoc(BaseModel):
    id: int
    kind: str = Field(examples=["state"])
    time: str | None = Field(None, examples=["2026-11-29T21:00:00Z"])
    data: dict[str, Any]


class ResultDoc(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())
    model_version: str | None
    model_sha256: str | None


class JobDocument(BaseModel):
    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {
                    "id": "job-3f2a9c1b7d4e",
                    "name": "tiny-cpu",
                    "state": "running",
                    "placement": {
                        "pool": "local-cpu",
                        "devices": 1,
                        "market": "on_demand",
                        "accelerator": "cpu",
                        "price_usd_per_device_hour": 0.0,
                    },
                    "cost_usd": 0.0,
                    "checkpoints": [
                        {"step": 10, "path": "file:///home/u/.trainyard/checkpoints/job-3f2a9c1b7d4e/step-10"}
                    ],
                    "workers": [{"rank": 0, "pid": 4242, "host": "localhost"}],
                    "events": [],
                    "result": None,
                }
            ]
        },
    )
    id: str
    name: str
    state: str = Field(examples=["queued"])
    placement: PlacementDoc | None
    cost_usd: float
    checkpoints: list[CheckpointDoc]
    workers: list[WorkerDoc]
    events: list[EventDoc]
    result: ResultDoc | None
    attempt: int
    reason: str
    progress: dict[str, Any]
    quote: list[dict[str, Any]] | None = None
    created_at: str | None
    updated_at: str | None
    spec: dict[str, Any] | None = None


class JobList(BaseModel):
    jobs: list[JobDocument]
    next_cursor: str | None = Field(None, description="Pass as `cursor` to get the next (older) page.")


class EventList(BaseModel):
    events: list[EventDoc]
    next_after: int = Field(description="Pass as `after` to get only newer events.")


class LogChunk(BaseModel):
    job_id: str
    rank: int
    attempt: int | None = Field(default=None, description="The attempt read; null: every attempt's log")
    offset: int
    next_offset: int
    size: int | None = Field(
        default=None, description="Bytes of what is read (the log, or the attempt's part)"
    )
    text: str
    attempts: list[int] = Field(default_factory=list, description="Attempts this rank has a log of")
    job_state: str | None = None


class MetricPoint(BaseModel):
    model_config = ConfigDict(extra="allow")
    step: int
    attempt: int
    time_s: float
    loss: float | None = None
    eval_loss: float | None = None
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    learning_rate: float | None = None
    count: int | None = Field(default=None, description="Logged steps averaged into this point (downsampled)")


class MetricsDocument(BaseModel):
    job_id: str
    attempt: int | None = Field(description="The attempt asked for; null: per step, the newest attempt's row")
    attempts: list[int]
    since_step: int
    points: list[MetricPoint]
    total_points: int = Field(description="Logged steps after since_step")
    first_step: int | None
    last_step: int | None
    downsampled: bool
    bucket_steps: int
    complete: bool = Field(description="False when more raw points follow (downsample=false): page on")
    next_since_step: int


class PoolDoc(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    accelerator: str
    devices_per_node: int
    nodes: int
    market: str
    region: str
    source: str
    devices_in_use: int
    updated_at: str | None
    backend: str = Field(description="local | ray | none (planning only: quoted, never started)")
    executable: bool = Field(description="True when an executor of this server can start work here")


class PoolList(BaseModel):
    pools: list[PoolDoc]


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
    backend: Literal["local", "ray", "none"] | None = None


class TenantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"name": "research"}]})
    name: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9\-]*$")]
    admin: bool = False
    max_queued_jobs: Annotated[int, Field(ge=1, le=10_000_000)] | None = None
    max_active_devices: Annotated[int, Field(ge=1, le=10_000_000)] | None = None


class TenantCreated(BaseModel):
    id: str
    name: str
    api_key: str = Field(description="Shown once; only its hash is stored.")


class TenantDoc(BaseModel):
    id: str
    name: str
    created_at: str | None
    max_queued_jobs: int | None
    max_active_devices: int | None
    storage_roots: list[str] = Field(default_factory=list)
    allow_user_code: bool = False
    storage_url: str | None = Field(None, description="The tenant's namespace under the storage root.")


class TenantList(BaseModel):
    tenants: list[TenantDoc]


class ApiKeyDoc(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": "key-3f2a9c1b7d4e5a6b",
                    "prefix": "Ab12Cd34",
                    "admin": False,
                    "created_at": "2026-11-29T12:00:00Z",
                    "revoked": False,
                }
            ]
        }
    )
    id: str
    prefix: str = Field(
        description="The public part of the key: `ty_<prefix>_...`. The key itself is never stored."
    )
    admin: bool
    created_at: str | None
    revoked: bool


class ApiKeyList(BaseModel):
    keys: list[ApiKeyDoc]


class CodeUploaded(BaseModel):
    url: str = Field(description="Where the archive is stored; name it as entrypoint.code.")
    sha256: str
    bytes: int


class WhoAmI(BaseModel):
    tenant: str
    admin: bool
    storage_url: str | None = None
    storage_roots: list[str] = Field(default_factory=list)
    allow_user_code: bool = False


class AcceleratorList(BaseModel):
    accelerators: list[dict[str, Any]]
