"""Event ingestion: validate, store idempotently, and bring what ran up to date with the events.

A batch goes in two steps. `prepare` needs no database: conversion results, canonical payloads,
digests, duplicates within the batch and every check that depends only on the event and the
clock. `write` does the rest in the caller's transaction, in a constant number of round trips
whatever the batch size: one pipelined read of everything the batch needs (its workloads, locked;
nodes; the earlier run events and intervals of the workloads whose runs it changes; first of all,
in a batch with heartbeats, the stale sweeper's lock `locks.SWEEP`, shared), one COPY of
the new events, and one pipelined set of writes, which can end with the commit. Only then does
the caller acknowledge. While the database works on each of the three (and on the commit, when
it waits for an overlap check), the caller can do work of its own (`Overlap`): a stream prepares
its next message, and reports the one before.

This module is the entry: `prepare`, `write`, `write_group` (several batches in one transaction)
and `ingest` (both steps at once), and the types their callers use. The steps live beside it, in
the order a batch meets them:

- `ingest_batch`: the batch (`PreparedBatch`, a `Candidate` per event that may be stored), each
  item's outcome (`Outcomes`) and the hooks of the caller's own work (`Overlap`);
- `ingest_prepare`: `Preparation`, `prepare`'s work, a part of a message at a time;
- `ingest_context`: the pipelined read (`_read_context`) and what it returns (`_Context`);
- `ingest_validate`: the checks against what was read (`_validate`);
- `ingest_writes`: the COPY (`_copy`), the plan of runs and states that follows from the stored
  events (`_plan`, `_plan_group`) and the pipelined writes (`_send_writes`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

import psycopg
from sqlalchemy import Connection

from gpufair.domain.ledger import EventKind, LedgerEvent
from gpufair.store import capacity_repo
from gpufair.store.event_codec import COPY_EVENTS_SQL, copy_stream
from gpufair.store.ingest_batch import (
    _BY_ID,
    REUSED,
    Candidate,
    EventOutcome,
    EventStatus,
    Outcomes,
    Overlap,
    PreparedBatch,
)
from gpufair.store.ingest_context import _read_context
from gpufair.store.ingest_prepare import Preparation
from gpufair.store.ingest_validate import PURGED, _validate
from gpufair.store.ingest_writes import (
    _apply_node_capacity,
    _copy,
    _insert_careful,
    _plan,
    _plan_group,
    _send_writes,
)
from gpufair.store.known_workloads import KnownWorkloads

__all__ = [
    "PURGED",
    "REUSED",
    "Candidate",
    "EventOutcome",
    "EventStatus",
    "Outcomes",
    "Overlap",
    "Preparation",
    "PreparedBatch",
    "groupable",
    "ingest",
    "prepare",
    "prepared_at_once",
    "write",
    "write_group",
]


def ingest(
    conn: Connection,
    events: Sequence[LedgerEvent | tuple[str, str]],
    now_s: float,
    *,
    internal: bool = False,
    rederive: Collection[str] = (),
) -> list[EventOutcome]:
    """Store a batch of events. Items that could not even be converted come as (event_id, error).
    Returns one outcome per item, in order. `internal` admits the kinds only gpufair writes
    (`stale`, from the sweeper); `rederive`: see `write`."""
    batch = prepare(events, now_s, internal=internal)
    return write(conn, batch, rederive=rederive).as_list()


def prepare(
    events: Sequence[LedgerEvent | tuple[str, str]], now_s: float, *, internal: bool = False
) -> PreparedBatch:
    """Everything about a batch that needs no database."""
    preparation = Preparation(now_s, internal=internal)
    preparation.add(events)
    return preparation.batch()


def _driver(conn: Connection) -> psycopg.Connection[Any]:
    """The psycopg connection under `conn`, inside the transaction `conn` will commit."""
    if not conn.in_transaction():
        conn.begin()
    return cast("psycopg.Connection[Any]", conn.connection.driver_connection)


def write(
    conn: Connection,
    batch: PreparedBatch,
    *,
    expect_duplicates: bool = False,
    overlap: Overlap | None = None,
    commit: bool = False,
    known: KnownWorkloads | None = None,
    rederive: Collection[str] = (),
) -> Outcomes:
    """Store a prepared batch in `conn`'s transaction; one outcome per item, in order.

    New events go in by COPY, which a single id already stored makes fail; the batch is then
    inserted again with ON CONFLICT. A caller that expects replays (a client resending what it
    is not sure landed) says so with `expect_duplicates` and the COPY is not tried.

    With `commit`, the transaction is committed with the last writes, in the same round trip (a
    batch that changes node capacity leaves the commit to the caller, who commits anyway: a
    commit with no transaction open does nothing). The outcomes hold only once it is committed.

    `known` holds workloads seen to exist: heartbeats of those are not looked up, and those
    looked up are added to it.

    `rederive` names workloads whose runs and states are derived again from their stored events
    as if the batch held one of theirs (locked, written and checked for overlaps as theirs would
    be): the sweeper's way to reopen runs whose stale close a later heartbeat voided.
    """
    outcomes = batch.outcomes
    if not batch.candidates and not rederive:
        return outcomes
    hooks = overlap or Overlap()
    pg = _driver(conn)
    with prepared_at_once(pg):
        ctx = _read_context(
            pg, [batch], hooks, known if known is not None else KnownWorkloads(0), rederive
        )
        keep = _validate(batch, ctx)
        # When every candidate passed, the run and node events are among `not_plain` (`_plan`).
        others = batch.not_plain() if keep is batch.candidates else None
        if expect_duplicates:
            plan = _plan(_insert_careful(pg, keep, outcomes), ctx)
        else:
            plan = _copy(pg, keep, ctx, outcomes, hooks, others)
        if plan.node_events:
            # Before the overlap check's lock (`locks.BIND_CHECK` is taken last) and before the
            # nodes' capacity rows are written: the recount then sees every other change
            # committed.
            capacity_repo.lock_changes(conn)
        _send_writes(pg, plan, hooks, commit=commit and not plan.node_events)
    if plan.node_events:
        _apply_node_capacity(conn, plan.node_events)
    return outcomes


@contextmanager
def prepared_at_once(pg: psycopg.Connection[Any]) -> Iterator[None]:
    """Every statement `pg` runs in the block is prepared on its first run, not its sixth.

    psycopg prepares a statement once the connection has run it `prepare_threshold` times (5),
    and forgets them all on a ROLLBACK; until then PostgreSQL parses and plans each anew. A
    batch sends the same dozen statements every time, with fixed text (values travel as
    parameters): on a connection's first five messages of 2,000 steady events their parse and
    bind took 1.2-1.3 ms of PostgreSQL's CPU a message, against 0.25-0.3 ms prepared, about 8 %
    of the database's work on those messages; and a stream's first messages are its slowest
    already (a new connection's first look-ups). A statement a connection runs only once or
    twice (the rarer paths) is now prepared too, within psycopg's bound per connection. The
    connection's own setting is put back afterwards: it goes back to the pool, to callers whose
    statements need not have fixed text."""
    threshold = pg.prepare_threshold
    pg.prepare_threshold = 0
    try:
        yield
    finally:
        pg.prepare_threshold = threshold


def groupable(batch: PreparedBatch) -> bool:
    """Whether `batch` may share a transaction with others (`write_group`): a report with
    something to store and no node capacity change (those take their own transaction, which
    records the capacity's new version)."""
    node_capacity = EventKind.NODE_CAPACITY
    return (
        not batch.internal
        and bool(batch.candidates)
        and all(c.event.kind is not node_capacity for c in batch.candidates)
    )


def write_group(
    conn: Connection, batches: Sequence[PreparedBatch], *, known: KnownWorkloads
) -> bool:
    """Store several `groupable` batches, of which no two share an event id, in one transaction
    on `conn` and commit it: one read of what they all need, one COPY, one set of writes, one
    commit. Returns False when nothing was committed and the caller must write each batch on its
    own (a COPY that meets an id stored already, or any error of the database with the
    connection still usable): every outcome is then as `prepare` left it. A lost connection
    raises, as for `write`: whether the commit landed is not known.

    Each batch's outcomes are those it would get written alone, one after the other in the
    order given: a batch is validated with the run events of the batches before it as if they
    were stored (a stop may pair with a start of an earlier batch), and a workload's state goes
    through each batch's runs in turn. Runs are derived once, from all the events, so a run
    started in one batch and stopped in a later one is written once, closed, instead of open and
    then replaced."""
    saved = [(list(b.outcomes.statuses), dict(b.outcomes.errors)) for b in batches]
    pg = _driver(conn)
    if pg.info.encoding != "utf-8":
        conn.rollback()
        return False
    try:
        with prepared_at_once(pg):
            return _write_group(pg, batches, known)
    except psycopg.Error:
        if pg.closed or pg.broken:
            raise
        conn.rollback()
        for b, (statuses, errors) in zip(batches, saved, strict=True):
            b.outcomes.statuses[:] = statuses
            b.outcomes.errors.clear()
            b.outcomes.errors.update(errors)
        return False


def _write_group(
    pg: psycopg.Connection[Any], batches: Sequence[PreparedBatch], known: KnownWorkloads
) -> bool:
    hooks = Overlap()
    ctx = _read_context(pg, batches, hooks, known)
    kept = [_validate(b, ctx) for b in batches]
    every = [c for keep in kept for c in keep]
    if every:
        # An id stored already fails the COPY (UniqueViolation): `write_group` rolls back.
        with pg.cursor() as cur, cur.copy(COPY_EVENTS_SQL) as copy:
            copy.write(copy_stream(c.copy_row for c in sorted(every, key=_BY_ID)))
            plan = _plan_group(kept, ctx)
    else:
        plan = _plan([], ctx)
    stored = EventStatus.STORED
    for b, keep in zip(batches, kept, strict=True):
        statuses = b.outcomes.statuses
        for c in keep:
            statuses[c.position] = stored
    _send_writes(pg, plan, hooks, commit=True)
    return True
