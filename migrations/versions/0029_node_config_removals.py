"""node_config_history: a node's removal says so (declared GPUs -1)

A node capacity report is judged against its node as configured just before its instant, in time
or late alike. The history's row of a removal looked like one of a node made not ready (no pool,
the GPUs it had), and a node removed while not ready got no row: a late report of a node removed
before it was stored (as of the GPUs it had), where in time it was refused as of an unknown node.
A removal's row now has -1 declared GPUs (`node_history_repo.REMOVED`), for a node not ready too.

The rows before this migration do not always tell. Of a node not configured now, a last row
without a pool that repeats the one before it but for its pool is what a removal wrote, and is
marked as one (a node made not ready and then removed, with no row of its removal, reads the
same: its reports after it are refused from then on). A node not configured now whose last row
is otherwise gets a removal row at this migration's instant: it was removed at some point up to
it.

Going back, a removal's row takes again the declared GPUs of the row before it, as the code
before wrote; one of a node that counted nowhere already goes, as the code before wrote none.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-10 10:00:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

REMOVED = -1

# Each row with the one before it of its node, and whether a later one follows.
_NEIGHBOURS = """
    SELECT node, changed_at, pool, gpu_type, gpu_count, cu_per_gpu,
           lag(pool) OVER w AS prev_pool, lag(gpu_type) OVER w AS prev_type,
           lag(gpu_count) OVER w AS prev_count, lag(cu_per_gpu) OVER w AS prev_cu,
           lead(changed_at) OVER w AS next_at
    FROM node_config_history
    WINDOW w AS (PARTITION BY node ORDER BY changed_at)
"""


def upgrade() -> None:
    op.execute(
        f"""
        UPDATE node_config_history h SET gpu_count = {REMOVED}
        FROM ({_NEIGHBOURS}) AS r
        WHERE r.node = h.node AND r.changed_at = h.changed_at
          AND r.next_at IS NULL AND r.pool IS NULL AND r.prev_pool IS NOT NULL
          AND (r.gpu_type, r.gpu_count, r.cu_per_gpu) = (r.prev_type, r.prev_count, r.prev_cu)
          AND NOT EXISTS (SELECT 1 FROM nodes n WHERE n.name = h.node)
        """
    )
    op.execute(
        f"""
        INSERT INTO node_config_history (node, changed_at, pool, gpu_type, gpu_count, cu_per_gpu)
        SELECT r.node, now(), NULL, r.gpu_type, {REMOVED}, r.cu_per_gpu
        FROM ({_NEIGHBOURS}) AS r
        WHERE r.next_at IS NULL AND r.gpu_count <> {REMOVED} AND r.changed_at < now()
          AND NOT EXISTS (SELECT 1 FROM nodes n WHERE n.name = r.node)
        """
    )


def downgrade() -> None:
    op.execute(
        f"""
        UPDATE node_config_history h SET gpu_count = r.prev_count
        FROM ({_NEIGHBOURS}) AS r
        WHERE r.node = h.node AND r.changed_at = h.changed_at
          AND h.gpu_count = {REMOVED} AND r.prev_pool IS NOT NULL
        """
    )
    op.execute(f"DELETE FROM node_config_history WHERE gpu_count = {REMOVED}")
