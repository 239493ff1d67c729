"""Tenant walls: the storage roots an admin granted a tenant, and whether it may run user code.

Revision ID: 0006_tenant_walls
Revises: 0005_serving
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_tenant_walls"
down_revision = "0005_serving"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("storage_roots", sa.JSON(), nullable=False, server_default="[]"))
        batch.add_column(
            sa.Column("allow_user_code", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    # the embedded tenant runs the demo's own code (DESIGN §3.6)
    op.execute(
        sa.text("UPDATE tenants SET allow_user_code = :yes WHERE name = 'default'").bindparams(yes=True)
    )


def downgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("allow_user_code")
        batch.drop_column("storage_roots")
