"""Pool capacity over time: what the fair-share engine divides and usage is normalised by.

A pool's capacity is the CU of its ready nodes, each counted with the GPUs the batch system last
reported usable (node_capacity events), else its declared GPU count. A new row is written whenever
that changes: by a config apply or by a node capacity event.

Capacity is what rollups divide by, so a change is also a rollup dirty mark from its instant (a
node capacity event may come late, or commit while a rollup runs; `rollup_repo.rollup_pool`).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from datetime import UTC, datetime

from sqlalchemy import Connection, select, text

from gpufair.domain.usage import Segment
from gpufair.store import locks
from gpufair.store import tables as t
from gpufair.store.ledger_tables import node_capacity, pool_capacity_changes


def capacity_now(conn: Connection) -> dict[str, tuple[float, dict[str, float]]]:
    """Per pool: (CU, GPUs by type) of its ready nodes as they are now."""
    weights = dict(conn.execute(select(t.gpu_types.c.name, t.gpu_types.c.compute_weight)).all())
    overrides = dict(conn.execute(select(node_capacity.c.node, node_capacity.c.gpu_count)).all())
    cu: dict[str, float] = defaultdict(float)
    by_type: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for pool_row in conn.execute(select(t.node_pools.c.name)):
        cu[pool_row.name] = 0.0
    for n in conn.execute(
        select(t.nodes.c.name, t.nodes.c.pool, t.nodes.c.gpu_type, t.nodes.c.gpu_count).where(
            t.nodes.c.ready
        )
    ):
        gpus = min(n.gpu_count, overrides.get(n.name, n.gpu_count))
        cu[n.pool] += gpus * weights.get(n.gpu_type, 0.0)
        by_type[n.pool][n.gpu_type] += gpus
    return {pool: (cu[pool], dict(by_type[pool])) for pool in cu}


def lock_changes(conn: Connection) -> None:
    """Serialise capacity writers until this transaction ends (`locks.CAPACITY`): take it before
    the first write that changes a capacity (a node's usable GPUs), so the recount after it sees
    every change committed by another writer. Taking it again in the transaction is free."""
    locks.xact_lock(conn, locks.CAPACITY)


def record_if_changed(conn: Connection, at_s: float, source: str) -> int:
    """Write a capacity row for every pool whose capacity differs from its latest row, and a
    rollup dirty mark from `at_s` for it. Under `lock_changes` (taken here if the caller has
    not): without it, two writers at once each recounted without the other's uncommitted change,
    and the later row lacked the earlier change from then on."""
    lock_changes(conn)
    latest = {
        r.pool: (r.capacity_cu, r.capacity_gpus_by_type)
        for r in conn.execute(
            text(
                "SELECT DISTINCT ON (pool) pool, capacity_cu, capacity_gpus_by_type "
                "FROM pool_capacity_changes ORDER BY pool, changed_at DESC"
            )
        )
    }
    written = 0
    for pool, (cu, by_type) in capacity_now(conn).items():
        if latest.get(pool) == (cu, by_type):
            continue
        conn.execute(
            text(
                "INSERT INTO pool_capacity_changes "
                "(pool, changed_at, capacity_cu, capacity_gpus_by_type, source) "
                "VALUES (:pool, to_timestamp(:at), :cu, CAST(:by_type AS jsonb), :source) "
                "ON CONFLICT (pool, changed_at) DO UPDATE SET capacity_cu = EXCLUDED.capacity_cu, "
                "capacity_gpus_by_type = EXCLUDED.capacity_gpus_by_type, source = EXCLUDED.source"
            ),
            {"pool": pool, "at": at_s, "cu": cu, "by_type": json.dumps(by_type), "source": source},
        )
        conn.execute(
            text(
                "INSERT INTO rollup_dirty_marks (pool, dirty_from) VALUES (:pool, to_timestamp(:at))"
            ),
            {"pool": pool, "at": at_s},
        )
        written += 1
    return written


def capacity_timeline(conn: Connection, pool: str, until_s: float) -> list[Segment]:
    """The pool's CU capacity as segments up to `until_s` (the last one open to it). A row whose
    capacity is not finite (from a GPU type's absurd weight stored before the input limits) is
    no capacity at all: it would make every fair share of the pool fail for as long as it stays
    in the window (store/data_checks.py says so in the replies)."""
    rows = conn.execute(
        select(pool_capacity_changes.c.changed_at, pool_capacity_changes.c.capacity_cu)
        .where(pool_capacity_changes.c.pool == pool)
        .order_by(pool_capacity_changes.c.changed_at)
    ).all()
    segments: list[Segment] = []
    for i, row in enumerate(rows):
        start = row.changed_at.timestamp()
        end = rows[i + 1].changed_at.timestamp() if i + 1 < len(rows) else until_s
        if end > start and 0 < row.capacity_cu < math.inf:
            segments.append(Segment(start, end, row.capacity_cu))
    return segments


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)
