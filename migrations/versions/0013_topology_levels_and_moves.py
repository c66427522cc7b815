"""node_pools.topology_levels, node_pools.max_moved_share_per_hour, evictions.move_to

Topology levels with fallback and defragmentation (issue 15): a pool's ordered topology levels
(a JSON list of label keys, empty as before), the share of its GPUs that may be moved per hour
(NULL: no moves, as before), and for an eviction that is a move, where the workload goes
(`{"gpu_type": ..., "pods": [...]}`, NULL for a plain eviction), and a log of the last hour's
moves per pool (the move budget's use).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 18:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "node_pools",
        sa.Column(
            "topology_levels", JSONB(), nullable=False, server_default=sa.text("'[]'::jsonb")
        ),
    )
    op.add_column("node_pools", sa.Column("max_moved_share_per_hour", sa.Double(), nullable=True))
    op.add_column("evictions", sa.Column("move_to", JSONB(), nullable=True))
    op.create_table(
        "moves",
        sa.Column("pool", sa.Text(), nullable=False),
        sa.Column("victim_uid", sa.Text(), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("gpus", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("pool", "victim_uid", "decided_at", name=op.f("pk_moves")),
    )


def downgrade() -> None:
    op.drop_table("moves")
    op.drop_column("evictions", "move_to")
    op.drop_column("node_pools", "max_moved_share_per_hour")
    op.drop_column("node_pools", "topology_levels")
