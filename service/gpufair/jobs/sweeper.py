"""Closes runs whose heartbeats stopped: the batch system lost track, or its reports are lost.

A run open longer than `stale_after_s` past its workload's last sign of life (its start or its
latest heartbeat, read from the ledger: ingesting a heartbeat writes nothing but the event) is
closed at that last sign of life by a `stale` event. The event's id is derived from the run's
start event, so sweeping twice writes it once; a real stop that arrives later and is earlier than
the stale instant still wins, since runs are re-derived from all events.
"""

from __future__ import annotations

from sqlalchemy import Connection, text

from gpufair.domain.ledger import EventKind, LedgerEvent, stale_event_id
from gpufair.store import ingest_pipeline

DEFAULT_STALE_AFTER_S = 600.0


def sweep(conn: Connection, now_s: float, stale_after_s: float = DEFAULT_STALE_AFTER_S) -> int:
    """Close stale runs; returns how many."""
    rows = conn.execute(
        text(
            """
            SELECT DISTINCT ON (i.start_event_id) i.workload_uid,
                   i.start_event_id::text AS start_id,
                   extract(epoch FROM GREATEST(i.started_at,
                       COALESCE(beat.at, i.started_at)))::float8 AS alive_at
            FROM allocation_intervals i
            LEFT JOIN LATERAL (
                -- The latest only: read backwards along the workload's events, not all of a
                -- long run's heartbeats.
                SELECT e.occurred_at AS at FROM ledger_events e
                WHERE e.workload_uid = i.workload_uid AND e.kind = 'heartbeat'
                ORDER BY e.occurred_at DESC LIMIT 1
            ) AS beat ON true
            WHERE i.ended_at IS NULL
              AND GREATEST(i.started_at, COALESCE(beat.at, i.started_at)) < to_timestamp(:cutoff)
            ORDER BY i.start_event_id
            """
        ),
        {"cutoff": now_s - stale_after_s},
    ).all()
    events = [
        LedgerEvent(stale_event_id(r.start_id), EventKind.STALE, r.alive_at, r.workload_uid)
        for r in rows
    ]
    if events:
        ingest_pipeline.ingest(conn, events, now_s, internal=True)
    return len(events)
