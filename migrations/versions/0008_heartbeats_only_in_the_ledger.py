"""heartbeats only in the ledger

A heartbeat is stored as an event and nothing else: the sweeper reads a run's last sign of life
back from `ledger_events`, so ingesting a heartbeat no longer writes a new version of its
workload's row. The copies of that instant go: `workloads.last_heartbeat_at`, which ingest kept,
and `allocation_intervals.last_heartbeat_at`, which nothing wrote.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30 08:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_column("workloads", "last_heartbeat_at")
    op.drop_column("allocation_intervals", "last_heartbeat_at")


def downgrade() -> None:
    op.add_column(
        "allocation_intervals",
        sa.Column("last_heartbeat_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.add_column(
        "workloads", sa.Column("last_heartbeat_at", sa.DateTime(timezone=True), nullable=True)
    )
    # What ingest kept there: the latest started or heartbeat instant of the workload.
    op.execute(
        """
        UPDATE workloads w SET last_heartbeat_at = e.at
        FROM (SELECT workload_uid, max(occurred_at) AS at FROM ledger_events
              WHERE kind IN ('started', 'heartbeat') GROUP BY workload_uid) AS e
        WHERE e.workload_uid = w.uid
        """
    )
