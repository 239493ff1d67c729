"""The settings version: one counter row that every admin change of a tenant's settings moves, so that
every server process drops its cached copies of them within a fraction of a second.

Revision ID: 0015_settings_version
Revises: 0014_deployment_engine
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015_settings_version"
down_revision = "0014_deployment_engine"
branch_labels = None
depends_on = None

BigIntId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    table = op.create_table(
        "settings_version",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("version", BigIntId, nullable=False),
    )
    op.bulk_insert(table, [{"id": 1, "version": 0}])


def downgrade() -> None:
    op.drop_table("settings_version")
