"""The webhook delivery outbox: each alert's deliveries are rows written with the alert, so that
deliveries waiting for a retry survive a restart.

Revision ID: 0013_webhook_deliveries
Revises: 0012_sweeps
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_webhook_deliveries"
down_revision = "0012_sweeps"
branch_labels = None
depends_on = None

BigIntId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column(
            "tenant_id", sa.String(40), sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("webhook_id", sa.String(40), nullable=False),
        sa.Column("alert_id", BigIntId, nullable=False),
        sa.Column("job_id", sa.String(40), nullable=True),
        sa.Column("rule", sa.String(40), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at_s", sa.Float(), nullable=False),
        sa.Column("claimed_until_s", sa.Float(), nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at_s", sa.Float(), nullable=False),
        sa.Column("updated_at_s", sa.Float(), nullable=False),
        sa.Column("delivered_at_s", sa.Float(), nullable=True),
    )
    op.create_index("ix_webhook_deliveries_due", "webhook_deliveries", ["state", "next_attempt_at_s"])
    op.create_index("ix_webhook_deliveries_tenant", "webhook_deliveries", ["tenant_id", "created_at_s"])


def downgrade() -> None:
    op.drop_table("webhook_deliveries")
