"""evictions in flight

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 05:45:25.782526
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "evictions",
        sa.Column("victim_uid", sa.Text(), nullable=False),
        sa.Column("beneficiary_uid", sa.Text(), nullable=True),
        sa.Column("pool", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("cycle_id", sa.BigInteger(), nullable=False),
        sa.Column(
            "decided_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("victim_uid", name=op.f("pk_evictions")),
    )
    op.create_index(op.f("ix_evictions_pool"), "evictions", ["pool"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_evictions_pool"), table_name="evictions")
    op.drop_table("evictions")
