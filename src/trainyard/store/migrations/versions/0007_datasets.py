"""Dataset versions and run records.

Revision ID: 0007_datasets
Revises: 0006_tenant_walls
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_datasets"
down_revision = "0006_tenant_walls"
branch_labels = None
depends_on = None

BigIntId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "dataset_versions",
        sa.Column("seq", BigIntId, primary_key=True, autoincrement=True),
        sa.Column(
            "tenant_id", sa.String(40), sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("split_key", sa.String(64), nullable=False),
        sa.Column("format", sa.String(16), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("duplicates_removed", sa.BigInteger(), nullable=False),
        sa.Column("eval_fraction", sa.Float(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("tokenizer", sa.String(200), nullable=False),
        sa.Column("splits", sa.JSON(), nullable=False),
        sa.Column("stats", sa.JSON(), nullable=False),
        sa.Column("storage_url", sa.Text(), nullable=False),
        sa.Column("derived_from", sa.String(200), nullable=True),
        sa.Column("created_at_s", sa.Float(), nullable=False),
        sa.UniqueConstraint("tenant_id", "name", "version", name="uq_dataset_versions_name_version"),
        sa.UniqueConstraint("tenant_id", "name", "split_key", name="uq_dataset_versions_name_split"),
    )
    op.create_index("ix_dataset_versions_tenant_name", "dataset_versions", ["tenant_id", "name"])
    op.create_index("ix_dataset_versions_sha256", "dataset_versions", ["sha256"])
    op.create_table(
        "run_records",
        sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
        sa.Column(
            "tenant_id", sa.String(40), sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("job_id", sa.String(40), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("record", sa.JSON(), nullable=False),
        sa.Column("created_at_s", sa.Float(), nullable=False),
        sa.UniqueConstraint("job_id", "attempt", name="uq_run_records_job_attempt"),
    )
    op.create_index("ix_run_records_tenant_id", "run_records", ["tenant_id"])
    op.create_index("ix_run_records_job_id", "run_records", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_run_records_job_id", table_name="run_records")
    op.drop_index("ix_run_records_tenant_id", table_name="run_records")
    op.drop_table("run_records")
    op.drop_index("ix_dataset_versions_sha256", table_name="dataset_versions")
    op.drop_index("ix_dataset_versions_tenant_name", table_name="dataset_versions")
    op.drop_table("dataset_versions")
