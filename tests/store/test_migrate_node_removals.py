"""Migration 0029: a node's removal in `node_config_history` says so, on PostgreSQL.

Pool `p` is made at NOW - 1000 with a0..a3 (8 A100 each); a2 is removed at NOW - 800; a3 is made
not ready with 6 GPUs declared at NOW - 700 and removed at NOW - 600; a1 is made not ready at
NOW - 500, and stays. Going back to 0028, a2's removal row takes its 8 GPUs again (as the code
before wrote it) and a3's goes (the code before wrote none for a node that counted nowhere).
Coming up again, a2's row, a removal by its look, is one again; a3's last row (not ready, 6 GPUs)
is not one, and a3 is removed at the migration's instant. A late report of a2 after its removal
is refused, one of a1 while it is not ready stored.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace

from alembic import command

from gpufair.domain.ledger import EventKind, LedgerEvent
from gpufair.store import ingest_pipeline, migrate
from gpufair.store.database import Database, make_engine
from gpufair.store.scratch import scratch_database
from tests.store.ingest_support import NOW
from tests.store.migrate_support import sql_rows as _rows
from tests.store.test_capacity_history import _apply, _config

_HISTORY = (
    "SELECT node, extract(epoch FROM changed_at)::float8 - :now, pool, gpu_count "
    "FROM node_config_history WHERE changed_at > to_timestamp(0) ORDER BY node, changed_at"
)


def test_removals_are_marked_and_unmarked(pg_server: Database) -> None:
    with scratch_database(pg_server.url) as url:
        migrate.upgrade(url)
        engine = make_engine(url, pool_size=1)
        try:
            with engine.connect() as conn:
                config = _config(4)
                a0, a1, _a2, a3 = config.nodes
                _apply(conn, config, -1000)
                _apply(conn, replace(config, nodes=(a0, a1, a3)), -800)
                drained = replace(a3, ready=False, gpu_count=6)
                _apply(conn, replace(config, nodes=(a0, a1, drained)), -700)
                _apply(conn, replace(config, nodes=(a0, a1)), -600)
                _apply(conn, replace(config, nodes=(a0, replace(a1, ready=False))), -500)
                conn.commit()
            first = [("a0", -1000.0, "p", 8), ("a1", -1000.0, "p", 8), ("a1", -500.0, None, 8)]
            assert _rows(url, _HISTORY, now=NOW) == [
                *first,
                ("a2", -1000.0, "p", 8),
                ("a2", -800.0, None, -1),
                ("a3", -1000.0, "p", 8),
                ("a3", -700.0, None, 6),
                ("a3", -600.0, None, -1),
            ]
            command.downgrade(migrate.alembic_config(url), "0028")
            assert _rows(url, _HISTORY, now=NOW) == [
                *first,
                ("a2", -1000.0, "p", 8),
                ("a2", -800.0, None, 8),
                ("a3", -1000.0, "p", 8),
                ("a3", -700.0, None, 6),
            ]
            before = time.time()
            migrate.upgrade(url)
            after = time.time()
            *rows, (node, removed_at, pool, gpus) = _rows(url, _HISTORY, now=NOW)
            assert rows == [
                *first,
                ("a2", -1000.0, "p", 8),
                ("a2", -800.0, None, -1),
                ("a3", -1000.0, "p", 8),
                ("a3", -700.0, None, 6),
            ]
            assert (node, pool, gpus) == ("a3", None, -1)
            assert before - 1 <= NOW + removed_at <= after + 1
            with engine.connect() as conn:
                a2_late, a1_late = (
                    LedgerEvent(
                        str(uuid.uuid4()), EventKind.NODE_CAPACITY, NOW - 300, node=n, gpu_count=4
                    )
                    for n in ("a2", "a1")
                )
                outcomes = ingest_pipeline.ingest(conn, [a2_late, a1_late], NOW)
                assert [(o.status.value, o.error) for o in outcomes] == [
                    ("rejected", "unknown node 'a2'"),
                    ("stored", ""),
                ]
                conn.rollback()
        finally:
            engine.dispose()
