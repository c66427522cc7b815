"""Migrations 0025 and 0027 on a database that held nodes and capacity rows before the nodes'
config history was kept, on PostgreSQL.

Pool `p` is made at NOW - 1000 with a0 and a1 (8 A100 each, 10 CU a GPU: 160 CU), and a2 is added
at NOW - 500 (240 CU). The database then goes back to 0024 (no node history) and up again, as an
existing one is upgraded. A report of a0 at NOW - 700 comes after: nothing says what the nodes
were configured as then, so the rows before the upgrade stay as recorded and the report counts
from the upgrade on, as of the nodes of then. Before, every node counted as configured now since
ever: the rebuild from NOW - 700 counted a2 there too, wrote 220 CU from NOW - 700 (a0's 6 GPUs,
a1 and a2: 140 CU at the time) and deleted the row of a2's addition.
"""

from __future__ import annotations

import time
import uuid

from alembic import command

from gpufair.domain.ledger import EventKind, LedgerEvent
from gpufair.store import ingest_pipeline, migrate
from gpufair.store.database import Database, make_engine
from gpufair.store.scratch import scratch_database
from tests.store.ingest_support import NOW, STORED
from tests.store.test_capacity_history import _apply, _config, _history


def test_a_late_report_after_an_upgrade_leaves_the_rows_before_it(pg_server: Database) -> None:
    with scratch_database(pg_server.url) as url:
        migrate.upgrade(url)
        engine = make_engine(url, pool_size=1)
        try:
            with engine.connect() as conn:
                _apply(conn, _config(2), -1000)
                _apply(conn, _config(3), -500)
                conn.commit()
            command.downgrade(migrate.alembic_config(url), "0024")
            before = time.time()
            migrate.upgrade(url)
            after = time.time()
            with engine.connect() as conn:
                event = LedgerEvent(
                    str(uuid.uuid4()), EventKind.NODE_CAPACITY, NOW - 700, node="a0", gpu_count=6
                )
                [outcome] = ingest_pipeline.ingest(conn, [event], NOW)
                assert outcome.status is STORED
                *kept, (upgraded_at, cu, source) = _history(conn)
                assert kept == [(-1000.0, 160.0, "config"), (-500.0, 240.0, "config")]
                assert before - 1 <= NOW + upgraded_at <= after + 1
                assert (cu, source) == (220.0, "node_capacity")
                conn.rollback()
        finally:
            engine.dispose()
