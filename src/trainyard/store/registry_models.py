"""Tables of the model registry and of evaluations (DESIGN §3.8)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, Float, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from trainyard.store.models import Base, BigIntId


class ModelVersionRow(Base):
    """One immutable model version ``name@version`` of a tenant (or a public base model)."""

    __tablename__ = "model_versions"
    __table_args__ = (
        UniqueConstraint("tenant_id", "name", "version", name="uq_model_versions_tenant_name_version"),
        Index("ix_model_versions_public_name", "public", "name"),
    )

    seq: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(40), index=True)
    name: Mapped[str] = mapped_column(String(100))
    version: Mapped[int] = mapped_column(Integer)
    public: Mapped[bool] = mapped_column(Boolean, default=False)
    kind: Mapped[str] = mapped_column(String(16))  # base | full | adapter
    sha256: Mapped[str] = mapped_column(String(64))
    base: Mapped[str | None] = mapped_column(String(200), nullable=True)  # "name@V" of the base version
    source_job: Mapped[str | None] = mapped_column(String(40), nullable=True, index=True)
    datasets: Mapped[list[Any]] = mapped_column(JSON, default=list)
    doc: Mapped[dict[str, Any]] = mapped_column(JSON)  # config, artefacts, run record, metrics, files
    created_by: Mapped[str] = mapped_column(String(100))
    created_at_s: Mapped[float] = mapped_column(Float)


class ModelAliasRow(Base):
    __tablename__ = "model_aliases"
    __table_args__ = (UniqueConstraint("tenant_id", "name", "alias", name="uq_model_aliases"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(40))
    name: Mapped[str] = mapped_column(String(100))
    alias: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer)
    updated_at_s: Mapped[float] = mapped_column(Float)


class ModelAliasEventRow(Base):
    """Append-only history of alias moves: who, when, from which version to which, on which evaluation."""

    __tablename__ = "model_alias_events"
    __table_args__ = (Index("ix_model_alias_events_tenant_name", "tenant_id", "name", "id"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(40))
    name: Mapped[str] = mapped_column(String(100))
    alias: Mapped[str] = mapped_column(String(64))
    from_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    to_version: Mapped[int] = mapped_column(Integer)
    actor: Mapped[str] = mapped_column(String(100))
    evaluation_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    forced: Mapped[bool] = mapped_column(Boolean, default=False)
    reason: Mapped[str] = mapped_column(Text, default="")
    time_s: Mapped[float] = mapped_column(Float)


class EvaluationRow(Base):
    __tablename__ = "evaluations"
    __table_args__ = (Index("ix_evaluations_tenant_seq", "tenant_id", "seq"),)

    seq: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    tenant_id: Mapped[str] = mapped_column(String(40))
    state: Mapped[str] = mapped_column(String(16))  # pending | launching | running | succeeded | failed
    model: Mapped[str] = mapped_column(String(200), index=True)
    baseline: Mapped[str] = mapped_column(String(200))
    dataset: Mapped[str] = mapped_column(String(500))
    split: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[str | None] = mapped_column(String(40), nullable=True, index=True)
    doc: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at_s: Mapped[float] = mapped_column(Float)
    finished_at_s: Mapped[float | None] = mapped_column(Float, nullable=True)
