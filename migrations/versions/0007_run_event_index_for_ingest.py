"""run-event index for ingest

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 06:49:14.175317
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index(op.f("ix_ledger_events_received_at"), table_name="ledger_events")
    op.create_index(
        "ix_ledger_events_workload_runs",
        "ledger_events",
        ["workload_uid"],
        unique=False,
        postgresql_where=sa.text("kind <> 'heartbeat'"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_ledger_events_workload_runs",
        table_name="ledger_events",
        postgresql_where=sa.text("kind <> 'heartbeat'"),
    )
    op.create_index(
        op.f("ix_ledger_events_received_at"), "ledger_events", ["received_at"], unique=False
    )
