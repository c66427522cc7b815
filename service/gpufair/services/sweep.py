"""Closes runs whose heartbeats stopped (the batch system lost track, or its reports are lost),
and reopens those whose heartbeats came back.

A run open longer than `stale_after_s` past its workload's last sign of life (its start or its
latest heartbeat, read from the ledger: ingesting a heartbeat writes nothing but the event) is
closed at that last sign of life by a `stale` event. The event's id is derived from the run's
start event and that instant (`ledger.stale_event_id`), so sweeping the same silence twice
writes it once. A real stop that arrives later still wins, since runs are re-derived from all
events: one earlier than the stale instant ends the run first, and a later one voids the close
(`ledger.derive_runs`), the run ending at the stop as if it had come before the sweep.

A batch system cut off for longer than `stale_after_s` (a bridge restart, a network partition)
comes back still running what it ran: its heartbeats later than the close void it
(`ledger.derive_runs`), and the run goes on, its usage through the silence counted. Ingesting a
heartbeat derives no runs (that path writes only the event), so the sweep reopens such runs: it
finds the stale closes of the last `revive_within_s` with a later heartbeat
(`runs_repo.revived_runs`) and derives their workloads' runs again as an ingest would
(`ingest_pipeline.write`'s `rederive`: the workload rows locked, intervals and states written,
the rollup marked dirty, and bound decisions on the reopened run's GPUs withdrawn). Until that
sweep, one period at most after the first heartbeat back, the run still shows closed and its
GPUs free. A run whose latest heartbeat is itself silent again is not reopened but closed anew
at that heartbeat, in the same write (no GPU holder comes and goes). Closes older than the window
are left to the next run event of the workload, whose ingest applies the same rule.

A heartbeat acknowledged to its batch system before a sweep must count in it. Storing one writes
nothing the sweeper would wait for, so the sweep's transaction starts with `locks.SWEEP`,
exclusive, which every ingest of heartbeats holds shared from its first statement to its commit:
the read of the last signs of life waits for the batches in flight and sees their heartbeats, and
a batch that comes during the sweep waits for its commit (it is then stored, and acknowledged
after the runs were closed; the next sweep reopens them). Call `sweep` in a transaction that
holds no lock yet (`locks.SWEEP` gives the order); it is short (two reads, one ingest of the
stale events with the reopened workloads), which bounds how long heartbeats can wait for it.
"""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import Connection

from gpufair.domain.ledger import EventKind, LedgerEvent, stale_event_id
from gpufair.store import ingest_pipeline, locks, runs_repo

DEFAULT_STALE_AFTER_S = 600.0
# How far back the sweep looks for stale closes to reopen: a cut-off of up to a day (a bridge
# down overnight) is healed by the sweeper; a workload back after longer is reopened by its next
# run event. The look is an index scan over the closes of the window (few: stale closes are
# rare), so a longer window costs little; a day keeps it small even after a mass close.
DEFAULT_REVIVE_WITHIN_S = 86400.0


class Swept(NamedTuple):
    """What a sweep did: runs it closed (`stale` events written) and workloads whose stale-closed
    run a later heartbeat reopened."""

    closed: int
    reopened: int


def sweep(
    conn: Connection,
    now_s: float,
    stale_after_s: float = DEFAULT_STALE_AFTER_S,
    revive_within_s: float = DEFAULT_REVIVE_WITHIN_S,
) -> Swept:
    """Close stale runs and reopen those a later heartbeat revived."""
    locks.xact_lock(conn, locks.SWEEP)  # first, before the reads (see the module's docstring)
    cutoff_s = now_s - stale_after_s
    revived = runs_repo.revived_runs(conn, now_s - revive_within_s)
    closes = [
        (r.workload_uid, r.start_id, r.alive_at_s) for r in runs_repo.silent_runs(conn, cutoff_s)
    ]
    # Revived, but silent again since: closed anew at the later heartbeat.
    closes += [
        (r.workload_uid, r.start_id, r.alive_at_s) for r in revived if r.alive_at_s < cutoff_s
    ]
    events = [
        LedgerEvent(stale_event_id(start_id, at_s), EventKind.STALE, at_s, uid)
        for uid, start_id, at_s in closes
    ]
    reopen = sorted({r.workload_uid for r in revived if r.alive_at_s >= cutoff_s})
    if events or reopen:
        ingest_pipeline.ingest(conn, events, now_s, internal=True, rederive=reopen)
    return Swept(len(events), len(reopen))
