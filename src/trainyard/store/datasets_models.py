"""Tables of the datasets area: immutable dataset versions and immutable run records."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from trainyard.store.models import Base, BigIntId


class DatasetVersionRow(Base):
    """One version ``ds://name@version`` of a tenant's dataset. Written once, never updated."""

    __tablename__ = "dataset_versions"
    __table_args__ = (
        UniqueConstraint("tenant_id", "name", "version", name="uq_dataset_versions_name_version"),
        UniqueConstraint("tenant_id", "name", "split_key", name="uq_dataset_versions_name_split"),
        Index("ix_dataset_versions_tenant_name", "tenant_id", "name"),
    )

    seq: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100))
    version: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    split_key: Mapped[str] = mapped_column(String(64))
    format: Mapped[str] = mapped_column(String(16))
    rows: Mapped[int] = mapped_column(BigInteger)
    bytes: Mapped[int] = mapped_column(BigInteger)
    duplicates_removed: Mapped[int] = mapped_column(BigInteger)
    eval_fraction: Mapped[float] = mapped_column(Float)
    seed: Mapped[int] = mapped_column(BigInteger)
    tokenizer: Mapped[str] = mapped_column(String(200))
    splits: Mapped[dict[str, Any]] = mapped_column(JSON)
    stats: Mapped[dict[str, Any]] = mapped_column(JSON)
    storage_url: Mapped[str] = mapped_column(Text)
    derived_from: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at_s: Mapped[float] = mapped_column(Float)


class RunRecordRow(Base):
    """The immutable record of one attempt of a job: data, code, spec, environment, seeds."""

    __tablename__ = "run_records"
    __table_args__ = (UniqueConstraint("job_id", "attempt", name="uq_run_records_job_attempt"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    record: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at_s: Mapped[float] = mapped_column(Float)
