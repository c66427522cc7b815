"""node_history_start: the instant from which the nodes' config history is complete

Migration 0025 began the nodes' config history empty, a node without a row counting as it is
configured now since ever: on a database that held nodes before it, a late report older than the
upgrade rebuilt its pool's capacity rows with the nodes of now (a node added, removed, drained or
moved before the upgrade counted as it is now), and rewrote rows nothing tells how to recount.
From this instant on the history is complete (the nodes were as configured at the upgrade until
the next config apply): a rebuild starts no earlier, and the rows before it stay as recorded.

Recorded only on a database whose history is incomplete (a node without a row, or with the row
0025's first apply wrote as of before it, at the epoch); a database made at 0025 or later has
none, and rebuilds from any instant.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-08 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "node_history_start",
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("since", name=op.f("pk_node_history_start")),
    )
    op.execute(
        """
        INSERT INTO node_history_start (since)
        SELECT now()
        WHERE EXISTS (SELECT 1 FROM nodes n WHERE NOT EXISTS (
                          SELECT 1 FROM node_config_history h WHERE h.node = n.name))
           OR EXISTS (SELECT 1 FROM node_config_history WHERE changed_at = to_timestamp(0))
        """
    )


def downgrade() -> None:
    op.drop_table("node_history_start")
