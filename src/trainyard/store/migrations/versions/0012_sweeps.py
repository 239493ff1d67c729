"""Hyperparameter sweeps: one row per sweep with its trials.

Revision ID: 0012_sweeps
Revises: 0011_jobs_tenant_state_index
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_sweeps"
down_revision = "0011_jobs_tenant_state_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column(
            "tenant_id", sa.String(40), sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("name", sa.String(150), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("quote", sa.JSON(), nullable=False),
        sa.Column("trials", sa.JSON(), nullable=False),
        sa.Column("doc", sa.JSON(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at_s", sa.Float(), nullable=False),
        sa.Column("updated_at_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_sweeps_tenant_created", "sweeps", ["tenant_id", "created_at_s"])
    op.create_index("ix_sweeps_state", "sweeps", ["state"])


def downgrade() -> None:
    op.drop_table("sweeps")
