"""Tables of the serving area: deployments, their replicas and events, per-request metering records and
shadow comparisons. Timestamps are unix seconds."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from trainyard.store.models import Base, BigIntId


class DeploymentRow(Base):
    __tablename__ = "deployments"
    __table_args__ = (UniqueConstraint("tenant_id", "name", name="uq_deployments_tenant_name"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(63))
    model: Mapped[str] = mapped_column(String(200))  # the reference as given (a version or an alias)
    routes: Mapped[list[Any]] = mapped_column(JSON)  # [{model, weight, shadow, canary}]
    previous_routes: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    canary: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # rollback thresholds
    autoscaling: Mapped[dict[str, Any]] = mapped_column(JSON)
    engine: Mapped[str] = mapped_column(String(32), default="transformers", server_default="transformers")
    tags: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    resolved: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # ref -> version id now served
    state: Mapped[str] = mapped_column(String(16))
    created_at_s: Mapped[float] = mapped_column(Float)
    updated_at_s: Mapped[float] = mapped_column(Float)


class ServingReplicaRow(Base):
    __tablename__ = "serving_replicas"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    base_version: Mapped[str] = mapped_column(String(200))
    model_path: Mapped[str] = mapped_column(Text)
    backend: Mapped[str] = mapped_column(String(16))
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    host: Mapped[str] = mapped_column(String(200))
    port: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))  # starting | ready | stopping
    placement: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    started_at_s: Mapped[float] = mapped_column(Float)
    ready_at_s: Mapped[float | None] = mapped_column(Float, nullable=True)


class DeploymentEventRow(Base):
    __tablename__ = "deployment_events"
    __table_args__ = (Index("ix_deployment_events_dep_id", "deployment_id", "id"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    deployment_id: Mapped[str] = mapped_column(ForeignKey("deployments.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(40))
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    time_s: Mapped[float] = mapped_column(Float)


class ServingRequestRow(Base):
    """One metering record per gateway request (and per mirrored shadow request)."""

    __tablename__ = "serving_requests"
    __table_args__ = (Index("ix_serving_requests_tenant_time", "tenant_id", "created_at_s"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(64))
    tenant_id: Mapped[str] = mapped_column(String(40))
    tenant: Mapped[str] = mapped_column(String(100))
    deployment: Mapped[str] = mapped_column(String(63))
    model_version: Mapped[str] = mapped_column(String(200))
    base_version: Mapped[str] = mapped_column(String(200))
    adapter: Mapped[str | None] = mapped_column(String(200), nullable=True)
    route: Mapped[str] = mapped_column(String(16))  # primary | canary | shadow
    endpoint: Mapped[str] = mapped_column(String(32))  # chat.completions | completions
    status: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    latency_s: Mapped[float] = mapped_column(Float)
    ttft_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    stream: Mapped[bool] = mapped_column(Boolean)
    replica_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    tags: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at_s: Mapped[float] = mapped_column(Float)


class ShadowPairRow(Base):
    """A primary answer and its shadow's answer to the same request."""

    __tablename__ = "serving_shadow_pairs"
    __table_args__ = (Index("ix_shadow_pairs_dep", "deployment_id", "id"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    deployment_id: Mapped[str] = mapped_column(ForeignKey("deployments.id", ondelete="CASCADE"))
    request_id: Mapped[str] = mapped_column(String(64))
    primary_model: Mapped[str] = mapped_column(String(200))
    shadow_model: Mapped[str] = mapped_column(String(200))
    primary_latency_s: Mapped[float] = mapped_column(Float)
    shadow_latency_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    primary_completion_tokens: Mapped[int] = mapped_column(Integer)
    shadow_completion_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    primary_text: Mapped[str] = mapped_column(Text)
    shadow_text: Mapped[str | None] = mapped_column(Text, nullable=True)
    shadow_status: Mapped[int] = mapped_column(Integer)
    exact_match: Mapped[bool] = mapped_column(Boolean)
    similarity: Mapped[float] = mapped_column(Float)
    created_at_s: Mapped[float] = mapped_column(Float)
