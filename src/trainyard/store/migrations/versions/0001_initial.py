"""Initial schema: tenants, API keys, jobs, job events, pools.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None

BigIntId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("name", sa.String(100), nullable=False, unique=True),
        sa.Column("created_at_s", sa.Float(), nullable=False),
        sa.Column("max_queued_jobs", sa.Integer(), nullable=True),
        sa.Column("max_active_devices", sa.Integer(), nullable=True),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column(
            "tenant_id", sa.String(40), sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("prefix", sa.String(32), nullable=False),
        sa.Column("key_sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("admin", sa.Boolean(), nullable=False),
        sa.Column("revoked", sa.Boolean(), nullable=False),
        sa.Column("created_at_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_api_keys_tenant_id", "api_keys", ["tenant_id"])
    op.create_index("ix_api_keys_prefix", "api_keys", ["prefix"])
    op.create_table(
        "jobs",
        sa.Column("seq", BigIntId, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(40), nullable=False, unique=True),
        sa.Column(
            "tenant_id", sa.String(40), sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("spec_sha256", sa.String(64), nullable=False),
        sa.Column("idempotency_key", sa.String(200), nullable=True),
        sa.Column("created_at_s", sa.Float(), nullable=False),
        sa.Column("updated_at_s", sa.Float(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("placement", sa.JSON(), nullable=True),
        sa.Column("quote", sa.JSON(), nullable=True),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("checkpoints", sa.JSON(), nullable=False),
        sa.Column("workers", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("progress", sa.JSON(), nullable=False),
        sa.Column("attempt_started_at_s", sa.Float(), nullable=True),
        sa.Column("run_dir", sa.Text(), nullable=True),
        sa.UniqueConstraint("tenant_id", "idempotency_key", name="uq_jobs_tenant_idempotency"),
    )
    op.create_index("ix_jobs_tenant_seq", "jobs", ["tenant_id", "seq"])
    op.create_index("ix_jobs_state_seq", "jobs", ["state", "seq"])
    op.create_table(
        "job_events",
        sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(40), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("time_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_job_events_job_id_id", "job_events", ["job_id", "id"])
    op.create_table(
        "pools",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("doc", sa.JSON(), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("updated_at_s", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("pools")
    op.drop_index("ix_job_events_job_id_id", table_name="job_events")
    op.drop_table("job_events")
    op.drop_index("ix_jobs_state_seq", table_name="jobs")
    op.drop_index("ix_jobs_tenant_seq", table_name="jobs")
    op.drop_table("jobs")
    op.drop_index("ix_api_keys_prefix", table_name="api_keys")
    op.drop_index("ix_api_keys_tenant_id", table_name="api_keys")
    op.drop_table("api_keys")
    op.drop_table("tenants")
