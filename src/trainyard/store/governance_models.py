"""Tables of cost governance: the usage ledger, budgets and their reservations, tenant limits, key
policies (roles, expiry) and shared rate-limit buckets. Timestamps are unix seconds."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, Float, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from trainyard.store.models import Base, BigIntId


class LedgerEntryRow(Base):
    """One billable fact (append-only): a quantity in a unit at a unit price, with its attribution.

    ``source_key`` names the fact (e.g. ``job:<id>:attempt:<n>:device_s``) and is unique, so writing the
    same fact twice is refused by the database instead of doubling a charge."""

    __tablename__ = "usage_ledger"
    __table_args__ = (Index("ix_usage_ledger_tenant_time", "tenant_id", "time_s"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    source_key: Mapped[str] = mapped_column(String(200), unique=True)
    tenant_id: Mapped[str] = mapped_column(String(40))
    kind: Mapped[str] = mapped_column(String(32))
    quantity: Mapped[float] = mapped_column(Float)
    unit: Mapped[str] = mapped_column(String(32))
    unit_price_usd: Mapped[float] = mapped_column(Float)
    usd: Mapped[float] = mapped_column(Float)
    time_s: Mapped[float] = mapped_column(Float)
    job_id: Mapped[str | None] = mapped_column(String(40), nullable=True, index=True)
    attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    accelerator: Mapped[str | None] = mapped_column(String(64), nullable=True)
    market: Mapped[str | None] = mapped_column(String(16), nullable=True)
    pool: Mapped[str | None] = mapped_column(String(200), nullable=True)
    devices: Mapped[int | None] = mapped_column(Integer, nullable=True)
    model: Mapped[str | None] = mapped_column(String(200), nullable=True)
    deployment: Mapped[str | None] = mapped_column(String(200), nullable=True)
    adapter: Mapped[str | None] = mapped_column(String(200), nullable=True)
    tags: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class BudgetRow(Base):
    """A dollar budget of a tenant, or of one tag value of a tenant (``tag_key``/``tag_value`` = "")."""

    __tablename__ = "budgets"
    __table_args__ = (
        UniqueConstraint("tenant_id", "tag_key", "tag_value", "period", name="uq_budgets_scope"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(40), index=True)
    tag_key: Mapped[str] = mapped_column(String(100), default="")
    tag_value: Mapped[str] = mapped_column(String(200), default="")
    period: Mapped[str] = mapped_column(String(16))
    limit_usd: Mapped[float] = mapped_column(Float)
    hard: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at_s: Mapped[float] = mapped_column(Float)
    updated_at_s: Mapped[float] = mapped_column(Float)


class BudgetPeriodRow(Base):
    """What a budget has spent (ledger charges) and holds reserved (admitted work) in one period."""

    __tablename__ = "budget_periods"

    budget_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    period_key: Mapped[str] = mapped_column(String(16), primary_key=True)
    spent_usd: Mapped[float] = mapped_column(Float, default=0.0)
    reserved_usd: Mapped[float] = mapped_column(Float, default=0.0)
    alerted_pct: Mapped[int] = mapped_column(Integer, default=0)


class BudgetReservationRow(Base):
    """The part of a job's quoted cost still reserved against one budget period."""

    __tablename__ = "budget_reservations"

    job_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    budget_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    period_key: Mapped[str] = mapped_column(String(16))
    remaining_usd: Mapped[float] = mapped_column(Float)


class BudgetHoldRow(Base):
    """A job stopped at a hard budget: held in ``preempted`` until the budget is raised."""

    __tablename__ = "budget_holds"

    job_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    budget_id: Mapped[str] = mapped_column(String(40), index=True)
    time_s: Mapped[float] = mapped_column(Float)


class GovernanceEventRow(Base):
    """Tenant-level events: budget alerts (50/80/100 %), budget stops and resumes."""

    __tablename__ = "governance_events"
    __table_args__ = (Index("ix_governance_events_tenant_id", "tenant_id", "id"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(40))
    kind: Mapped[str] = mapped_column(String(32))
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    time_s: Mapped[float] = mapped_column(Float)


class TenantLimitsRow(Base):
    """Per-tenant administration beyond the tenants table: concurrency cap and rate limits."""

    __tablename__ = "tenant_limits"

    tenant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    max_concurrent_jobs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    rate_limit_rps: Mapped[float | None] = mapped_column(Float, nullable=True)
    rate_limit_burst: Mapped[float | None] = mapped_column(Float, nullable=True)
    key_rate_limit_rps: Mapped[float | None] = mapped_column(Float, nullable=True)
    tokens_per_minute: Mapped[int | None] = mapped_column(Integer, nullable=True)


class ApiKeyPolicyRow(Base):
    """A key's role (admin | member | viewer) and, for a rotated key, when it stops working."""

    __tablename__ = "api_key_policies"

    key_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    expires_at_s: Mapped[float | None] = mapped_column(Float, nullable=True)


class RateBucketRow(Base):
    """A token bucket shared by every server process on one database, kept as its theoretical arrival
    time (GCRA): the bucket is full when ``tat_s`` <= now."""

    __tablename__ = "rate_buckets"

    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    tat_s: Mapped[float] = mapped_column(Float)


class SettingsVersionRow(Base):
    """One row (``id`` 1): a counter moved in the same transaction as every admin change of a tenant's
    settings (quotas, rate limits, budgets, walls, keys), which each server process reads a few times a
    second to drop what it cached of them (:mod:`trainyard.tenancy.settings_sync`)."""

    __tablename__ = "settings_version"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    version: Mapped[int] = mapped_column(BigIntId)
