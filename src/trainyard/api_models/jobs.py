"""Job documents: the job, its placement, checkpoints, workers, events and logs (DESIGN §3.3)."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from trainyard.api_models.base import Document
from trainyard.enums import TERMINAL_JOB_STATES, JobState, Market


class PlacementDoc(Document):
    pool: str
    devices: int
    market: Market
    accelerator: str
    price_usd_per_device_hour: float
    expected_cost_usd: float | None = None
    checkpoint_interval_s: float | None = None
    reason: str = ""


class CheckpointDoc(Document):
    step: int | None
    path: str | None


class WorkerDoc(Document):
    rank: int | None
    pid: int | None
    host: str | None


class EventDoc(Document):
    id: int
    kind: str = Field(examples=["state"])
    time: str | None = Field(None, examples=["2026-11-29T21:00:00Z"])
    data: dict[str, Any]


class ResultDoc(Document):
    model_version: str | None
    model_sha256: str | None


class JobDocument(Document):
    model_config = ConfigDict(
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
    state: JobState = Field(examples=["queued"])
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

    @property
    def done(self) -> bool:
        """True once the job is in a state it never leaves (succeeded, failed, cancelled)."""
        return self.state in TERMINAL_JOB_STATES

    @property
    def step(self) -> int | None:
        """The latest step a worker reported, if any."""
        step = self.progress.get("step")
        return int(step) if isinstance(step, int | float) else None

    @property
    def total_steps(self) -> int | None:
        """``workload.steps`` of the job's spec, when it names steps (not tokens or epochs)."""
        steps = ((self.spec or {}).get("workload") or {}).get("steps")
        return int(steps) if isinstance(steps, int) else None


class JobList(Document):
    jobs: list[JobDocument]
    next_cursor: str | None = Field(None, description="Pass as `cursor` to get the next (older) page.")


class EventList(Document):
    events: list[EventDoc]
    next_after: int = Field(description="Pass as `after` to get only newer events.")


class LogChunk(Document):
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
    job_state: JobState | None = None


class MetricPoint(Document):
    step: int
    attempt: int
    time_s: float
    loss: float | None = None
    eval_loss: float | None = None
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    learning_rate: float | None = None
    count: int | None = Field(default=None, description="Logged steps averaged into this point (downsampled)")


class MetricsDocument(Document):
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
