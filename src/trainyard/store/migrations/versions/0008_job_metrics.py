"""Step metrics at training resolution.

Revision ID: 0008_job_metrics
Revises: 0007_datasets
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_job_metrics"
down_revision = "0007_datasets"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_metrics",
        sa.Column("job_id", sa.String(40), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("time_s", sa.Float(), nullable=False),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("eval_loss", sa.Float(), nullable=True),
        sa.Column("step_time_s", sa.Float(), nullable=True),
        sa.Column("tokens_per_s", sa.Float(), nullable=True),
        sa.Column("learning_rate", sa.Float(), nullable=True),
        sa.Column("extra", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", "step", "attempt", name="pk_job_metrics"),
    )


def downgrade() -> None:
    op.drop_table("job_metrics")
