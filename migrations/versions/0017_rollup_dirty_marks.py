"""rollup_dirty_marks: ingestion marks changed usage in a table of its own, never waits

Ingestion marked a change of usage by moving `rollup_watermarks.dirty_from` back, an UPDATE of
the row a rollup holds locked (FOR UPDATE) until its transaction ends. Two cases lost usage that
was acknowledged: a pool's first rollup had no row to mark, and an ingest in flight when a rollup
read the runs marked nothing when its change lay at or after the watermark of the moment, which
the rollup then moved past it. Making the ingest insert the row (and so wait for the rollup)
closed both but made starts wait for a `Schedule`'s whole cycle.

Now every ingest inserts one row per pool it changed into `rollup_dirty_marks` (insert only: no
lock, no wait), and a rollup deletes exactly the marks it read (`rollup_repo.rollup_pool`). The
column `dirty_from` goes; a mark it held becomes a row of the new table (and back, the earliest
per pool, on downgrade). Like every migration here, it runs before the new code serves: a
replica of the old code left running writes the dropped column and fails its ingests.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04 17:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rollup_dirty_marks",
        sa.Column("pool", sa.Text(), nullable=False),
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("dirty_from", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("pool", "id", name=op.f("pk_rollup_dirty_marks")),
    )
    op.execute(
        "INSERT INTO rollup_dirty_marks (pool, dirty_from) "
        "SELECT pool, dirty_from FROM rollup_watermarks WHERE dirty_from IS NOT NULL"
    )
    op.drop_column("rollup_watermarks", "dirty_from")


def downgrade() -> None:
    op.add_column(
        "rollup_watermarks",
        sa.Column("dirty_from", sa.DateTime(timezone=True), nullable=True),
    )
    op.execute(
        """
        UPDATE rollup_watermarks w SET dirty_from = m.at
        FROM (SELECT pool, min(dirty_from) AS at FROM rollup_dirty_marks GROUP BY pool) AS m
        WHERE m.pool = w.pool
        """
    )
    op.drop_table("rollup_dirty_marks")
