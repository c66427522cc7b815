"""rollup_watermarks.current_from: from which instant a pool's moments agree with its config

A change of queues, GPU types or pools redid every bucket of the pool, back to its first run;
the next rollup now redoes only the buckets the pool's usage window reads, and records from
which hour on the buckets were made with the config it stamps. Older buckets keep what the
config of their rollup made of them, and are redone when the window reads back to them. NULL:
every bucket agrees, which is what every row said before this migration (any such change
redid all of them).

Going back, a pool whose older buckets were made under an older config loses its watermark: the
code before this migration takes every bucket for one made with the version stamped, and
redoes a pool without a watermark whole at its next rollup.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-09 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "rollup_watermarks",
        sa.Column("current_from", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.execute("DELETE FROM rollup_watermarks WHERE current_from IS NOT NULL")
    op.drop_column("rollup_watermarks", "current_from")
