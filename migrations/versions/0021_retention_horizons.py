"""retention_horizons: from when retention keeps rollups, so that a full redo starts there

A full rollup redo (after a change of queues, GPU types or a pool's policy) started at the
pool's oldest capacity row, never deleted, or its oldest run still stored: it wrote again the
buckets retention had deleted. Retention now records the horizon it deleted up to, and the redo
starts no earlier. Empty at first: until retention runs once, a redo starts where it always did.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06 01:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "retention_horizons",
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("kept_from", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("kind", name=op.f("pk_retention_horizons")),
    )


def downgrade() -> None:
    op.drop_table("retention_horizons")
