"""SQLAlchemy 2 table mappings. Timestamps are unix seconds (``*_at_s``); JSON documents use JSON columns."""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# BigInteger autoincrement primary keys need INTEGER on SQLite to alias the rowid.
BigIntId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class TenantRow(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    created_at_s: Mapped[float] = mapped_column(Float)
    max_queued_jobs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_active_devices: Mapped[int | None] = mapped_column(Integer, nullable=True)
    storage_roots: Mapped[list[str]] = mapped_column(JSON, default=list)
    allow_user_code: Mapped[bool] = mapped_column(Boolean, default=False)


class ApiKeyRow(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    prefix: Mapped[str] = mapped_column(String(32), index=True)
    key_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at_s: Mapped[float] = mapped_column(Float)


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("tenant_id", "idempotency_key", name="uq_jobs_tenant_idempotency"),
        Index("ix_jobs_tenant_seq", "tenant_id", "seq"),
        Index("ix_jobs_state_seq", "state", "seq"),
        Index("ix_jobs_tenant_state", "tenant_id", "state"),
    )

    seq: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    state: Mapped[str] = mapped_column(String(16))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    spec_sha256: Mapped[str] = mapped_column(String(64))
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at_s: Mapped[float] = mapped_column(Float)
    updated_at_s: Mapped[float] = mapped_column(Float)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    placement: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    quote: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    checkpoints: Mapped[list[Any]] = mapped_column(JSON, default=list)
    workers: Mapped[list[Any]] = mapped_column(JSON, default=list)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    progress: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    attempt_started_at_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    run_dir: Mapped[str | None] = mapped_column(Text, nullable=True)


class JobEventRow(Base):
    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32))
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    time_s: Mapped[float] = mapped_column(Float)


class PoolRow(Base):
    __tablename__ = "pools"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    doc: Mapped[dict[str, Any]] = mapped_column(JSON)
    source: Mapped[str] = mapped_column(String(16))
    updated_at_s: Mapped[float] = mapped_column(Float)


class StepTimeMeasurementRow(Base):
    """Measured step times of one job attempt (steady-state heartbeats), fed back into the predictor."""

    __tablename__ = "step_time_measurements"
    __table_args__ = (UniqueConstraint("job_id", "attempt", name="uq_step_time_job_attempt"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(40))
    attempt: Mapped[int] = mapped_column(Integer)
    pool: Mapped[str] = mapped_column(String(200))
    accelerator: Mapped[str] = mapped_column(String(64), index=True)
    devices: Mapped[int] = mapped_column(Integer)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    median_step_time_s: Mapped[float] = mapped_column(Float)
    samples: Mapped[int] = mapped_column(Integer)
    step_times_s: Mapped[list[Any]] = mapped_column(JSON)
    measured_at_s: Mapped[float] = mapped_column(Float)


from trainyard.store import alert_models as _alert_models  # noqa: E402,F401  (registers the tables)
from trainyard.store import datasets_models as _datasets_models  # noqa: E402,F401  (registers tables)
from trainyard.store import governance_models as _governance_models  # noqa: E402,F401  (tables on Base)
from trainyard.store import registry_models as _registry_models  # noqa: E402,F401  (registers the tables)
from trainyard.store import serving_models as _serving_models  # noqa: E402,F401  (registers the tables)
from trainyard.store import sweep_models as _sweep_models  # noqa: E402,F401  (registers the tables)
from trainyard.store import telemetry_models as _telemetry_models  # noqa: E402,F401  (registers the tables)
