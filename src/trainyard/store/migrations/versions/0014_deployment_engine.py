"""Deployments name their inference engine (``transformers``, the built-in one, or ``vllm``).

Revision ID: 0014_deployment_engine
Revises: 0013_webhook_deliveries
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_deployment_engine"
down_revision = "0013_webhook_deliveries"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(sa.Column("engine", sa.String(32), nullable=False, server_default="transformers"))


def downgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.drop_column("engine")
