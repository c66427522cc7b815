"""node_pools.division: the pool's division profile, `gpufair` or `kai`

Issue 22: a pool may divide over-quota capacity by KAI-Scheduler's rules (weights recomputed per
round, weight 0 without over-quota, limits below the quota, KAI's tumbling boundary). Existing
pools keep gpufair's rules: the column defaults to 'gpufair'.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 18:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "node_pools",
        sa.Column("division", sa.Text(), nullable=False, server_default=sa.text("'gpufair'")),
    )
    op.create_check_constraint(
        op.f("ck_node_pools_division_known"), "node_pools", "division IN ('gpufair', 'kai')"
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_node_pools_division_known"), "node_pools", type_="check")
    op.drop_column("node_pools", "division")
