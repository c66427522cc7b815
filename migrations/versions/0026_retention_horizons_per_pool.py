"""retention_horizons per pool: each pool's rollups are pruned to a horizon of its own

Retention's horizon was one for every pool: the earliest instant any pool's usage window or any
budget's period read, so one pool counting all history without decay kept every pool's rollups,
runs and capacity history. Each pool now has its own horizon, and a full rollup redo of a pool
starts no earlier than the one recorded for it. The row recorded before this migration, of
every pool, becomes pool '' and still bounds every pool's redo: all pools were pruned to it.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07 00:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "retention_horizons",
        sa.Column("pool", sa.Text(), server_default=sa.text("''"), nullable=False),
    )
    op.drop_constraint("pk_retention_horizons", "retention_horizons", type_="primary")
    op.create_primary_key("pk_retention_horizons", "retention_horizons", ["kind", "pool"])


def downgrade() -> None:
    # One row per kind again: the earliest horizon any pool's redo is bounded by, the one
    # horizon the code before this migration prunes every pool to. A pool's bound is the later
    # of its own row and the row of every pool (''): all pools were pruned to that one, and a
    # pool's own row recorded earlier (held back by a budget or a longer retention since) does
    # not bring back what went. Without raising it first, such a row became the one horizon,
    # and the code before redid every pool from it, over hours all pools had lost.
    op.execute(
        "UPDATE retention_horizons h SET kept_from = every.kept_from "
        "FROM retention_horizons every "
        "WHERE every.kind = h.kind AND every.pool = '' AND h.kept_from < every.kept_from"
    )
    op.execute(
        "DELETE FROM retention_horizons h USING retention_horizons earlier "
        "WHERE earlier.kind = h.kind AND (earlier.kept_from, earlier.pool) < (h.kept_from, h.pool)"
    )
    op.drop_constraint("pk_retention_horizons", "retention_horizons", type_="primary")
    op.create_primary_key("pk_retention_horizons", "retention_horizons", ["kind"])
    op.drop_column("retention_horizons", "pool")
