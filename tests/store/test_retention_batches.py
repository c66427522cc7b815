"""Retention on a big table works in bounded batches, each committed, on PostgreSQL.

One DELETE per kind removed a whole backlog at once: on a large ledger (a first run, or a run
after retention was shortened) it passed the engine's 30 s statement timeout, the run rolled
back whole, and the next day's run had more to do. Here: workload `long` has 2,500 heartbeats
older than the 7-day heartbeat retention plus a recent one; 250 finished workloads have their
2 events each older than 180 days. With batches of 1,000 rows (100 workloads), no statement
deletes more, and each batch is committed as it goes.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, event, text

from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.domain.model import Workload
from gpufair.store import ingest_pipeline, retention_repo, workload_repo
from gpufair.store.retention_repo import Retention, apply_retention
from tests.store.test_rollups import POLICIES, install, make_config

DAY = 86400.0


def _ledger(db: Engine, now_s: float) -> None:
    pods = (EventPod("a1", (0,)),)
    old = now_s - 200 * DAY
    events = [LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, now_s - 20 * DAY, "long", pods)]
    events += [
        LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, now_s - 19 * DAY + 60 * i, "long")
        for i in range(2500)
    ]
    events.append(LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, now_s - 60, "long"))
    for n in range(250):
        uid = f"done-{n}"
        events.append(LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, old + n, uid, pods))
        events.append(LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, old + n + 30, uid))
    with db.begin() as conn:
        install(conn, make_config(POLICIES["sliding-1d-no-decay"]), now_s - 300 * DAY)
        workloads = [Workload("long", "c", "p", 1, 1, now_s - 21 * DAY)]
        workloads += [Workload(f"done-{n}", "c", "p", 1, 1, old) for n in range(250)]
        workload_repo.submit(conn, workloads)
        ingest_pipeline.ingest(conn, events, now_s)


def test_retention_deletes_a_backlog_in_committed_batches(
    db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    now_s = time.time()
    _ledger(db, now_s)
    monkeypatch.setattr(retention_repo, "BATCH_ROWS", 1000, raising=False)
    deletes: list[tuple[str, int]] = []
    commits: list[int] = []

    def seen(_conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith(("DELETE", "WITH")):
            deletes.append((statement, cursor.rowcount))

    event.listen(db, "after_cursor_execute", seen)
    event.listen(db, "commit", lambda _conn: commits.append(len(deletes)))
    try:
        with db.connect() as conn:
            deleted = apply_retention(conn, now_s, Retention())
            conn.commit()
    finally:
        event.remove(db, "after_cursor_execute", seen)
    with db.connect() as conn:
        left = conn.execute(
            text("SELECT kind, count(*) FROM ledger_events GROUP BY kind ORDER BY kind")
        ).all()
        purged = conn.execute(
            text("SELECT count(*) FROM workloads WHERE events_purged_at IS NOT NULL")
        ).scalar_one()
    assert (deleted["heartbeats"], deleted["events"], deleted["workloads_purged"]) == (
        2500,
        500,
        250,
    )
    assert [tuple(r) for r in left] == [("heartbeat", 1), ("started", 1)]
    assert purged == 250
    heartbeat_batches = [n for s, n in deletes if "'heartbeat'" in s and "newer" in s]
    assert heartbeat_batches == [1000, 1000, 500]
    assert max(n for _s, n in deletes) <= 1000
    # Committed batch by batch: a run that fails later keeps what it deleted.
    assert len(commits) >= 6
