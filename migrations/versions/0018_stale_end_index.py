"""allocation_intervals: a partial index of the runs closed as stale, by their end

The stale sweeper reopens a run it closed when its workload sends a heartbeat later than the
close (`runs_repo.revived_runs`). It looks at the stale closes of a recent window on every sweep;
without this index that is a scan of the whole table. Stale closes are rare, so the index is
small and costs the writes of other runs nothing.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04 18:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_allocation_intervals_stale_end",
        "allocation_intervals",
        ["ended_at"],
        unique=False,
        postgresql_where=sa.text("end_kind = 'stale'"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_allocation_intervals_stale_end",
        table_name="allocation_intervals",
        postgresql_where=sa.text("end_kind = 'stale'"),
    )
