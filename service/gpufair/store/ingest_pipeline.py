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
"""

from __future__ import annotations

import enum
import hashlib
import json
import struct
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from itertools import compress, repeat
from operator import attrgetter, is_, itemgetter
from typing import Any, NamedTuple, cast

import psycopg
from sqlalchemy import Connection

from gpufair.domain.ledger import (
    CANONICAL_UUID,
    MAX_AGE_S,
    MAX_FUTURE_SKEW_S,
    RUN_KINDS,
    EventKind,
    LedgerEvent,
    WorkloadRef,
    WorkloadState,
    canonical_event_id,
    context_problem,
    derive_runs,
    event_problem,
    sign_of_life_problem,
    state_after,
    static_problem,
    static_problem_of_uuid,
)
from gpufair.domain.limits import MAX_UID_LEN
from gpufair.domain.model import GpuType, Node
from gpufair.store import bind_overlaps, capacity_repo, locks, node_history_repo, runs_repo
from gpufair.store.event_codec import (
    COPY_EVENTS_SQL,
    canonical_ids_bytes,
    copy_row,
    copy_stream,
    id_bytes,
    payload_json,
    plain_heartbeat,
    stored_epoch_s,
    text_array,
)
from gpufair.store.known_workloads import KnownWorkloads


class EventStatus(enum.StrEnum):
    STORED = "stored"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class EventOutcome:
    event_id: str
    status: EventStatus
    error: str = ""


REUSED = "event_id reused with a different payload"
PURGED = "the workload's events were removed by retention: its runs can no longer change"


class Outcomes:
    """The outcome of each item of a batch, as a status per item and the reasons of the rejected
    ones: an object per event would cost more (to make and to garbage-collect) than it says."""

    __slots__ = ("errors", "event_ids", "statuses")

    def __init__(self, event_ids: list[str]) -> None:
        self.event_ids = event_ids
        self.statuses: list[EventStatus | None] = [None] * len(event_ids)
        self.errors: dict[int, str] = {}

    def reject(self, index: int, error: str) -> None:
        self.statuses[index] = EventStatus.REJECTED
        self.errors[index] = error

    def final(self) -> list[EventStatus]:
        """The statuses, once every item has one."""
        if None in self.statuses:
            raise RuntimeError("an item of the batch was left without an outcome")
        return cast("list[EventStatus]", self.statuses)

    def as_list(self) -> list[EventOutcome]:
        return [
            EventOutcome(event_id, status, self.errors.get(i, ""))
            for i, (event_id, status) in enumerate(zip(self.event_ids, self.final(), strict=True))
        ]


class Candidate(NamedTuple):
    """An event that passed the checks `prepare` can make."""

    position: int  # its place in the batch
    event: LedgerEvent  # as received
    event_id: str  # canonical id
    payload: bytes
    digest: str
    copy_row: bytes  # its row of the COPY
    # Run events: the event as it will read back from the database (PostgreSQL's id text and
    # microsecond instant), so that runs come out the same whichever batch an event arrived in.
    read_back: LedgerEvent | None


# Made from a tuple by the C constructor: the hot path pays no Python call per event for the names.
_candidate = partial(tuple.__new__, Candidate)


class Overlap:
    """Work of the caller's that needs no database, done while `write` waits for it. Each hook
    is called at most once, in the order below, from the thread that called `write`; what was
    not called (a batch with nothing to store, a replay), the caller does after `write` returns.
    They must not touch the connection. This base does nothing; a stream overrides them."""

    def reading(self) -> None:
        """While the database reads what the batch needs."""

    def copying(self) -> None:
        """While the database takes the batch's COPY."""

    def copied(self) -> None:
        """The COPY is done (a mark in time, for a caller that measures its waits)."""

    def writing(self) -> None:
        """While the database applies the batch's writes."""

    def committing(self) -> None:
        """While the database commits (called right after `writing` when the commit travels
        with the writes; later, on its own, when it waits for the overlap check's answer)."""


@dataclass(slots=True)
class PreparedBatch:
    now_s: float
    internal: bool
    outcomes: Outcomes
    candidates: list[Candidate]
    # What `Preparation` saw of the candidates as it went, so that the steps after it need not
    # walk thousands of heartbeats again: the workloads of the plain heartbeats among them (no
    # pods, node or GPU count), and the other candidates, in order. `others` None: not known,
    # every candidate counts as other (and `plain_uids` is empty).
    plain_uids: set[str] = field(default_factory=set)
    others: list[Candidate] | None = None

    def not_plain(self) -> list[Candidate]:
        """The candidates that are not among the plain heartbeats of `plain_uids`, in order."""
        return self.candidates if self.others is None else self.others


# The workloads whose runs the batch derives, locked. Runs are derived from what the batch reads,
# and two transactions deriving one workload's runs at once would each miss the other's events:
# the lock makes the second wait, then read what the first committed. Every workload the batch
# may update is locked here, in one order, so that two batches cannot deadlock on them.
_RUN_WORKLOADS_SQL = (
    "SELECT w.uid, w.queue, w.pool, w.state, w.events_purged_at IS NOT NULL, "
    "CASE WHEN w.state = 'bound' THEN w.binding->'pods' END, w.cancelled_at IS NOT NULL "
    "FROM workloads w "
    "JOIN queues q ON q.name = w.queue WHERE w.uid = ANY(%s::text[]) "
    "ORDER BY w.uid FOR NO KEY UPDATE OF w"
)
# Of the batch's other workloads (those with heartbeats only, not known to exist already), the
# ones that do not exist: a heartbeat needs nothing more of its workload and writes nothing but
# itself, so they are looked up without a lock, one index probe each, and a batch of thousands of
# heartbeats reads back nothing when all is well.
_MISSING_WORKLOADS_SQL = (
    "SELECT u.uid FROM unnest(%s::text[]) AS u(uid) LEFT JOIN LATERAL ("
    "SELECT true AS found FROM workloads w WHERE w.uid = u.uid OFFSET 0) AS w ON true "
    "WHERE w.found IS NULL"
)
_KNOWN_SQL = (
    "SELECT event_id::text, payload_digest FROM ledger_events WHERE event_id = ANY(%s::uuid[])"
)
_INSERT_SQL = """
    INSERT INTO ledger_events (event_id, workload_uid, kind, occurred_at, payload, payload_digest)
    SELECT r.id::uuid, r.uid, r.kind, to_timestamp(r.at), r.payload::jsonb, r.digest
    FROM jsonb_to_recordset(%s::jsonb)
         AS r(id text, uid text, kind text, at float8, payload text, digest text)
    ON CONFLICT (event_id) DO NOTHING
    RETURNING event_id::text
"""
_STATE_UPDATE_SQL = """
    UPDATE workloads w SET state = r.state, state_changed_at = now()
    FROM unnest(%s::text[], %s::text[]) AS r(uid, state)
    WHERE w.uid = r.uid
"""
_SAVEPOINT = "gpufair_ingest_copy"
_BY_ID = attrgetter("event_id")
_FIRST = itemgetter(0)
_EVENT, _KIND, _UID = attrgetter("event"), attrgetter("kind"), attrgetter("workload_uid")
_NODE, _PODS = attrgetter("node"), attrgetter("pods")
_DIGEST = attrgetter("digest")
_ID16 = struct.Struct("16s")  # each id's bytes in `canonical_ids_bytes`
_POSITION, _ROW, _READ_BACK = (
    attrgetter("position"),
    attrgetter("copy_row"),
    attrgetter("read_back"),
)


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


class Preparation:
    """`prepare`, a part of the batch at a time, so that a stream can spread the work on its
    next message over the waits of the one in the database."""

    def __init__(self, now_s: float, *, internal: bool = False) -> None:
        self.now_s = now_s
        self._internal = internal
        self._outcomes = Outcomes([])
        self._candidates: list[Candidate] = []
        self._plain_uids: set[str] = set()
        self._others: list[Candidate] = []
        self._first_seen: dict[str, str] = {}  # canonical event_id -> digest, within the batch
        # The ids of the parts whose ids were all canonical and new to the batch, and where
        # their candidates begin: the names and digests of those candidates are owed to
        # `_first_seen` until a part that could repeat one of them comes (`_settle`).
        self._fresh_ids: list[set[str]] = []
        self._owed_from = 0

    def add(self, events: Iterable[LedgerEvent | tuple[str, str]]) -> None:
        """Prepare the next items of the batch, in order.

        A plain heartbeat (no pods, node or GPU count; an instant within the accepted window; a
        short printable uid; a canonical id), nearly every event of a working cluster, passes
        every check of `static_problem_of_uuid` by those conditions alone: its payload, digest
        and COPY row come from one call (`plain_heartbeat`) and its checks are not made again.
        Its candidate is the one the general path would make. The ids are checked for the
        canonical form, and turned into bytes, for all the items at once
        (`canonical_ids_bytes`); one at a time only when one of them is not. A part of canonical
        ids that repeats none of its own or of the batch's so far (`_fresh`) holds no duplicate:
        its plain heartbeats are not looked up among the ids seen, only owed to them
        (`_settle`)."""
        items = events if type(events) is list else list(events)
        outcomes, candidates, first_seen = self._outcomes, self._candidates, self._first_seen
        plain_uid, other = self._plain_uids.add, self._others.append
        event_ids, statuses = outcomes.event_ids, outcomes.statuses
        now_s, internal = self.now_s, self._internal
        stale, run_kinds, heartbeat = EventKind.STALE, RUN_KINDS, EventKind.HEARTBEAT
        sha256, canonical = hashlib.sha256, CANONICAL_UUID.match
        # `static_problem_of_uuid`'s window for the instant; a NaN fails both comparisons.
        earliest, latest = now_s - MAX_AGE_S, now_s + MAX_FUTURE_SKEW_S
        max_uid = MAX_UID_LEN
        ids = list(map(_FIRST, items))
        all_bytes = canonical_ids_bytes(ids)
        start = len(event_ids)
        event_ids += ids
        statuses += repeat(None, len(ids))
        # A part of canonical ids, none repeated in it or given before, has no duplicate: its
        # plain heartbeats are not looked up in `_first_seen`, only owed to it (`_settle`).
        fresh = all_bytes is not None and self._fresh(ids)
        new = tuple.__new__  # as `_candidate`, without the partial's call
        if not fresh:
            self._settle()
        # Each id's bytes when all are canonical; else none (b"", without end).
        raws = map(_FIRST, _ID16.iter_unpack(all_bytes)) if all_bytes is not None else repeat(b"")
        for i, item, raw in zip(range(start, start + len(items)), items, raws, strict=False):
            if type(item) is not LedgerEvent:
                outcomes.reject(i, item[1])
                continue
            # Unpacked from a plain tuple's copy: a named tuple is unpacked by an iterator.
            event_id, kind, at, uid, pods, node, count = item[:]
            if all_bytes is not None:  # every id canonical
                key: str | None = event_id
            else:
                # `canonical_event_id`: the canonical form recognised here, the rest goes there.
                key = event_id if canonical(event_id) else canonical_event_id(event_id)
            name = key or event_id  # what duplicates are found by
            plain = (
                kind is heartbeat
                and key is not None
                and not pods
                and not node
                and type(count) is int
                and count == 0
                and type(at) is float
                and at > 0.0
                and earliest <= at <= latest
                and len(uid) <= max_uid
                and uid.isprintable()
            )
            if plain:
                payload, digest, row = plain_heartbeat(raw or id_bytes(name), at, uid)
                if fresh:
                    candidates.append(new(Candidate, (i, item, key, payload, digest, row, None)))
                    plain_uid(uid)
                    continue
            else:
                payload = payload_json(item).encode()
                digest = sha256(payload).hexdigest()  # `payload_digest`, without a call per event
            seen = first_seen.get(name)
            if seen is not None:
                if seen == digest:
                    statuses[i] = EventStatus.DUPLICATE
                else:
                    outcomes.reject(i, REUSED)
                continue
            first_seen[name] = digest
            if plain:
                candidates.append(_candidate((i, item, key, payload, digest, row, None)))
                plain_uid(uid)
                continue
            # The sweeper's own events skip the checks meant for reports (see `_validate`);
            # still, only a UUID can be stored.
            if key is None:
                outcomes.reject(i, static_problem(item, now_s=now_s) or "")
                continue
            if not (internal and kind is stale):
                problem = static_problem_of_uuid(item, now_s=now_s)
                if problem:
                    outcomes.reject(i, problem)
                    continue
            read_back = (
                LedgerEvent(key, kind, stored_epoch_s(at), uid, pods) if kind in run_kinds else None
            )
            row = copy_row(key, uid, kind, at, payload, digest)
            candidate = _candidate((i, item, key, payload, digest, row, read_back))
            candidates.append(candidate)
            other(candidate)

    def _fresh(self, ids: list[str]) -> bool:
        """Whether `ids` (canonical) hold no id twice and none of an earlier part's; if so they
        are kept, for the parts that follow."""
        part = set(ids)
        if len(part) != len(ids) or not part.isdisjoint(self._first_seen):
            return False
        if not all(map(part.isdisjoint, self._fresh_ids)):
            return False
        self._fresh_ids.append(part)
        return True

    def _settle(self) -> None:
        """Write the owed names and digests into `_first_seen`, before a part that may repeat
        one of them: the candidates of the fresh parts, each under its canonical id (those
        not plain heartbeats are there already, with the same digest)."""
        candidates = self._candidates
        if self._fresh_ids:
            owed = candidates[self._owed_from :]
            self._first_seen.update(zip(map(_BY_ID, owed), map(_DIGEST, owed), strict=True))
            self._fresh_ids.clear()
        self._owed_from = len(candidates)

    def batch(self) -> PreparedBatch:
        return PreparedBatch(
            self.now_s,
            self._internal,
            self._outcomes,
            self._candidates,
            self._plain_uids,
            self._others,
        )


def _driver(conn: Connection) -> psycopg.Connection[Any]:
    """The psycopg connection under `conn`, inside the transaction `conn` will commit."""
    if not conn.in_transaction():
        conn.begin()
    return cast("psycopg.Connection[Any]", conn.connection.driver_connection)


@dataclass(slots=True)
class _Context:
    """What the batch needs to know from the database, read before it writes anything."""

    workloads: dict[str, tuple[WorkloadRef, WorkloadState]]  # those with run events, locked
    purged: set[str]  # of those, the ones whose events retention removed
    cancelled: set[str]  # of those, the ones CancelWorkload cancelled (`state_after`)
    bindings: dict[str, Any]  # of those, the pods of the ones bound by a Schedule cycle
    missing: set[str]  # of the batch's other workloads, those that do not exist
    nodes: dict[str, Node]
    run_events: dict[str, list[LedgerEvent]]  # of the batch's workloads, stored before it
    intervals: list[runs_repo.IntervalRecord]  # of the same workloads
    gpu_types: dict[str, GpuType]
    rederive: set[str]  # workloads whose runs are derived again without an event of the batch
    # Of the workloads whose runs are derived, those with a stored `stale` event, and the instant
    # of the latest stored heartbeat of each of them that has one (`derive_runs`).
    staled: set[str]
    alive_at: dict[str, float]
    # Of the batch's node capacity reports whose node has a config history, by (node, instant):
    # its declared GPUs just before that instant, None where it was not configured then.
    declared_then: dict[tuple[str, float], int | None] = field(default_factory=dict)


@dataclass(slots=True)
class _Plan:
    """The writes that follow from the stored events."""

    change: runs_repo.RunsChange
    node_events: list[LedgerEvent]
    # Runs it opens that may add GPU holders, which the overlap check must look at: none when
    # every run it opens lies within its workload's own bound decision.
    new_holders: list[runs_repo.IntervalRecord]


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


def _plan_group(kept: Sequence[Sequence[Candidate]], ctx: _Context) -> _Plan:
    """`_plan` of the batches' stored events together, with the state of each workload that
    several of them change taken through their runs batch after batch, as separate
    transactions would (a workload's state depends on the state it had: `state_after`)."""
    plan = _plan([c for keep in kept for c in keep], ctx)
    by_batch: dict[str, list[tuple[int, list[LedgerEvent]]]] = defaultdict(list)
    for index, keep in enumerate(kept):
        mine: dict[str, list[LedgerEvent]] = defaultdict(list)
        for c in keep:
            if c.read_back is not None:
                mine[c.event.workload_uid].append(c.read_back)
        for uid, events in mine.items():
            by_batch[uid].append((index, events))
    states = plan.change.states
    for uid, parts in by_batch.items():
        if len(parts) < 2 or uid not in ctx.workloads:
            continue
        before = state = ctx.workloads[uid][1]
        events = list(ctx.run_events.get(uid, []))
        for index, part in parts:
            events += part
            # Each batch's state with the heartbeats of the batches up to it, as if alone.
            alive = _alive_at(ctx, kept[: index + 1]).get(uid) if uid in ctx.staled else None
            state = state_after(derive_runs(events, alive), state, uid in ctx.cancelled)
        if state is before:
            states.pop(uid, None)
        else:
            states[uid] = state
    return plan


def _read_context(
    pg: psycopg.Connection[Any],
    batches: Sequence[PreparedBatch],
    hooks: Overlap,
    known: KnownWorkloads,
    rederive: Collection[str] = (),
) -> _Context:
    # A batch of heartbeats has thousands of events and nothing to find in them but their
    # workloads: those of its plain heartbeats come gathered by `Preparation`, and only the
    # other events are looked at here, by C loops (`map`, `compress`).
    events = [e for b in batches for e in map(_EVENT, b.not_plain())]
    kinds = set(map(_KIND, events))
    uids = set(map(_UID, events))
    for b in batches:
        if b.plain_uids:
            kinds.add(EventKind.HEARTBEAT)
            uids |= b.plain_uids
    beats = EventKind.HEARTBEAT in kinds
    uids.discard("")
    uids.update(rederive)
    run_uids = set(map(_UID, compress(events, map(RUN_KINDS.__contains__, map(_KIND, events)))))
    run_uids.discard("")
    run_uids.update(rederive)
    node_names = set(map(_NODE, events))
    node_names.discard("")
    for e in filter(_PODS, events):
        node_names.update(p.node for p in e.pods)
    others = known.unknown(uids - run_uids)
    with (
        pg.cursor() as w,
        pg.cursor() as other,
        pg.cursor() as n,
        pg.cursor() as runs,
        pg.cursor() as intervals,
        pg.cursor() as types,
    ):
        with pg.pipeline():
            if beats:
                # The transaction's first lock (`locks.SWEEP`): the sweeper waits for this batch
                # to commit before it reads the last signs of life, or this batch waits for it.
                pg.execute(locks.XACT_LOCK_SHARED_SQL, {"key": locks.SWEEP})
            # Lookups per workload can look costly to a planner whose statistics are behind
            # the table, and JIT-compiling them took longer than running them. The statements
            # are prepared (psycopg does after a few runs) and shaped as lookups per key, so
            # their generic plan is the right one whatever the arrays hold: planning them anew
            # for each message cost PostgreSQL about half a millisecond a message. Both settings
            # end with the transaction.
            pg.execute("SET LOCAL jit = off")
            pg.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            w.execute(_RUN_WORKLOADS_SQL, (text_array(sorted(run_uids)),))
            if others:
                other.execute(_MISSING_WORKLOADS_SQL, (text_array(others),))
            n.execute(runs_repo.NODES_SQL, (text_array(node_names),))
            if run_uids:
                runs.execute(runs_repo.RUN_EVENTS_SQL, (text_array(run_uids),))
                intervals.execute(runs_repo.INTERVALS_SQL, (text_array(run_uids),))
                types.execute(runs_repo.GPU_TYPES_SQL)
            # Set here, where it costs no round trip, for the COPY that may need to fall back.
            pg.execute(f"SAVEPOINT {_SAVEPOINT}")
            hooks.reading()
        rows = w.fetchall()
        ctx = _Context(
            {r[0]: (WorkloadRef(r[0], r[1], r[2]), WorkloadState(r[3])) for r in rows},
            {r[0] for r in rows if r[4]},
            {r[0] for r in rows if r[6]},
            {r[0]: r[5] for r in rows if r[5] is not None},
            {r[0] for r in other.fetchall()} if others else set(),
            runs_repo.nodes_from_rows(n.fetchall()),
            {},
            [],
            {},
            set(rederive),
            set(),
            {},
        )
        known.add(ctx.workloads.keys() | (others - ctx.missing))
        if run_uids:
            rows = runs.fetchall()
            ctx.run_events = runs_repo.run_events_from_rows(rows)
            ctx.staled = {r[1] for r in rows if r[2] == "stale"}
            ctx.intervals = runs_repo.intervals_from_rows(intervals.fetchall())
            ctx.gpu_types = {r[0]: GpuType(r[0], r[1], r[2]) for r in types.fetchall()}
    # Runs are re-derived with their pods: earlier starts may name nodes this batch does not.
    missing = {p.node for evs in ctx.run_events.values() for e in evs for p in e.pods}
    missing -= ctx.nodes.keys()
    if missing:
        rows = pg.execute(runs_repo.NODES_SQL, (text_array(missing),)).fetchall()
        ctx.nodes.update(runs_repo.nodes_from_rows(rows))
    # A stale close is void if a later heartbeat came (`derive_runs`): the workloads that have
    # one need their latest heartbeat, read in a round trip of its own, as rare as they are.
    if ctx.staled:
        rows = pg.execute(runs_repo.LATEST_BEATS_SQL, (text_array(ctx.staled),)).fetchall()
        ctx.alive_at = {r[0]: r[1] for r in rows}
    # A report is judged against its node as configured just before its instant, in time or
    # late alike (`node_history_repo`): looked up in the nodes' config history, for every report
    # of the batch, in a round trip of its own (a node that has no history is as it is now).
    # A workload stream has none: its events are not walked one by one in Python for it.
    if EventKind.NODE_CAPACITY in kinds:
        reports = [e for e in events if e.kind is EventKind.NODE_CAPACITY]
        rows = pg.execute(
            node_history_repo.CONFIG_BEFORE_SQL,
            (text_array(e.node for e in reports), [e.occurred_at_s for e in reports]),
        ).fetchall()
        ctx.declared_then = {(r[0], r[1]): r[2] for r in rows}
    return ctx


def _validate(batch: PreparedBatch, ctx: _Context) -> list[Candidate]:
    """The checks that need the workloads and nodes; rejects what fails them, returns the rest,
    in order. None depends on the order events arrive in: a stop earlier than every start
    stored so far is stored like any other, and pairs with an earlier start whenever that
    arrives (DESIGN §5, out-of-order arrival).

    A heartbeat with no pods of a workload that exists and has no run event in the batch
    passes, nearly every event of a working cluster: when every plain heartbeat's workload
    (`batch.plain_uids`, looked at as a set) is such a one, only the other events are judged
    one by one; else all of them, as a message that starts and ends the runs it beats for
    needs anyway."""
    plain, candidates, workloads = batch.plain_uids, batch.candidates, ctx.workloads
    if "" in plain or not plain.isdisjoint(workloads) or not plain.isdisjoint(ctx.missing):
        return _validate_each(batch, ctx, candidates)
    check = batch.not_plain()
    passed = _validate_each(batch, ctx, check)
    if len(passed) == len(check):
        return candidates
    refused = set(map(_POSITION, check)) - set(map(_POSITION, passed))
    return [c for c in candidates if c.position not in refused]


def _validate_each(
    batch: PreparedBatch, ctx: _Context, candidates: Sequence[Candidate]
) -> list[Candidate]:
    """`_validate` of `candidates`, one by one."""
    outcomes, workloads, missing, nodes = batch.outcomes, ctx.workloads, ctx.missing, ctx.nodes
    then = ctx.declared_then  # empty but for node capacity reports
    # The enum's members read once, not once per event (see domain/ledger.py).
    heartbeat, stale = EventKind.HEARTBEAT, EventKind.STALE
    valid: list[Candidate] = []
    for c in candidates:
        event = c.event
        kind, uid = event.kind, event.workload_uid
        if kind is heartbeat and uid not in workloads:
            # What `sign_of_life_problem` accepts, nearly every heartbeat, without the call.
            if uid and uid not in missing and not event.pods:
                valid.append(c)
                continue
            problem = sign_of_life_problem(event, known=uid not in missing)
            if problem:
                outcomes.reject(c.position, problem)
            else:
                valid.append(c)
            continue
        ref = workloads.get(uid)
        if batch.internal and kind is stale:
            problem = (
                None
                if ref is not None
                else event_problem(event, now_s=batch.now_s, workload=None, nodes=nodes)
            )
        else:
            problem = context_problem(event, workload=ref[0] if ref else None, nodes=nodes)
            if then and kind is EventKind.NODE_CAPACITY:
                key = (event.node, event.occurred_at_s)
                if key in then:  # its node as configured just before its instant, not as now
                    problem = context_problem(
                        event, workload=None, nodes=_node_then(event.node, then[key])
                    )
        if not problem and kind in RUN_KINDS and uid in ctx.purged:
            problem = PURGED  # a heartbeat changes no run: it is stored, as it would be alone
        if problem:
            outcomes.reject(c.position, problem)
        else:
            valid.append(c)
    return valid


def _node_then(name: str, declared: int | None) -> dict[str, Node]:
    """The nodes `context_problem` judges a report of `name` by, as configured just before its
    instant (`declared` GPUs; None: not configured then): its answers, in time or late."""
    if declared is None:
        return {}
    return {name: Node(name, "", "", declared, 0, 0)}  # only its GPU count is read


def _copy(
    pg: psycopg.Connection[Any],
    events: Sequence[Candidate],
    ctx: _Context,
    outcomes: Outcomes,
    hooks: Overlap,
    others: Sequence[Candidate] | None = None,
) -> _Plan:
    """COPY `events` in, in the savepoint `_read_context` set; if one of them is stored already
    (a replay, or another transaction storing it meanwhile), roll back to the savepoint and
    insert them with ON CONFLICT instead. `others`: see `_plan`.

    Rows go in in event id order. Two transactions inserting the same new ids wait for each
    other's at the first id they share; in opposite orders each could hold an id the other
    waits for (measured: a deadlock on the first try with 3,000 shared ids)."""
    if not events or pg.info.encoding != "utf-8":
        return _plan(_insert_careful(pg, events, outcomes), ctx)
    try:
        with pg.cursor() as cur, cur.copy(COPY_EVENTS_SQL) as copy:
            copy.write(copy_stream(map(_ROW, sorted(events, key=_BY_ID))))
            # The server is still working through the rows: plan the writes meanwhile, as if
            # all of them get stored, and let the caller do its own work.
            plan = _plan(events, ctx, others)
            hooks.copying()
    except psycopg.errors.UniqueViolation:
        pg.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
        return _plan(_insert_careful(pg, events, outcomes), ctx)
    hooks.copied()
    statuses, stored = outcomes.statuses, EventStatus.STORED
    if len(events) == len(statuses):  # every item of the batch, as a stream's usually are
        statuses[:] = repeat(stored, len(statuses))
    else:
        for position in map(_POSITION, events):
            statuses[position] = stored
    return plan


def _insert_careful(
    pg: psycopg.Connection[Any], fresh: Sequence[Candidate], outcomes: Outcomes
) -> list[Candidate]:
    """Insert what is not stored yet, and tell replays from reused ids; returns those stored."""
    if not fresh:
        return []
    doc = [
        {
            "id": key,
            "uid": e.workload_uid or None,
            "kind": e.kind.value,
            "at": e.occurred_at_s,
            "payload": payload.decode(),
            "digest": digest,
        }
        for _, e, key, payload, digest, _, _ in sorted(fresh, key=_BY_ID)  # as in `_copy`
    ]
    with pg.cursor() as cur:
        stored = {r[0] for r in cur.execute(_INSERT_SQL, (json.dumps(doc),))}
        lost = [c.event_id for c in fresh if c.event_id not in stored]
        known: dict[str, str] = (
            dict(cur.execute(_KNOWN_SQL, ("{" + ",".join(lost) + "}",)).fetchall()) if lost else {}
        )
    kept: list[Candidate] = []
    for c in fresh:
        i, _, key, _, digest, _, _ = c
        if key in stored:
            outcomes.statuses[i] = EventStatus.STORED
            kept.append(c)
        elif known.get(key) == digest:
            outcomes.statuses[i] = EventStatus.DUPLICATE
        else:
            outcomes.reject(i, REUSED)
    return kept


def _plan(
    stored: Sequence[Candidate], ctx: _Context, others: Sequence[Candidate] | None = None
) -> _Plan:
    """Runs and workload states as the newly `stored` events make them. A heartbeat changes
    neither: it is only kept, as a sign of life the sweeper reads back. `others`, if given: the
    candidates of `stored` that are not plain heartbeats (`PreparedBatch.not_plain`), among
    which every run and node event is: only they are looked at."""
    new_run_events: dict[str, list[LedgerEvent]] = defaultdict(list)
    # The run events and node events picked by C loops: nearly all are heartbeats.
    scan = stored if others is None else others
    for c in filter(_READ_BACK, scan):
        new_run_events[c.event.workload_uid].append(cast("LedgerEvent", c.read_back))
    kept = list(map(_EVENT, scan))
    kinds = map(_KIND, kept)
    node_events = list(compress(kept, map(is_, kinds, repeat(EventKind.NODE_CAPACITY))))

    change = runs_repo.RunsChange()
    uids = sorted(new_run_events.keys() | (ctx.rederive - ctx.purged))
    rebuild = {u: ctx.workloads[u] for u in uids if u in ctx.workloads}
    if rebuild:
        events = {u: ctx.run_events.get(u, []) + new_run_events.get(u, []) for u in rebuild}
        alive = _alive_at(ctx, [stored]) if ctx.staled else None
        change = runs_repo.plan_runs(
            rebuild, events, ctx.intervals, ctx.nodes, ctx.gpu_types, alive, ctx.cancelled
        )
    opened = [r for r in change.insert if r.ended_at_s is None]
    if opened and bind_overlaps.runs_within_bindings(
        ((r.workload_uid, r.pods) for r in opened), ctx.bindings
    ):
        opened = []
    return _Plan(change, node_events, opened)


def _alive_at(ctx: _Context, parts: Iterable[Sequence[Candidate]]) -> dict[str, float]:
    """The latest heartbeat of each workload of `ctx.staled`, stored or among `parts` (as it
    reads back): a heartbeat of the batch voids an earlier stale close as a stored one does."""
    alive = dict(ctx.alive_at)
    heartbeat, staled = EventKind.HEARTBEAT, ctx.staled
    for part in parts:
        for c in part:
            e = c.event
            if e.kind is heartbeat and e.workload_uid in staled:
                at = stored_epoch_s(e.occurred_at_s)
                alive[e.workload_uid] = max(alive.get(e.workload_uid, at), at)
    return alive


def _send_writes(pg: psycopg.Connection[Any], plan: _Plan, hooks: Overlap, *, commit: bool) -> None:
    """All writes of the plan in one round trip, and the commit if asked. In a pipeline each
    statement goes out as it is issued, so the server is at work while the caller's `writing`
    and `committing` run.

    A plan that opens runs adds GPU holders (unless they lie within their workloads' own bound
    decisions, `bind_overlaps.runs_within_bindings`): the check of `bind_overlaps` goes out with
    the writes, and the withdrawals it finds (bound decisions on the GPUs the runs took) and the
    commit follow in a second round trip, during which `committing` runs: the commit (its flush
    of the batch's WAL) is the longer wait of the two, and the thread would sit through it idle."""
    opened = plan.new_holders
    if opened:
        pools = {r.pool for r in opened}
        nodes = {p["node"] for r in opened for p in r.pods}
        with pg.cursor() as cur, pg.cursor() as lock, pg.cursor() as bound:
            with pg.pipeline():
                _queue_writes(cur, plan)
                bind_overlaps.send_check(lock, bound, pools, nodes, cycle=False)
                hooks.writing()
            bind_overlaps.withdraw(cur, pools, bound.fetchall())
            with pg.pipeline():
                if commit:
                    cur.execute("COMMIT")
                hooks.committing()
        return
    with pg.cursor() as cur, pg.pipeline():
        _queue_writes(cur, plan)
        if commit:
            cur.execute("COMMIT")
        hooks.writing()
        hooks.committing()


def _queue_writes(cur: psycopg.Cursor[Any], plan: _Plan) -> None:
    states = plan.change.states
    cur.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
    if states:
        uids = sorted(states)
        cur.execute(
            _STATE_UPDATE_SQL, (text_array(uids), text_array(states[u].value for u in uids))
        )
    runs_repo.queue_writes(cur, plan.change)


def _apply_node_capacity(conn: Connection, events: Iterable[LedgerEvent]) -> None:
    for e in sorted(events, key=lambda ev: ev.occurred_at_s):
        late = node_history_repo.record_report(conn, e.node, e.gpu_count, e.occurred_at_s)
        capacity_repo.record_if_changed(
            conn, e.occurred_at_s, "node_capacity", node=e.node, late=late
        )
