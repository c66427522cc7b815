"""workloads.events_purged_at

Retention removes a finished workload's events all together; the workload now says so, so that a
late run event for it is refused instead of rebuilding its runs from that one event.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "workloads", sa.Column("events_purged_at", sa.DateTime(timezone=True), nullable=True)
    )
    # Workloads whose events retention already removed: finished or cancelled, with runs on
    # record and not one event left.
    op.execute(
        """
        UPDATE workloads w SET events_purged_at = now()
        WHERE w.state IN ('finished', 'cancelled')
          AND EXISTS (SELECT 1 FROM allocation_intervals i WHERE i.workload_uid = w.uid)
          AND NOT EXISTS (SELECT 1 FROM ledger_events e WHERE e.workload_uid = w.uid)
        """
    )


def downgrade() -> None:
    op.drop_column("workloads", "events_purged_at")
