"""An index on (job, attempt, step) of step metrics: the attempts of a job and one attempt's curve
without scanning every row.

Revision ID: 0010_job_metrics_attempt_index
Revises: 0009_alert_webhooks
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0010_job_metrics_attempt_index"
down_revision = "0009_alert_webhooks"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_job_metrics_job_attempt", "job_metrics", ["job_id", "attempt", "step"])


def downgrade() -> None:
    op.drop_index("ix_job_metrics_job_attempt", table_name="job_metrics")
