"""What ran, kept in step with the ledger: allocation intervals and workload states derived from a
workload's run events (DESIGN §5), and a rollup dirty mark per pool whose usage changed.

Ingestion hands over, per affected workload, every run event it has: those stored before the
batch (read before the insert) and those the batch stored. Only intervals that come out different
are rewritten, so a stop that closes a run rewrites one row, not the workload's history.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import psycopg
from sqlalchemy import Connection, text

from gpufair.domain.ledger import (
    EventKind,
    LedgerEvent,
    WorkloadRef,
    WorkloadState,
    derive_runs,
    interval_rows,
    state_after,
)
from gpufair.domain.limits import MAX_COMPUTE_WEIGHT
from gpufair.domain.model import GpuType, Node
from gpufair.store.event_codec import pod_from_json, pod_json

# Every run event of the workloads (heartbeats carry nothing runs are made of), and their
# intervals. Written as a lookup per workload (OFFSET 0 keeps the planner from turning it back
# into a join) so that the per-workload index is used whatever the statistics say:
# `workload_uid = ANY(...)` on a table that had grown since it was last analyzed was planned as a
# scan of the whole table, in every batch.
RUN_EVENTS_SQL = (
    "SELECT e.event_id::text, e.workload_uid, e.kind, "
    "extract(epoch FROM e.occurred_at)::float8, e.payload->'pods' "
    "FROM unnest(%s::text[]) AS u(uid) CROSS JOIN LATERAL ("
    "SELECT * FROM ledger_events WHERE workload_uid = u.uid AND kind <> 'heartbeat' OFFSET 0) AS e"
)
INTERVALS_SQL = (
    "SELECT i.id, i.workload_uid, i.start_event_id::text, i.gpu_type, i.pool, i.gpus, i.cu, "
    "extract(epoch FROM i.started_at)::float8, extract(epoch FROM i.ended_at)::float8, "
    "i.queue, i.end_kind, i.pods "
    "FROM unnest(%s::text[]) AS u(uid) CROSS JOIN LATERAL ("
    "SELECT * FROM allocation_intervals WHERE workload_uid = u.uid OFFSET 0) AS i"
)


def _latest_beat(uid: str) -> str:
    """A LATERAL subquery: the latest heartbeat (`at`) of the workload whose uid is the column
    `uid`, read backwards along its events (one row however long it ran, not all its beats)."""
    return (
        "SELECT e.occurred_at AS at FROM ledger_events e "
        f"WHERE e.workload_uid = {uid} AND e.kind = 'heartbeat' "
        "ORDER BY e.occurred_at DESC LIMIT 1"
    )


# The latest heartbeat of each workload (the sign of life that voids earlier `stale` closes,
# `derive_runs`). Read only for workloads with a `stale` event, which few have: other
# derivations need no heartbeat.
LATEST_BEATS_SQL = (
    "SELECT u.uid, extract(epoch FROM b.at)::float8 "
    f"FROM unnest(%s::text[]) AS u(uid) CROSS JOIN LATERAL ({_latest_beat('u.uid')}) AS b"
)
_INTERVAL_BEAT = _latest_beat("i.workload_uid")  # of the interval `i`'s workload
NODES_SQL = "SELECT name, pool, gpu_type, gpu_count FROM nodes WHERE name = ANY(%s::text[])"
# A weight stored before the input limits is read within them (domain/stored_limits.py): a run's
# CU must be finite, or its whole batch could not be stored.
GPU_TYPES_SQL = (
    f"SELECT name, memory_gib, LEAST(compute_weight, {MAX_COMPUTE_WEIGHT}::float8) FROM gpu_types"
)

_DELETE_SQL = "DELETE FROM allocation_intervals WHERE id = ANY(%s::int8[])"
# Rows travel as one JSON array of arrays (field order of IntervalRecord after `id`): cheaper to
# encode than objects, and one statement whatever their number.
_INSERT_SQL = """
    INSERT INTO allocation_intervals
        (workload_uid, start_event_id, gpu_type, pool, gpus, cu,
         started_at, ended_at, queue, end_kind, pods)
    SELECT r->>0, (r->>1)::uuid, r->>2, r->>3, (r->>4)::float8, (r->>5)::float8,
           to_timestamp((r->>6)::float8), to_timestamp((r->>7)::float8), r->>8, r->>9, r->10
    FROM jsonb_array_elements(%s::jsonb) AS r
"""
# Insert only, whatever the pool's watermark: no row is locked, so an ingest never waits for a
# rollup, and a mark at or after the watermark costs the rollup nothing (it starts from the
# earlier of the two). Marking only before the watermark read at ingest time lost usage: a rollup
# that had not seen this ingest's runs moved the watermark past them (`rollup_repo.rollup_pool`).
_DIRTY_SQL = (
    "INSERT INTO rollup_dirty_marks (pool, dirty_from) VALUES (%(pool)s, to_timestamp(%(at)s))"
)


class IntervalRecord(NamedTuple):
    """An allocation interval as stored (a row of INTERVALS_SQL, `id` 0 until written)."""

    id: int
    workload_uid: str
    start_event_id: str
    gpu_type: str
    pool: str
    gpus: float
    cu: float
    started_at_s: float
    ended_at_s: float | None
    queue: str
    end_kind: str | None
    pods: list[dict[str, Any]]

    def same_content(self, other: IntervalRecord) -> bool:
        """All but the id. Times compare exactly: both are `extract(epoch ...)` of a microsecond."""
        return self[1:] == other[1:]

    def usage(self) -> tuple[str, float, float, float, float | None]:
        """What usage depends on (rounded as timestamptz keeps it)."""
        end = None if self.ended_at_s is None else round(self.ended_at_s, 6)
        return (self.pool, self.gpus, self.cu, round(self.started_at_s, 6), end)


def nodes_from_rows(rows: Iterable[tuple[Any, ...]]) -> dict[str, Node]:
    return {r[0]: Node(r[0], r[1], r[2], r[3], 0, 0) for r in rows}


def intervals_from_rows(rows: Iterable[tuple[Any, ...]]) -> list[IntervalRecord]:
    return [IntervalRecord(*r) for r in rows]


def run_events_from_rows(rows: Iterable[tuple[Any, ...]]) -> dict[str, list[LedgerEvent]]:
    by_uid: dict[str, list[LedgerEvent]] = defaultdict(list)
    for event_id, uid, kind, at, pods in rows:
        by_uid[uid].append(
            LedgerEvent(
                event_id,
                EventKind(kind),
                at,
                uid,
                tuple(pod_from_json(p) for p in pods or ()),
            )
        )
    return by_uid


@dataclass
class RunsChange:
    """The writes that bring intervals, states and rollup marks in line with the events."""

    delete_ids: list[int] = field(default_factory=list)
    insert: list[IntervalRecord] = field(default_factory=list)
    states: dict[str, WorkloadState] = field(default_factory=dict)
    dirty_from: dict[str, float] = field(default_factory=dict)  # pool -> epoch s


def plan_runs(
    workloads: Mapping[str, tuple[WorkloadRef, WorkloadState]],
    events: Mapping[str, Sequence[LedgerEvent]],
    current: Iterable[IntervalRecord],
    nodes: Mapping[str, Node],
    gpu_types: Mapping[str, GpuType],
    alive_at: Mapping[str, float] | None = None,
    cancelled: Collection[str] = (),
) -> RunsChange:
    """Derive the runs of each workload in `workloads` from all of its run `events` (and the
    instant of its latest heartbeat in `alive_at`, for a workload with a `stale` event), and
    compare with its `current` intervals: rows that stay as they are are not written again.
    `cancelled`: the workloads CancelWorkload cancelled (`state_after`)."""
    alive = alive_at or {}
    change = RunsChange()
    previous = [r for r in current if r.workload_uid in workloads]
    derived: list[IntervalRecord] = []
    for uid, (ref, state) in workloads.items():
        runs = derive_runs(events.get(uid, ()), alive.get(uid))
        for r in interval_rows(runs, nodes, gpu_types):
            pods = [pod_json(p) for p in r.pods]
            end_kind = r.end_kind.value if r.end_kind else None
            derived.append(
                IntervalRecord(
                    0,
                    uid,
                    r.start_event_id,
                    r.gpu_type,
                    ref.pool,
                    r.gpus,
                    r.cu,
                    r.started_at_s,
                    r.ended_at_s,
                    ref.queue,
                    end_kind,
                    pods,
                )
            )
        new_state = state_after(runs, state, uid in cancelled)
        if new_state is not state:
            change.states[uid] = new_state

    if not previous:  # new workloads, typically: everything is new
        change.insert = derived
        change.dirty_from = _dirty_from(previous, derived)
        return change
    unmatched: dict[tuple[str, str], list[IntervalRecord]] = defaultdict(list)
    for old in previous:
        unmatched[(old.start_event_id, old.gpu_type)].append(old)
    for new in derived:
        same = unmatched.get((new.start_event_id, new.gpu_type), [])
        kept = next((old for old in same if old.same_content(new)), None)
        if kept is None:
            change.insert.append(new)
        else:
            same.remove(kept)
    change.delete_ids = [old.id for rows in unmatched.values() for old in rows]
    change.dirty_from = _dirty_from(previous, derived)
    return change


def _dirty_from(
    previous: Sequence[IntervalRecord], current: Sequence[IntervalRecord]
) -> dict[str, float]:
    """The earliest instant per pool whose usage changed.

    An interval that only got an end (a stop of a running job) changes usage from that end on,
    not from its start: long runs do not force long re-rollups.
    """
    old = {(r.start_event_id, r.gpu_type): r.usage() for r in previous}
    new = {(r.start_event_id, r.gpu_type): r.usage() for r in current}
    earliest: dict[str, float] = {}
    for key in old.keys() | new.keys():
        before, after = old.get(key), new.get(key)
        if before == after:
            continue
        if before is not None and after is not None and before[:4] == after[:4]:
            changed_from = min(e if e is not None else math.inf for e in (before[4], after[4]))
        else:
            changed_from = min(x[3] for x in (before, after) if x is not None)
        pool = after[0] if after is not None else before[0]  # type: ignore[index]
        earliest[pool] = min(earliest.get(pool, math.inf), changed_from)
    return {pool: at_s for pool, at_s in earliest.items() if math.isfinite(at_s)}


def queue_writes(cur: psycopg.Cursor[Any], change: RunsChange) -> None:
    """Send the interval and dirty-mark writes of `change` (state changes travel with the
    workload update of the ingest, one row version per workload)."""
    if change.delete_ids:
        cur.execute(_DELETE_SQL, ("{" + ",".join(map(str, change.delete_ids)) + "}",))
    if change.insert:
        cur.execute(_INSERT_SQL, (json.dumps([r[1:] for r in change.insert]),))
    for pool, at_s in change.dirty_from.items():
        cur.execute(_DIRTY_SQL, {"pool": pool, "at": at_s})


class SilentRun(NamedTuple):
    workload_uid: str
    start_id: str  # the run's start event
    alive_at_s: float  # its last sign of life: the start, or the latest heartbeat after it


def silent_runs(conn: Connection, cutoff_s: float) -> list[SilentRun]:
    """Open runs whose last sign of life is before `cutoff_s` (the sweeper closes them)."""
    rows = conn.execute(
        text(
            f"""
            SELECT DISTINCT ON (i.start_event_id) i.workload_uid,
                   i.start_event_id::text AS start_id,
                   extract(epoch FROM GREATEST(i.started_at,
                       COALESCE(beat.at, i.started_at)))::float8 AS alive_at_s
            FROM allocation_intervals i
            LEFT JOIN LATERAL ({_INTERVAL_BEAT}) AS beat ON true
            WHERE i.ended_at IS NULL
              AND GREATEST(i.started_at, COALESCE(beat.at, i.started_at)) < to_timestamp(:cutoff)
            ORDER BY i.start_event_id
            """
        ),
        {"cutoff": cutoff_s},
    ).all()
    return [SilentRun(r.workload_uid, r.start_id, r.alive_at_s) for r in rows]


class RevivedRun(NamedTuple):
    workload_uid: str
    start_id: str  # the start event of the run closed as stale
    alive_at_s: float  # the workload's latest heartbeat, later than the close


def revived_runs(conn: Connection, since_s: float) -> list[RevivedRun]:
    """Runs closed as stale at or after `since_s` whose workload has a heartbeat later than the
    close and no start in between: the close is void (`derive_runs`), the run goes on.

    Read through the partial index of stale ends, whose rows are few (stale closes are rare, and
    a revived run's row is replaced by an open one): `since_s` bounds how far back it looks,
    so the read stays a short index scan and a probe or two per close, whatever the table."""
    rows = conn.execute(
        text(
            f"""
            SELECT DISTINCT ON (i.workload_uid) i.workload_uid,
                   i.start_event_id::text AS start_id,
                   extract(epoch FROM beat.at)::float8 AS alive_at_s
            FROM allocation_intervals i
            CROSS JOIN LATERAL ({_INTERVAL_BEAT}) AS beat
            WHERE i.end_kind = 'stale' AND i.ended_at >= to_timestamp(:since)
              AND beat.at > i.ended_at
              AND NOT EXISTS (
                  -- `kind <> 'heartbeat'` as well: the partial index of run events has it
                  SELECT 1 FROM ledger_events s
                  WHERE s.workload_uid = i.workload_uid AND s.kind <> 'heartbeat'
                    AND s.kind = 'started' AND s.occurred_at > i.ended_at
                    AND s.occurred_at <= beat.at)
            ORDER BY i.workload_uid, i.ended_at DESC
            """
        ),
        {"since": since_s},
    ).all()
    return [RevivedRun(r.workload_uid, r.start_id, r.alive_at_s) for r in rows]
