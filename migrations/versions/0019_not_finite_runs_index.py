"""allocation_intervals: a partial index of the runs whose GPUs or CU are not finite

Every fair-share recompute counts the runs of its pool's usage window that are not finite
(`store/data_checks.py`, for the warning in the replies). Without an index for that condition
PostgreSQL read every run of the pool: on a ledger of 2,000,000 runs 95 ms of a 110 ms
recompute, growing with the history (`bench/results/recompute.md`). Such runs can only come from
before the input limits, so this index is normally empty: the count becomes a lookup, and a
finite run costs the index nothing but its predicate.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05 22:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

# As in store/ledger_tables.py when this was written (a migration keeps its own copy).
_NOT_FINITE_RUN = "NOT (gpus < 'Infinity'::float8 AND cu < 'Infinity'::float8)"


def upgrade() -> None:
    op.create_index(
        "ix_allocation_intervals_not_finite",
        "allocation_intervals",
        ["pool"],
        unique=False,
        postgresql_where=sa.text(_NOT_FINITE_RUN),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_allocation_intervals_not_finite",
        table_name="allocation_intervals",
        postgresql_where=sa.text(_NOT_FINITE_RUN),
    )
