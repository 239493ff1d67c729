"""Tables of training telemetry: step metrics at training resolution."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from trainyard.store.models import Base

# the metrics with a column of their own; any other metric a job reports goes into ``extra``
METRIC_COLUMNS = ("loss", "eval_loss", "step_time_s", "tokens_per_s", "learning_rate")


class JobMetricRow(Base):
    """One logged step of one attempt: a few floats (about 60 bytes), so a 100,000-step job is a few
    megabytes. The primary key (job, step, attempt) is the order curves are read in."""

    __tablename__ = "job_metrics"
    __table_args__ = (Index("ix_job_metrics_job_attempt", "job_id", "attempt", "step"),)

    job_id: Mapped[str] = mapped_column(
        String(40), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    time_s: Mapped[float] = mapped_column(Float)
    loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    eval_loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    step_time_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    tokens_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    learning_rate: Mapped[float | None] = mapped_column(Float, nullable=True)
    extra: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
