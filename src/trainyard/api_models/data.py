"""Documents of datasets (DESIGN §3.7), model versions and evaluations (§3.8), deployments (§3.9)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from trainyard.api_models.base import Document
from trainyard.enums import DatasetFormat


class DatasetSplitDoc(Document):
    rows: int
    sha256: str
    bytes: int | None = None
    tokens: int | None = None


class DatasetSplits(Document):
    train: DatasetSplitDoc
    eval: DatasetSplitDoc


class DatasetDoc(Document):
    id: str = Field(examples=["ds://support-chats@3"])
    name: str
    version: int
    sha256: str
    format: DatasetFormat
    rows: int
    bytes: int
    duplicates_removed: int
    splits: DatasetSplits
    derived_from: str | None = None
    created_at: str | None = None


class DatasetList(Document):
    datasets: list[DatasetDoc]


class DatasetRows(Document):
    id: str
    split: str
    offset: int
    rows: list[dict[str, Any]]
    next_offset: int | None = Field(None, description="Pass as `offset` for the next page; null at the end.")
    total: int | None = None


class EpochPlacement(Document):
    pool: str | None = None
    accelerator: str
    devices: int
    market: str
    cloud: str | None = None
    region: str | None = None
    instance_type: str | None = None


class DatasetEpochCost(Document):
    """What one epoch over a version's train split costs on the cheapest feasible placement."""

    dataset: str = Field(examples=["ds://support-chats@3"])
    model: str = Field(examples=["tiny@1"])
    seq_len: int
    global_batch: int
    train_tokens: int
    train_rows: int
    steps_per_epoch: int
    step_time_s: float = Field(description="Predicted seconds per optimizer step on the placement")
    usd_per_hour: float = Field(description="Price of the whole allocation per hour")
    usd_per_epoch: float = Field(
        description="Expected cost of one epoch (checkpoint and preemption included)"
    )
    hours_per_epoch: float
    placement: EpochPlacement


class ModelVersionDoc(Document):
    id: str = Field(examples=["tiny@2"])
    name: str
    version: int
    sha256: str | None = None
    base: str | None = None
    source_job: str | None = None
    datasets: list[str] = Field(default_factory=list)
    adapter: bool = False
    aliases: list[str] = Field(default_factory=list)
    created_at: str | None = None


class ModelList(Document):
    models: list[ModelVersionDoc]


class EvaluationDoc(Document):
    id: str
    state: str = Field(examples=["succeeded"])
    model: str
    baseline: str | None = None
    dataset: str
    split: str
    n: int | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    guardrails: list[dict[str, Any]] = Field(default_factory=list)
    guardrail_datasets: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Per guardrail dataset: {dataset, split, n, format, model, baseline} (mean loss, "
        "perplexity); its guardrails are the `guardrails` entries that name it.",
    )
    verdict: str | None = None
    passed: bool = False
    examples: list[dict[str, Any]] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list)
    gate: dict[str, Any] | None = None


class EvaluationList(Document):
    evaluations: list[EvaluationDoc]


class SweepDoc(Document):
    """A hyperparameter sweep: its state, its group quote, what its trials have spent against its budget,
    the best trial and the model version registered from it (``trials`` on ``get``, not on ``list``)."""

    id: str = Field(examples=["sweep-3f9a0c1b2d4e"])
    name: str
    state: str = Field(
        examples=["succeeded"], description="running | cancelling | succeeded | failed | cancelled"
    )
    reason: str = ""
    budget_usd: float | None = None
    spent_usd: float = 0.0
    budget_stopped: bool = False
    best_trial: dict[str, Any] | None = None
    model_version: str | None = None
    trial_counts: dict[str, int] = Field(default_factory=dict)
    quote: dict[str, Any] = Field(default_factory=dict)
    trials: list[dict[str, Any]] | None = None
    created_at: str | None = None
    updated_at: str | None = None


class SweepList(Document):
    sweeps: list[SweepDoc]


class DeploymentDoc(Document):
    name: str
    state: str
    model: str
    routes: list[dict[str, Any]]
    replicas: int
    url: str


class DeploymentList(Document):
    deployments: list[DeploymentDoc]
