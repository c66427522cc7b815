"""indexes for window queries

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 05:53:03.507045
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_allocation_intervals_span",
        "allocation_intervals",
        [sa.literal_column("tstzrange(started_at, ended_at, '[)')")],
        unique=False,
        postgresql_using="gist",
    )
    op.create_index(
        "ix_fairness_hourly_pool_bucket", "fairness_hourly", ["pool", "bucket_start"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_fairness_hourly_pool_bucket", table_name="fairness_hourly")
    op.drop_index(
        "ix_allocation_intervals_span", table_name="allocation_intervals", postgresql_using="gist"
    )
