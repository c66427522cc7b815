"""A batch's statements are prepared on a connection's first batch (`prepared_at_once`): the
same dozen statements go out with every message, and psycopg would otherwise have PostgreSQL
parse and plan each of them anew for a connection's first five messages. The connection's own
threshold is put back for whoever uses it next."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.store import ingest_pipeline
from gpufair.store.database import make_engine
from tests.store.ingest_support import NOW, STORED, one_pool_connection


@pytest.fixture
def fresh(db: Engine, database_url: str) -> Iterator[Engine]:
    """An engine of its own, so that its one connection has run nothing of ingest yet; the pool
    `p` and workloads `w0`..`w3` committed through `db` (emptied after the test)."""
    for _ in one_pool_connection(db, nodes=2):
        engine = make_engine(database_url, pool_size=1)
        try:
            yield engine
        finally:
            engine.dispose()


def message(k: int) -> list[LedgerEvent]:
    """`w0` starts on a0 (k = 0) or stops (k = 1); `w1`..`w3` beat, one second later each time."""
    at = NOW - 600 + 60 * k
    run = (
        LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, at, "w0", (EventPod("a0", (0,)),))
        if k == 0
        else LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, at, "w0")
    )
    beats = [
        LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, at + 1, f"w{i}") for i in (1, 2, 3)
    ]
    return [run, *beats]


def prepared(conn: Connection) -> dict[str, str]:
    """The statements the driver prepared on `conn`'s backend, by name: their text's first
    40 characters, spaces folded."""
    rows = conn.execute(
        text("SELECT name, statement FROM pg_prepared_statements WHERE NOT from_sql")
    )
    return {r[0]: " ".join(r[1].split())[:40] for r in rows}


def test_a_connections_first_batch_is_sent_prepared(fresh: Engine) -> None:
    with fresh.connect() as conn:
        pg = ingest_pipeline._driver(conn)
        conn.commit()
        threshold = pg.prepare_threshold
        assert threshold == 5  # psycopg's default: prepared on the sixth run

        batch = ingest_pipeline.prepare(message(0), NOW)
        assert ingest_pipeline.write(conn, batch, commit=True).final() == [STORED] * 4
        first = prepared(conn)
        conn.commit()
        # The read: the sweeper's lock, two settings, the locked workloads, the lookup of those
        # not known to exist, nodes, run events, intervals, GPU types, the savepoint; the
        # writes: the savepoint's release, the state, the interval, the rollup mark, the
        # overlap check's read, the commit.
        assert len(first) == 16, first
        for head in (
            "SELECT pg_advisory_xact_lock_shared($1)",
            "SELECT w.uid, w.queue, w.pool, w.state, ",
            "SAVEPOINT gpufair_ingest_copy",
            "UPDATE workloads w SET state = r.state, ",
            "INSERT INTO allocation_intervals (worklo",
            "COMMIT",
        ):
            assert head in first.values(), (head, first)
        assert pg.prepare_threshold == threshold

        # The second message (the stop) runs them again, under the names they were prepared
        # with, and adds the interval's delete, new to this connection.
        batch = ingest_pipeline.prepare(message(1), NOW)
        assert ingest_pipeline.write(conn, batch, commit=True).final() == [STORED] * 4
        second = prepared(conn)
        conn.commit()
        assert second.items() >= first.items()
        added = sorted(set(second.values()) - set(first.values()))
        assert added == ["DELETE FROM allocation_intervals WHERE i"]

        # A statement of the connection's next user is prepared as psycopg would have it.
        assert conn.execute(text("SELECT 1 AS after_ingest")).scalar() == 1
        conn.commit()
        assert prepared(conn) == second
        rows = conn.execute(
            text(
                "SELECT kind, count(*) FROM ledger_events WHERE workload_uid IN "
                "('w0', 'w1', 'w2', 'w3') GROUP BY kind ORDER BY kind"
            )
        ).all()
        assert [tuple(r) for r in rows] == [("heartbeat", 6), ("started", 1), ("stopped", 1)]
