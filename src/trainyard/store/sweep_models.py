"""Table of hyperparameter sweeps: one row per sweep, its trials in a JSON list (a sweep has at most
:data:`trainyard.spec.sweep.MAX_TRIALS`; only the control loop writes them)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from trainyard.store.models import Base


class SweepRow(Base):
    __tablename__ = "sweeps"
    __table_args__ = (Index("ix_sweeps_tenant_created", "tenant_id", "created_at_s"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(40), ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(150))
    state: Mapped[str] = mapped_column(String(16), index=True)  # running | cancelling | succeeded | ...
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # the Sweep document as submitted
    quote: Mapped[dict[str, Any]] = mapped_column(JSON)  # the group quote at creation
    trials: Mapped[list[Any]] = mapped_column(JSON)
    doc: Mapped[dict[str, Any]] = mapped_column(JSON)  # spent, best trial, model version, budget stop
    reason: Mapped[str] = mapped_column(Text, default="")
    created_at_s: Mapped[float] = mapped_column(Float)
    updated_at_s: Mapped[float] = mapped_column(Float)
