"""The first of `write`'s round trips (`ingest_pipeline`): one pipelined read of everything a
batch needs (`_read_context`), made before it writes anything. First of all, in a batch with
heartbeats, the stale sweeper's lock `locks.SWEEP`, shared; then the workloads of its run events,
locked (`_RUN_WORKLOADS_SQL`); which of its other workloads do not exist, unless known to
(`_MISSING_WORKLOADS_SQL`, `KnownWorkloads`); its nodes; and for the workloads whose runs it
changes, their earlier run events and intervals, and the GPU types. The savepoint the COPY falls
back to is set in the same round trip. Rarer needs take one of their own after it: nodes named
only by earlier run events, the latest heartbeat of a workload with a stale close, and a node
capacity report's node as configured before its instant.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from itertools import compress
from typing import Any

import psycopg

from gpufair.domain.ledger import RUN_KINDS, EventKind, LedgerEvent, WorkloadRef, WorkloadState
from gpufair.domain.model import GpuType, Node
from gpufair.store import locks, node_history_repo, runs_repo
from gpufair.store.event_codec import text_array
from gpufair.store.ingest_batch import _EVENT, _KIND, _NODE, _PODS, _UID, Overlap, PreparedBatch
from gpufair.store.known_workloads import KnownWorkloads

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
# Set at the end of the read, where it costs no round trip; `_copy` (`ingest_writes`) rolls back
# to it when the COPY meets an id stored already, and the writes release it.
_SAVEPOINT = "gpufair_ingest_copy"


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
