"""Model registry (versions, aliases, alias history) and evaluations.

Revision ID: 0004_registry
Revises: 0003_governance
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_registry"
down_revision = "0003_governance"
branch_labels = None
depends_on = None

BigIntId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "model_versions",
        sa.Column("seq", BigIntId, primary_key=True, autoincrement=True),
        sa.Column("tenant_id", sa.String(40), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("public", sa.Boolean(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("base", sa.String(200), nullable=True),
        sa.Column("source_job", sa.String(40), nullable=True),
        sa.Column("datasets", sa.JSON(), nullable=False),
        sa.Column("doc", sa.JSON(), nullable=False),
        sa.Column("created_by", sa.String(100), nullable=False),
        sa.Column("created_at_s", sa.Float(), nullable=False),
        sa.UniqueConstraint("tenant_id", "name", "version", name="uq_model_versions_tenant_name_version"),
    )
    op.create_index("ix_model_versions_tenant_id", "model_versions", ["tenant_id"])
    op.create_index("ix_model_versions_source_job", "model_versions", ["source_job"])
    op.create_index("ix_model_versions_public_name", "model_versions", ["public", "name"])
    op.create_table(
        "model_aliases",
        sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
        sa.Column("tenant_id", sa.String(40), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("alias", sa.String(64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_at_s", sa.Float(), nullable=False),
        sa.UniqueConstraint("tenant_id", "name", "alias", name="uq_model_aliases"),
    )
    op.create_table(
        "model_alias_events",
        sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
        sa.Column("tenant_id", sa.String(40), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("alias", sa.String(64), nullable=False),
        sa.Column("from_version", sa.Integer(), nullable=True),
        sa.Column("to_version", sa.Integer(), nullable=False),
        sa.Column("actor", sa.String(100), nullable=False),
        sa.Column("evaluation_id", sa.String(40), nullable=True),
        sa.Column("forced", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("time_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_model_alias_events_tenant_name", "model_alias_events", ["tenant_id", "name", "id"])
    op.create_table(
        "evaluations",
        sa.Column("seq", BigIntId, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(40), nullable=False, unique=True),
        sa.Column("tenant_id", sa.String(40), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("baseline", sa.String(200), nullable=False),
        sa.Column("dataset", sa.String(500), nullable=False),
        sa.Column("split", sa.String(32), nullable=False),
        sa.Column("job_id", sa.String(40), nullable=True),
        sa.Column("doc", sa.JSON(), nullable=False),
        sa.Column("created_at_s", sa.Float(), nullable=False),
        sa.Column("finished_at_s", sa.Float(), nullable=True),
    )
    op.create_index("ix_evaluations_tenant_seq", "evaluations", ["tenant_id", "seq"])
    op.create_index("ix_evaluations_model", "evaluations", ["model"])
    op.create_index("ix_evaluations_job_id", "evaluations", ["job_id"])


def downgrade() -> None:
    op.drop_table("evaluations")
    op.drop_table("model_alias_events")
    op.drop_table("model_aliases")
    op.drop_table("model_versions")
