"""The rest of `write` (`ingest_pipeline`), after the read and the checks: the COPY of the new
events (`_copy`; `_insert_careful` with ON CONFLICT when one is stored already), the plan of
what they change (`_plan`: runs and workload states, node capacity reports, the runs that may
add GPU holders; `_plan_group` for several batches in one transaction), made while the database
takes the COPY, and its sending: every write in one pipelined round trip that can end with the
commit, or two when the overlap check must look at new holders first (`_send_writes`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import is_
from typing import Any, cast

import psycopg
from sqlalchemy import Connection

from gpufair.domain.ledger import EventKind, LedgerEvent, derive_runs, state_after
from gpufair.store import bind_overlaps, capacity_repo, node_history_repo, runs_repo
from gpufair.store.event_codec import COPY_EVENTS_SQL, copy_stream, stored_epoch_s, text_array
from gpufair.store.ingest_batch import (
    _BY_ID,
    _EVENT,
    _KIND,
    _POSITION,
    _READ_BACK,
    _ROW,
    REUSED,
    Candidate,
    EventStatus,
    Outcomes,
    Overlap,
)
from gpufair.store.ingest_context import _SAVEPOINT, _Context

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


@dataclass(slots=True)
class _Plan:
    """The writes that follow from the stored events."""

    change: runs_repo.RunsChange
    node_events: list[LedgerEvent]
    # Runs it opens that may add GPU holders, which the overlap check must look at: none when
    # every run it opens lies within its workload's own bound decision.
    new_holders: list[runs_repo.IntervalRecord]


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
