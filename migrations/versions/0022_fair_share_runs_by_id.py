"""fair_share_runs: an index on (pool, id), the order a pool's latest run is read in

A pool's latest run is the one stored last, its highest id (`store/fairshare_repo.py`), not the
one dated latest, which a replica whose clock ran ahead could put in the future. The read caches
check that run's key every few milliseconds (`store/read_versions.py`); without this index each
check read the primary key backwards past every run other pools stored since the pool's last
one (thousands for a pool recomputed every 6 hours beside pools recomputed every minute).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06 00:05:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_fair_share_runs_pool_id", "fair_share_runs", ["pool", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_fair_share_runs_pool_id", table_name="fair_share_runs")
