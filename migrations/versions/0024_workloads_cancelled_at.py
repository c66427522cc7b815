"""workloads.cancelled_at: a cancel outlives a run the batch system started anyway

A workload cancelled while pending or bound can still be started by the batch system (its start
was on its way). Its state then follows its run (`running`); once the run ends, `state_after`
made it `pending` again after a preemption, to be scheduled anew, or `finished`, unless the
start and the end came in one message, when the cancel was still its state: the outcome
depended on how the events were split into messages. The workload now keeps the instant it was
cancelled, and a cancelled workload whose runs have all ended is `cancelled` whatever came
between. Rows cancelled before this migration get their state's change time.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06 00:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("workloads", sa.Column("cancelled_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE workloads SET cancelled_at = state_changed_at WHERE state = 'cancelled'")


def downgrade() -> None:
    op.drop_column("workloads", "cancelled_at")
