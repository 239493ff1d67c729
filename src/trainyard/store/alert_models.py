"""Tables of alert delivery: tenants' webhooks, their signing secret, and the alerts that fired."""

from __future__ import annotations

from typing import Any

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
from sqlalchemy.orm import Mapped, mapped_column

from trainyard.store.models import Base

BigIntId = BigInteger().with_variant(Integer(), "sqlite")


class WebhookRow(Base):
    """A URL a tenant's alerts are POSTed to (``rules``: which rules; None: all)."""

    __tablename__ = "webhooks"
    __table_args__ = (Index("ix_webhooks_tenant_id", "tenant_id"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    url: Mapped[str] = mapped_column(Text)
    rules: Mapped[list[Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    created_at_s: Mapped[float] = mapped_column(Float)
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)


class WebhookSecretRow(Base):
    """The tenant's HMAC-SHA256 signing secret (one per tenant, rotated on request)."""

    __tablename__ = "webhook_secrets"

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    secret: Mapped[str] = mapped_column(String(100))
    created_at_s: Mapped[float] = mapped_column(Float)


class AlertRow(Base):
    """One alert that fired; ``dedup_key`` makes each condition fire once (per attempt, window, ...)."""

    __tablename__ = "alerts"
    __table_args__ = (
        UniqueConstraint("tenant_id", "dedup_key", name="uq_alerts_tenant_dedup"),
        Index("ix_alerts_tenant_id", "tenant_id", "id"),
    )

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    job_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    deployment: Mapped[str | None] = mapped_column(String(63), nullable=True)
    rule: Mapped[str] = mapped_column(String(40))
    severity: Mapped[str] = mapped_column(String(16))
    dedup_key: Mapped[str] = mapped_column(String(200))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    fired_at_s: Mapped[float] = mapped_column(Float)


class WebhookDeliveryRow(Base):
    """The outbox: one alert to one webhook, written in the alert's transaction and delivered (retried
    with backoff, across restarts) by the delivery loop. ``id`` is the delivery's idempotency key, sent
    on every attempt. ``state``: pending | delivered | failed (a final non-retryable answer) | dead
    (retryable failures until the attempts ran out). ``claimed_until_s`` leases a pending delivery to
    one sender at a time."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_due", "state", "next_attempt_at_s"),
        Index("ix_webhook_deliveries_tenant", "tenant_id", "created_at_s"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    webhook_id: Mapped[str] = mapped_column(String(40))
    alert_id: Mapped[int] = mapped_column(BigIntId)
    job_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    rule: Mapped[str] = mapped_column(String(40))
    url: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer)
    next_attempt_at_s: Mapped[float] = mapped_column(Float)
    claimed_until_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at_s: Mapped[float] = mapped_column(Float)
    updated_at_s: Mapped[float] = mapped_column(Float)
    delivered_at_s: Mapped[float | None] = mapped_column(Float, nullable=True)
