"""Closes runs whose heartbeats stopped: the batch system lost track, or its reports are lost.

A run open longer than `stale_after_s` past its workload's last sign of life (its start or its
latest heartbeat, read from the ledger: ingesting a heartbeat writes nothing but the event) is
closed at that last sign of life by a `stale` event. The event's id is derived from the run's
start event, so sweeping twice writes it once; a real stop that arrives later and is earlier than
the stale instant still wins, since runs are re-derived from all events.

A heartbeat acknowledged to its batch system before a sweep must count in it. Storing one writes
nothing the sweeper would wait for, so the sweep's transaction starts with `locks.SWEEP`,
exclusive, which every ingest of heartbeats holds shared from its first statement to its commit:
the read of the last signs of life waits for the batches in flight and sees their heartbeats, and
a batch that comes during the sweep waits for its commit (it is then stored, and acknowledged
after the runs were closed: a heartbeat later than a stale close does not reopen the run). Call
`sweep` in a transaction that holds no lock yet (`locks.SWEEP` gives the order); it is short
(one read, one ingest of the stale events), which bounds how long heartbeats can wait for it.
"""

from __future__ import annotations

from sqlalchemy import Connection

from gpufair.domain.ledger import EventKind, LedgerEvent, stale_event_id
from gpufair.store import ingest_pipeline, locks, runs_repo

DEFAULT_STALE_AFTER_S = 600.0


def sweep(conn: Connection, now_s: float, stale_after_s: float = DEFAULT_STALE_AFTER_S) -> int:
    """Close stale runs; returns how many."""
    locks.xact_lock(conn, locks.SWEEP)  # first, before the read (see the module's docstring)
    rows = runs_repo.silent_runs(conn, now_s - stale_after_s)
    events = [
        LedgerEvent(stale_event_id(r.start_id), EventKind.STALE, r.alive_at_s, r.workload_uid)
        for r in rows
    ]
    if events:
        ingest_pipeline.ingest(conn, events, now_s, internal=True)
    return len(events)
