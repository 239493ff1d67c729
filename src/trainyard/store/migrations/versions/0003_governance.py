"""Cost governance: usage ledger, budgets, reservations, holds, tenant limits, key policies, rate buckets.

Revision ID: 0003_governance
Revises: 0002_step_times
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_governance"
down_revision = "0002_step_times"
branch_labels = None
depends_on = None

BigIntId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "usage_ledger",
        sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
        sa.Column("source_key", sa.String(200), nullable=False, unique=True),
        sa.Column("tenant_id", sa.String(40), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("quantity", sa.Float(), nullable=False),
        sa.Column("unit", sa.String(32), nullable=False),
        sa.Column("unit_price_usd", sa.Float(), nullable=False),
        sa.Column("usd", sa.Float(), nullable=False),
        sa.Column("time_s", sa.Float(), nullable=False),
        sa.Column("job_id", sa.String(40), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.Column("accelerator", sa.String(64), nullable=True),
        sa.Column("market", sa.String(16), nullable=True),
        sa.Column("pool", sa.String(200), nullable=True),
        sa.Column("devices", sa.Integer(), nullable=True),
        sa.Column("model", sa.String(200), nullable=True),
        sa.Column("deployment", sa.String(200), nullable=True),
        sa.Column("adapter", sa.String(200), nullable=True),
        sa.Column("tags", sa.JSON(), nullable=False),
    )
    op.create_index("ix_usage_ledger_tenant_time", "usage_ledger", ["tenant_id", "time_s"])
    op.create_index("ix_usage_ledger_job_id", "usage_ledger", ["job_id"])
    op.create_table(
        "budgets",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("tenant_id", sa.String(40), nullable=False),
        sa.Column("tag_key", sa.String(100), nullable=False),
        sa.Column("tag_value", sa.String(200), nullable=False),
        sa.Column("period", sa.String(16), nullable=False),
        sa.Column("limit_usd", sa.Float(), nullable=False),
        sa.Column("hard", sa.Boolean(), nullable=False),
        sa.Column("created_at_s", sa.Float(), nullable=False),
        sa.Column("updated_at_s", sa.Float(), nullable=False),
        sa.UniqueConstraint("tenant_id", "tag_key", "tag_value", "period", name="uq_budgets_scope"),
    )
    op.create_index("ix_budgets_tenant_id", "budgets", ["tenant_id"])
    op.create_table(
        "budget_periods",
        sa.Column("budget_id", sa.String(40), primary_key=True),
        sa.Column("period_key", sa.String(16), primary_key=True),
        sa.Column("spent_usd", sa.Float(), nullable=False),
        sa.Column("reserved_usd", sa.Float(), nullable=False),
        sa.Column("alerted_pct", sa.Integer(), nullable=False),
    )
    op.create_table(
        "budget_reservations",
        sa.Column("job_id", sa.String(40), primary_key=True),
        sa.Column("budget_id", sa.String(40), primary_key=True),
        sa.Column("period_key", sa.String(16), nullable=False),
        sa.Column("remaining_usd", sa.Float(), nullable=False),
    )
    op.create_table(
        "budget_holds",
        sa.Column("job_id", sa.String(40), primary_key=True),
        sa.Column("budget_id", sa.String(40), nullable=False),
        sa.Column("time_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_budget_holds_budget_id", "budget_holds", ["budget_id"])
    op.create_table(
        "governance_events",
        sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
        sa.Column("tenant_id", sa.String(40), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("time_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_governance_events_tenant_id", "governance_events", ["tenant_id", "id"])
    op.create_table(
        "tenant_limits",
        sa.Column("tenant_id", sa.String(40), primary_key=True),
        sa.Column("max_concurrent_jobs", sa.Integer(), nullable=True),
        sa.Column("rate_limit_rps", sa.Float(), nullable=True),
        sa.Column("rate_limit_burst", sa.Float(), nullable=True),
        sa.Column("key_rate_limit_rps", sa.Float(), nullable=True),
        sa.Column("tokens_per_minute", sa.Integer(), nullable=True),
    )
    op.create_table(
        "api_key_policies",
        sa.Column("key_id", sa.String(40), primary_key=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("expires_at_s", sa.Float(), nullable=True),
    )
    op.create_table(
        "rate_buckets",
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("tat_s", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    for name in (
        "rate_buckets",
        "api_key_policies",
        "tenant_limits",
        "governance_events",
        "budget_holds",
        "budget_reservations",
        "budget_periods",
        "budgets",
        "usage_ledger",
    ):
        op.drop_table(name)
