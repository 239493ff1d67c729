"""Serving: deployments, replicas, deployment events, metering records, shadow pairs.

Revision ID: 0005_serving
Revises: 0004_registry
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_serving"
down_revision = "0004_registry"
branch_labels = None
depends_on = None

BigIntId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "deployments",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column(
            "tenant_id", sa.String(40), sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("routes", sa.JSON(), nullable=False),
        sa.Column("previous_routes", sa.JSON(), nullable=True),
        sa.Column("canary", sa.JSON(), nullable=True),
        sa.Column("autoscaling", sa.JSON(), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("resolved", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at_s", sa.Float(), nullable=False),
        sa.Column("updated_at_s", sa.Float(), nullable=False),
        sa.UniqueConstraint("tenant_id", "name", name="uq_deployments_tenant_name"),
    )
    op.create_index("ix_deployments_tenant_id", "deployments", ["tenant_id"])
    op.create_table(
        "serving_replicas",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column(
            "tenant_id", sa.String(40), sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("base_version", sa.String(200), nullable=False),
        sa.Column("model_path", sa.Text(), nullable=False),
        sa.Column("backend", sa.String(16), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("host", sa.String(200), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("placement", sa.JSON(), nullable=False),
        sa.Column("started_at_s", sa.Float(), nullable=False),
        sa.Column("ready_at_s", sa.Float(), nullable=True),
    )
    op.create_index("ix_serving_replicas_tenant_id", "serving_replicas", ["tenant_id"])
    op.create_table(
        "deployment_events",
        sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
        sa.Column(
            "deployment_id",
            sa.String(40),
            sa.ForeignKey("deployments.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("time_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_deployment_events_dep_id", "deployment_events", ["deployment_id", "id"])
    op.create_table(
        "serving_requests",
        sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("tenant_id", sa.String(40), nullable=False),
        sa.Column("tenant", sa.String(100), nullable=False),
        sa.Column("deployment", sa.String(63), nullable=False),
        sa.Column("model_version", sa.String(200), nullable=False),
        sa.Column("base_version", sa.String(200), nullable=False),
        sa.Column("adapter", sa.String(200), nullable=True),
        sa.Column("route", sa.String(16), nullable=False),
        sa.Column("endpoint", sa.String(32), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("latency_s", sa.Float(), nullable=False),
        sa.Column("ttft_s", sa.Float(), nullable=True),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("replica_id", sa.String(40), nullable=True),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("created_at_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_serving_requests_tenant_time", "serving_requests", ["tenant_id", "created_at_s"])
    op.create_table(
        "serving_shadow_pairs",
        sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
        sa.Column(
            "deployment_id",
            sa.String(40),
            sa.ForeignKey("deployments.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("primary_model", sa.String(200), nullable=False),
        sa.Column("shadow_model", sa.String(200), nullable=False),
        sa.Column("primary_latency_s", sa.Float(), nullable=False),
        sa.Column("shadow_latency_s", sa.Float(), nullable=True),
        sa.Column("primary_completion_tokens", sa.Integer(), nullable=False),
        sa.Column("shadow_completion_tokens", sa.Integer(), nullable=True),
        sa.Column("primary_text", sa.Text(), nullable=False),
        sa.Column("shadow_text", sa.Text(), nullable=True),
        sa.Column("shadow_status", sa.Integer(), nullable=False),
        sa.Column("exact_match", sa.Boolean(), nullable=False),
        sa.Column("similarity", sa.Float(), nullable=False),
        sa.Column("created_at_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_shadow_pairs_dep", "serving_shadow_pairs", ["deployment_id", "id"])


def downgrade() -> None:
    op.drop_table("serving_shadow_pairs")
    op.drop_table("serving_requests")
    op.drop_table("deployment_events")
    op.drop_table("serving_replicas")
    op.drop_table("deployments")
