"""An index on (tenant, state) of jobs: a tenant's job counts per state (the dashboard's overview)
from the index alone, without reading every job row.

Revision ID: 0011_jobs_tenant_state_index
Revises: 0010_job_metrics_attempt_index
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0011_jobs_tenant_state_index"
down_revision = "0010_job_metrics_attempt_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_tenant_state", "jobs", ["tenant_id", "state"])


def downgrade() -> None:
    op.drop_index("ix_jobs_tenant_state", table_name="jobs")
