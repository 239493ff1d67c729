"""Alert delivery: webhooks per tenant, the tenant's signing secret, alerts that fired.

Revision ID: 0009_alert_webhooks
Revises: 0008_job_metrics
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_alert_webhooks"
down_revision = "0008_job_metrics"
branch_labels = None
depends_on = None

BigIntId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "webhooks",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column(
            "tenant_id", sa.String(40), sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("rules", sa.JSON(), nullable=True),
        sa.Column("created_at_s", sa.Float(), nullable=False),
        sa.Column("disabled", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_webhooks_tenant_id", "webhooks", ["tenant_id"])
    op.create_table(
        "webhook_secrets",
        sa.Column(
            "tenant_id", sa.String(40), sa.ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("secret", sa.String(100), nullable=False),
        sa.Column("created_at_s", sa.Float(), nullable=False),
    )
    op.create_table(
        "alerts",
        sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
        sa.Column(
            "tenant_id", sa.String(40), sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("job_id", sa.String(40), nullable=True),
        sa.Column("deployment", sa.String(63), nullable=True),
        sa.Column("rule", sa.String(40), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("dedup_key", sa.String(200), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("fired_at_s", sa.Float(), nullable=False),
        sa.UniqueConstraint("tenant_id", "dedup_key", name="uq_alerts_tenant_dedup"),
    )
    op.create_index("ix_alerts_tenant_id", "alerts", ["tenant_id", "id"])


def downgrade() -> None:
    op.drop_table("alerts")
    op.drop_table("webhook_secrets")
    op.drop_table("webhooks")
