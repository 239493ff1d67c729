"""Measured step times per job attempt (feedback into the predictor's calibration).

Revision ID: 0002_step_times
Revises: 0001_initial
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_step_times"
down_revision = "0001_initial"
branch_labels = None
depends_on = None

BigIntId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "step_time_measurements",
        sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(40), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("pool", sa.String(200), nullable=False),
        sa.Column("accelerator", sa.String(64), nullable=False),
        sa.Column("devices", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("median_step_time_s", sa.Float(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("step_times_s", sa.JSON(), nullable=False),
        sa.Column("measured_at_s", sa.Float(), nullable=False),
        sa.UniqueConstraint("job_id", "attempt", name="uq_step_time_job_attempt"),
    )
    op.create_index(
        "ix_step_time_measurements_accelerator", "step_time_measurements", ["accelerator"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_step_time_measurements_accelerator", table_name="step_time_measurements")
    op.drop_table("step_time_measurements")
