"""node_pools.gang_entitlement

Gang entitlement (docs/GANG_ENTITLEMENT.md, issue 20): a pool policy switch that lets a long-waiting
gang of the most under-served queue of its tier be admitted beyond its queue's fair share. Off by
default, so existing pools get false and behave as before.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01 17:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "node_pools",
        sa.Column(
            "gang_entitlement", sa.Boolean(), server_default=sa.text("false"), nullable=False
        ),
    )


def downgrade() -> None:
    op.drop_column("node_pools", "gang_entitlement")
