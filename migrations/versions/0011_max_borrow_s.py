"""node_pools.max_borrow_s and queue_quotas.max_borrow_s

Borrowing with a time limit (DESIGN §4.3, issue 14): after `max_borrow_s` seconds, work of a queue
above its fair share may be reclaimed before its `min_runtime_s`. Unset (NULL) is no limit, as
before, so existing rows need no value.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 15:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("node_pools", sa.Column("max_borrow_s", sa.Double(), nullable=True))
    op.add_column("queue_quotas", sa.Column("max_borrow_s", sa.Double(), nullable=True))


def downgrade() -> None:
    op.drop_column("queue_quotas", "max_borrow_s")
    op.drop_column("node_pools", "max_borrow_s")
