"""Event ingestion: validate, store idempotently, and rebuild what ran from the stored events.

One call handles one batch in the caller's transaction, with a constant number of round trips
whatever the batch size (rows travel as one JSON document each way), so a large batch costs
little more than its rows. The caller commits, and only then acknowledges.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select, text

from gpufair.domain.ledger import (
    END_KINDS,
    EventKind,
    EventPod,
    LedgerEvent,
    WorkloadRef,
    WorkloadState,
    derive_runs,
    event_problem,
    interval_rows,
    state_after,
    stop_before_start,
)
from gpufair.domain.model import GpuType, Node
from gpufair.store import capacity_repo
from gpufair.store import tables as t


class EventStatus(enum.StrEnum):
    STORED = "stored"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class EventOutcome:
    event_id: str
    status: EventStatus
    error: str = ""


def payload_json(event: LedgerEvent) -> str:
    """The canonical payload: what a replay of the same event_id must repeat exactly."""
    return json.dumps(
        {
            "kind": event.kind.value,
            "occurred_at_s": event.occurred_at_s,
            "workload_uid": event.workload_uid,
            "pods": [
                {"node": p.node, "gpu_indices": list(p.gpu_indices), "gpu_fraction": p.gpu_fraction}
                for p in event.pods
            ],
            "node": event.node,
            "gpu_count": event.gpu_count,
        },
        separators=(",", ":"),
        sort_keys=True,
    )


def _digest(payload: str) -> str:
    return hashlib.sha256(payload.encode()).hexdigest()


def _nodes(conn: Connection, names: Iterable[str]) -> dict[str, Node]:
    wanted = list(set(names))
    if not wanted:
        return {}
    rows = conn.execute(
        select(t.nodes.c.name, t.nodes.c.pool, t.nodes.c.gpu_type, t.nodes.c.gpu_count).where(
            t.nodes.c.name.in_(wanted)
        )
    )
    return {r.name: Node(r.name, r.pool, r.gpu_type, r.gpu_count, 0, 0) for r in rows}


def _gpu_types(conn: Connection) -> dict[str, GpuType]:
    rows = conn.execute(
        select(t.gpu_types.c.name, t.gpu_types.c.memory_gib, t.gpu_types.c.compute_weight)
    )
    return {r.name: GpuType(r.name, r.memory_gib, r.compute_weight) for r in rows}


def _workloads(
    conn: Connection, uids: Iterable[str]
) -> dict[str, tuple[WorkloadRef, WorkloadState]]:
    wanted = list(set(uids))
    if not wanted:
        return {}
    rows = conn.execute(
        text(
            "SELECT w.uid, w.queue, w.pool, w.state FROM workloads w "
            "JOIN queues q ON q.name = w.queue WHERE w.uid = ANY(:uids)"
        ),
        {"uids": wanted},
    )
    return {r.uid: (WorkloadRef(r.uid, r.queue, r.pool), WorkloadState(r.state)) for r in rows}


def _earliest_starts(conn: Connection, uids: Sequence[str]) -> dict[str, float]:
    if not uids:
        return {}
    rows = conn.execute(
        text(
            "SELECT workload_uid, extract(epoch FROM min(occurred_at))::float8 AS at "
            "FROM ledger_events WHERE kind = 'started' AND workload_uid = ANY(:uids) "
            "GROUP BY workload_uid"
        ),
        {"uids": list(uids)},
    )
    return {r.workload_uid: r.at for r in rows}


def ingest(
    conn: Connection,
    events: Sequence[LedgerEvent | tuple[str, str]],
    now_s: float,
    *,
    internal: bool = False,
) -> list[EventOutcome]:
    """Store a batch of events. Items that could not even be converted come as (event_id, error).
    Returns one outcome per item, in order. `internal` admits the kinds only gpufair writes
    (`stale`, from the sweeper)."""
    outcomes: list[EventOutcome | None] = [None] * len(events)
    candidates: list[tuple[int, LedgerEvent, str, str]] = []  # (index, event, payload, digest)
    first_seen: dict[str, str] = {}  # event_id -> digest, within this batch
    for i, item in enumerate(events):
        if isinstance(item, tuple):
            outcomes[i] = EventOutcome(item[0], EventStatus.REJECTED, item[1])
            continue
        payload = payload_json(item)
        digest = _digest(payload)
        seen = first_seen.get(item.event_id)
        if seen is not None:
            outcomes[i] = (
                EventOutcome(item.event_id, EventStatus.DUPLICATE)
                if seen == digest
                else EventOutcome(
                    item.event_id, EventStatus.REJECTED, "event_id reused with a different payload"
                )
            )
            continue
        first_seen[item.event_id] = digest
        candidates.append((i, item, payload, digest))

    workloads = _workloads(conn, (e.workload_uid for _, e, _, _ in candidates if e.workload_uid))
    node_names = [p.node for _, e, _, _ in candidates for p in e.pods]
    node_names += [e.node for _, e, _, _ in candidates if e.node]
    nodes = _nodes(conn, node_names)
    valid: list[tuple[int, LedgerEvent, str, str]] = []
    for i, event, payload, digest in candidates:
        ref = workloads.get(event.workload_uid)
        problem = (
            None
            if internal and event.kind is EventKind.STALE and ref is not None
            else event_problem(event, now_s=now_s, workload=ref[0] if ref else None, nodes=nodes)
        )
        if problem:
            outcomes[i] = EventOutcome(event.event_id, EventStatus.REJECTED, problem)
        else:
            valid.append((i, event, payload, digest))

    # A stop earlier than every start of its workload (stored or in this batch) cannot pair.
    stop_uids = sorted({e.workload_uid for _, e, _, _ in valid if e.kind in END_KINDS})
    earliest = _earliest_starts(conn, stop_uids)
    for _, e, _, _ in valid:
        if e.kind is EventKind.STARTED:
            earliest[e.workload_uid] = min(
                earliest.get(e.workload_uid, e.occurred_at_s), e.occurred_at_s
            )
    keep: list[tuple[int, LedgerEvent, str, str]] = []
    for i, event, payload, digest in valid:
        problem = stop_before_start(event, earliest.get(event.workload_uid))
        if problem:
            outcomes[i] = EventOutcome(event.event_id, EventStatus.REJECTED, problem)
        else:
            keep.append((i, event, payload, digest))

    stored = _insert(conn, keep)
    _classify_conflicts(conn, keep, stored, outcomes)
    stored_events = [e for _, e, _, _ in keep if e.event_id in stored]
    _apply_stored(conn, stored_events, {uid: ref for uid, ref in workloads.items()}, now_s)
    return [o for o in outcomes if o is not None]


def _insert(conn: Connection, rows: Sequence[tuple[int, LedgerEvent, str, str]]) -> set[str]:
    if not rows:
        return set()
    doc = json.dumps(
        [
            {
                "id": e.event_id,
                "uid": e.workload_uid or None,
                "kind": e.kind.value,
                "at": e.occurred_at_s,
                "payload": payload,
                "digest": digest,
            }
            for _, e, payload, digest in rows
        ]
    )
    result = conn.execute(
        text(
            """
            INSERT INTO ledger_events
                (event_id, workload_uid, kind, occurred_at, payload, payload_digest)
            SELECT r.id::uuid, r.uid, r.kind, to_timestamp(r.at), r.payload::jsonb, r.digest
            FROM jsonb_to_recordset(CAST(:doc AS jsonb))
                 AS r(id text, uid text, kind text, at float8, payload text, digest text)
            ON CONFLICT (event_id) DO NOTHING
            RETURNING event_id::text
            """
        ),
        {"doc": doc},
    )
    return {r[0] for r in result}


def _classify_conflicts(
    conn: Connection,
    rows: Sequence[tuple[int, LedgerEvent, str, str]],
    stored: set[str],
    outcomes: list[EventOutcome | None],
) -> None:
    conflicting = [e.event_id for _, e, _, _ in rows if e.event_id not in stored]
    known: dict[str, str] = {}
    if conflicting:
        known = dict(
            conn.execute(
                text(
                    "SELECT event_id::text, payload_digest FROM ledger_events "
                    "WHERE event_id = ANY(CAST(:ids AS uuid[]))"
                ),
                {"ids": conflicting},
            ).all()
        )
    for i, event, _, digest in rows:
        if event.event_id in stored:
            outcomes[i] = EventOutcome(event.event_id, EventStatus.STORED)
        elif known.get(event.event_id) == digest:
            outcomes[i] = EventOutcome(event.event_id, EventStatus.DUPLICATE)
        else:
            outcomes[i] = EventOutcome(
                event.event_id, EventStatus.REJECTED, "event_id reused with a different payload"
            )


def _apply_stored(
    conn: Connection,
    stored: Sequence[LedgerEvent],
    workloads: dict[str, tuple[WorkloadRef, WorkloadState]],
    now_s: float,
) -> None:
    """Bring heartbeats, runs, workload states and capacity up to date with newly stored events."""
    alive: dict[str, float] = {}
    rebuild: set[str] = set()
    node_events: list[LedgerEvent] = []
    for e in stored:
        if e.kind is EventKind.NODE_CAPACITY:
            node_events.append(e)
            continue
        if e.kind in (EventKind.HEARTBEAT, EventKind.STARTED):
            alive[e.workload_uid] = max(alive.get(e.workload_uid, 0.0), e.occurred_at_s)
        if e.kind is not EventKind.HEARTBEAT:
            rebuild.add(e.workload_uid)
    if alive:
        conn.execute(
            text(
                """
                UPDATE workloads w SET last_heartbeat_at =
                    GREATEST(w.last_heartbeat_at, to_timestamp(r.at))
                FROM jsonb_to_recordset(CAST(:doc AS jsonb)) AS r(uid text, at float8)
                WHERE w.uid = r.uid
                """
            ),
            {"doc": json.dumps([{"uid": u, "at": at} for u, at in alive.items()])},
        )
    if rebuild:
        rebuild_runs(conn, sorted(rebuild), {u: workloads[u] for u in rebuild if u in workloads})
    if node_events:
        _apply_node_capacity(conn, node_events, now_s)


def load_run_events(conn: Connection, uids: Sequence[str]) -> dict[str, list[LedgerEvent]]:
    rows = conn.execute(
        text(
            "SELECT event_id::text AS event_id, workload_uid, kind, "
            "extract(epoch FROM occurred_at)::float8 AS at, payload "
            "FROM ledger_events WHERE workload_uid = ANY(:uids) AND kind <> 'heartbeat'"
        ),
        {"uids": list(uids)},
    )
    by_uid: dict[str, list[LedgerEvent]] = defaultdict(list)
    for r in rows:
        pods = tuple(
            EventPod(p["node"], tuple(p["gpu_indices"]), p["gpu_fraction"])
            for p in r.payload.get("pods", ())
        )
        by_uid[r.workload_uid].append(
            LedgerEvent(r.event_id, EventKind(r.kind), r.at, r.workload_uid, pods)
        )
    return by_uid


def rebuild_runs(
    conn: Connection, uids: Sequence[str], workloads: dict[str, tuple[WorkloadRef, WorkloadState]]
) -> None:
    """Replace the allocation intervals and states of `uids` with those their events imply."""
    events = load_run_events(conn, uids)
    node_names = {p.node for evs in events.values() for e in evs for p in e.pods}
    nodes = _nodes(conn, node_names)
    gpu_types = _gpu_types(conn)
    interval_docs: list[dict[str, Any]] = []
    state_docs: list[dict[str, Any]] = []
    for uid in uids:
        if uid not in workloads:
            continue
        ref, state = workloads[uid]
        runs = derive_runs(events.get(uid, ()))
        for row in interval_rows(runs, nodes, gpu_types):
            interval_docs.append(
                {
                    "uid": uid,
                    "start_id": row.start_event_id,
                    "queue": ref.queue,
                    "pool": ref.pool,
                    "gpu_type": row.gpu_type,
                    "gpus": row.gpus,
                    "cu": row.cu,
                    "started": row.started_at_s,
                    "ended": row.ended_at_s,
                    "end_kind": row.end_kind.value if row.end_kind else None,
                    "pods": [
                        {
                            "node": p.node,
                            "gpu_indices": list(p.gpu_indices),
                            "gpu_fraction": p.gpu_fraction,
                        }
                        for p in row.pods
                    ],
                }
            )
        new_state = state_after(runs, state)
        if new_state is not state:
            state_docs.append({"uid": uid, "state": new_state.value})
    previous = conn.execute(
        text(
            "DELETE FROM allocation_intervals WHERE workload_uid = ANY(:uids) "
            "RETURNING pool, start_event_id::text, gpu_type, gpus, cu, "
            "extract(epoch FROM started_at)::float8, extract(epoch FROM ended_at)::float8"
        ),
        {"uids": list(uids)},
    ).all()
    _mark_dirty(conn, previous, interval_docs)
    if interval_docs:
        conn.execute(
            text(
                """
                INSERT INTO allocation_intervals
                    (workload_uid, start_event_id, queue, pool, gpu_type, gpus, cu,
                     started_at, ended_at, end_kind, pods)
                SELECT r.uid, r.start_id::uuid, r.queue, r.pool, r.gpu_type, r.gpus, r.cu,
                       to_timestamp(r.started), to_timestamp(r.ended), r.end_kind, r.pods
                FROM jsonb_to_recordset(CAST(:doc AS jsonb)) AS r(
                    uid text, start_id text, queue text, pool text, gpu_type text, gpus float8,
                    cu float8, started float8, ended float8, end_kind text, pods jsonb)
                """
            ),
            {"doc": json.dumps(interval_docs)},
        )
    if state_docs:
        conn.execute(
            text(
                """
                UPDATE workloads w SET state = r.state, state_changed_at = now()
                FROM jsonb_to_recordset(CAST(:doc AS jsonb)) AS r(uid text, state text)
                WHERE w.uid = r.uid
                """
            ),
            {"doc": json.dumps(state_docs)},
        )


def _mark_dirty(
    conn: Connection, previous: Sequence[Any], current: Sequence[dict[str, Any]]
) -> None:
    """Move each pool's rollup watermark back to the earliest instant whose usage changed.

    An interval that only got an end (a stop of a running job) changes usage from that end on,
    not from its start: long runs do not force long re-rollups.
    """

    def at(t: float | None) -> float | None:
        return None if t is None else round(t, 6)  # timestamptz keeps microseconds

    old = {(r[1], r[2]): (r[0], r[3], r[4], at(r[5]), at(r[6])) for r in previous}
    new = {
        (d["start_id"], d["gpu_type"]): (
            d["pool"],
            d["gpus"],
            d["cu"],
            at(d["started"]),
            at(d["ended"]),
        )
        for d in current
    }
    earliest: dict[str, float] = {}
    for key in old.keys() | new.keys():
        before, after = old.get(key), new.get(key)
        if before == after:
            continue
        if before is not None and after is not None and before[:4] == after[:4]:
            changed_from = min(e if e is not None else math.inf for e in (before[4], after[4]))
        else:
            changed_from = min(x[3] for x in (before, after) if x is not None and x[3] is not None)
        pool = after[0] if after is not None else before[0]  # type: ignore[index]
        earliest[pool] = min(earliest.get(pool, math.inf), changed_from)
    for pool, at_s in earliest.items():
        if math.isfinite(at_s):
            conn.execute(
                text(
                    "UPDATE rollup_watermarks SET dirty_from = "
                    "LEAST(COALESCE(dirty_from, 'infinity'::timestamptz), to_timestamp(:at)) "
                    "WHERE pool = :pool AND rolled_up_to > to_timestamp(:at)"
                ),
                {"pool": pool, "at": at_s},
            )


def _apply_node_capacity(conn: Connection, events: Sequence[LedgerEvent], now_s: float) -> None:
    for e in sorted(events, key=lambda ev: ev.occurred_at_s):
        conn.execute(
            text(
                """
                INSERT INTO node_capacity (node, gpu_count, changed_at)
                VALUES (:node, :gpus, to_timestamp(:at))
                ON CONFLICT (node) DO UPDATE SET gpu_count = EXCLUDED.gpu_count,
                    changed_at = EXCLUDED.changed_at
                WHERE node_capacity.changed_at <= EXCLUDED.changed_at
                """
            ),
            {"node": e.node, "gpus": e.gpu_count, "at": e.occurred_at_s},
        )
        capacity_repo.record_if_changed(conn, e.occurred_at_s, "node_capacity")
