"""Closes runs whose heartbeats stopped: the batch system lost track, or its reports are lost.

A run open longer than `stale_after_s` past its workload's last sign of life (its start or its
latest heartbeat, read from the ledger: ingesting a heartbeat writes nothing but the event) is
closed at that last sign of life by a `stale` event. The event's id is derived from the run's
start event, so sweeping twice writes it once; a real stop that arrives later and is earlier than
the stale instant still wins, since runs are re-derived from all events.
"""

from __future__ import annotations

from sqlalchemy import Connection

from gpufair.domain.ledger import EventKind, LedgerEvent, stale_event_id
from gpufair.store import ingest_pipeline, runs_repo

DEFAULT_STALE_AFTER_S = 600.0


def sweep(conn: Connection, now_s: float, stale_after_s: float = DEFAULT_STALE_AFTER_S) -> int:
    """Close stale runs; returns how many."""
    rows = runs_repo.silent_runs(conn, now_s - stale_after_s)
    events = [
        LedgerEvent(stale_event_id(r.start_id), EventKind.STALE, r.alive_at_s, r.workload_uid)
        for r in rows
    ]
    if events:
        ingest_pipeline.ingest(conn, events, now_s, internal=True)
    return len(events)
