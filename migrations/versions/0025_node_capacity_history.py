"""node_capacity_reports, node_config_history: a pool's capacity rebuilt when a report comes late

A node capacity event was counted against the node's latest report only (`node_capacity`) and
compared with the pool's latest capacity row: one older than that row was recorded behind it with
the capacity of now, and the rows after it kept a value without it, so the pool's capacity
history depended on the order events arrived in. Every report is now kept, and what each node
counts for (pool, GPU type, declared GPUs, CU per GPU) from each config change of it on, so the
rows from a late report's instant on can be computed again.

Reports already stored come in: the node_capacity events retention left, and each node's latest
report. The config history starts empty: a node with no row counts as it is configured now, and
each node gets its first row (as configured before it) at the first config apply.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "node_capacity_reports",
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.CheckConstraint(
            "gpu_count >= 0", name=op.f("ck_node_capacity_reports_gpu_count_non_negative")
        ),
        sa.PrimaryKeyConstraint("node", "reported_at", name=op.f("pk_node_capacity_reports")),
    )
    op.create_table(
        "node_config_history",
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("pool", sa.Text(), nullable=True),
        sa.Column("gpu_type", sa.Text(), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("cu_per_gpu", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("node", "changed_at", name=op.f("pk_node_config_history")),
    )
    op.create_index(
        op.f("ix_node_config_history_changed_at"),
        "node_config_history",
        ["changed_at"],
        unique=False,
    )
    # The latest report of each node first: of two reports at one instant, it is the one that
    # counted (the later arrival).
    op.execute(
        "INSERT INTO node_capacity_reports (node, reported_at, gpu_count) "
        "SELECT node, changed_at, gpu_count FROM node_capacity"
    )
    op.execute(
        """
        INSERT INTO node_capacity_reports (node, reported_at, gpu_count)
        SELECT DISTINCT ON (payload->>'node', occurred_at)
               payload->>'node', occurred_at, (payload->>'gpu_count')::int
        FROM ledger_events
        WHERE kind = 'node_capacity' AND payload->>'node' IS NOT NULL
          AND (payload->>'gpu_count')::int >= 0
        ORDER BY payload->>'node', occurred_at, received_at DESC
        ON CONFLICT (node, reported_at) DO NOTHING
        """
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_node_config_history_changed_at"), table_name="node_config_history")
    op.drop_table("node_config_history")
    op.drop_table("node_capacity_reports")
