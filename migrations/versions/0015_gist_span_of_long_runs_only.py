"""allocation_intervals: the GiST index on the run's time range holds long and open runs only

The GiST index on `tstzrange(started_at, ended_at)` was the dearest write of an interval: on a
table of 300,000 intervals, inserting 400 runs cost PostgreSQL about as much again with it as
without it (`bench/span_index.py`, `bench/results/ingest.md`). It now holds only runs that are
open or lasted at least an hour; window queries find the shorter ones through the B-tree on
(pool, started_at), since a short run that overlaps [lo, hi) started after lo - 1 hour
(`rollup_repo.intervals_between`). Only an index changes: no row is touched.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01 20:35:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

# As in store/ledger_tables.py when this was written (a migration keeps its own copy).
_LONG_OR_OPEN = "ended_at IS NULL OR ended_at - started_at >= interval '1 hour'"
_SPAN = "tstzrange(started_at, ended_at, '[)')"


def upgrade() -> None:
    op.create_index(
        "ix_allocation_intervals_long_span",
        "allocation_intervals",
        [sa.literal_column(_SPAN)],
        unique=False,
        postgresql_using="gist",
        postgresql_where=sa.text(_LONG_OR_OPEN),
    )
    op.drop_index(
        "ix_allocation_intervals_span", table_name="allocation_intervals", postgresql_using="gist"
    )


def downgrade() -> None:
    op.create_index(
        "ix_allocation_intervals_span",
        "allocation_intervals",
        [sa.literal_column(_SPAN)],
        unique=False,
        postgresql_using="gist",
    )
    op.drop_index(
        "ix_allocation_intervals_long_span",
        table_name="allocation_intervals",
        postgresql_using="gist",
    )
