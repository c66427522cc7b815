"""The last step of a transaction that adds GPU holders: withdraw bound decisions that now share a
GPU with a run (the rule is `domain/overlap.py`).

Two writers add holders without waiting for each other: a `Schedule` cycle binds (under its
pool's lock), and an ingest opens runs from `started` events (it does not wait for the pool lock,
and the batch system may start work on pods of its own choosing). Each, after its writes and
just before its commit, takes `locks.BIND_CHECK` (a cycle that binds exclusive, ingests shared:
ingests add only runs, which are never withdrawn, so they need not exclude each other), reads in
a new statement the holders of the nodes it added holders to, and withdraws what overlaps.
Whichever of the two commits second therefore sees the other's holders: no overlap survives in
committed state, whatever the interleaving. (An overlap it could make involves one of its own
holders, hence one of those nodes.)

An ingest whose new runs all lie within their own workloads' bound decisions (read under the
workloads' row locks, so no cycle can release or rebind them until it commits) skips the check:
those runs take no GPU share beyond their decision's, which every cycle since it was made has
counted as held (`runs_within_bindings`). Work that gpufair scheduled starts this way.

Withdrawal skips rows locked by another transaction (`SKIP LOCKED`): a bound row locked elsewhere
is being changed (its own start, a cancellation, a release) by a transaction that checks again
before it commits, or by a cycle that releases it. So nothing waits for a row lock while holding
the check lock, and the lock cannot take part in a deadlock.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import psycopg

from gpufair.domain.model import PodBinding
from gpufair.domain.overlap import Holding, Withdrawal, holds_within, withdrawals
from gpufair.store import locks

log = logging.getLogger(__name__)

# The holders on the nodes the transaction adds holders to: an overlap it could have made
# involves one of its own holders, so the rest of the pool need not travel. Bound decisions are
# read first (few, by the pool-and-state index); the runs on their nodes only if there are any
# (an ingest of starts usually finds none, and never reads the pool's thousands of runs). The
# node filter runs in the server: jsonb containment on each pod list.
_ON_NODES = """
    EXISTS (SELECT 1 FROM unnest(%(nodes)s::text[]) AS u(name)
            WHERE {pods} @> jsonb_build_array(jsonb_build_object('node', u.name)))
"""
BOUND_SQL = (
    "SELECT uid, COALESCE((binding->>'cycle_id')::int8, 0), binding->'pods' FROM workloads "
    "WHERE pool = ANY(%(pools)s::text[]) AND state = 'bound' AND "
    + _ON_NODES.format(pods="binding->'pods'")
)
RUNS_SQL = (
    "SELECT workload_uid, pods FROM allocation_intervals "
    "WHERE pool = ANY(%(pools)s::text[]) AND ended_at IS NULL AND " + _ON_NODES.format(pods="pods")
)
_WITHDRAW_SQL = """
    UPDATE workloads w SET state = 'pending', binding = NULL, bound_at = NULL,
        bind_expires_at = NULL, state_changed_at = now()
    WHERE w.uid IN (
        SELECT uid FROM workloads WHERE uid = ANY(%(uids)s::text[]) AND state = 'bound'
        FOR NO KEY UPDATE SKIP LOCKED)
    RETURNING w.uid
"""


def send_check(
    lock: psycopg.Cursor[Any],
    bound: psycopg.Cursor[Any],
    pools: Collection[str],
    nodes: Collection[str],
    *,
    cycle: bool,
) -> None:
    """Take the check lock and read the bound decisions on `nodes` of `pools` (two statements:
    the read must begin after the lock is held, to see what committed while it waited). In a
    pipeline, both go out with the caller's other writes; the rows are for `withdraw`."""
    sql = locks.XACT_LOCK_SQL if cycle else locks.XACT_LOCK_SHARED_SQL
    lock.execute(sql, {"key": locks.BIND_CHECK})
    bound.execute(BOUND_SQL, {"pools": sorted(pools), "nodes": sorted(nodes)})


def pod_bindings(pods: Iterable[dict[str, Any]] | None) -> tuple[PodBinding, ...]:
    """Pods as stored (a run's or a binding's JSON list) as the overlap rule takes them."""
    return tuple(
        PodBinding(i, p["node"], tuple(p["gpu_indices"]), p.get("gpu_fraction", 1.0))
        for i, p in enumerate(pods or ())
    )


def withdraw(
    cur: psycopg.Cursor[Any], pools: Collection[str], bound_rows: Sequence[tuple[Any, ...]]
) -> list[Withdrawal]:
    """Withdraw the bound decisions of `bound_rows` (of `BOUND_SQL`) that share a GPU with a
    run or an earlier decision beyond a whole GPU; returns those withdrawn."""
    if not bound_rows:
        return []
    bound = [Holding(uid, pod_bindings(pods), cycle_id) for uid, cycle_id, pods in bound_rows]
    nodes = sorted({p.node for b in bound for p in b.pods})
    runs: dict[str, list[PodBinding]] = defaultdict(list)
    for uid, pods in cur.execute(RUNS_SQL, {"pools": sorted(pools), "nodes": nodes}):
        runs[uid].extend(pod_bindings(pods))
    found = withdrawals([Holding(uid, tuple(p)) for uid, p in runs.items()], bound)
    if not found:
        return []
    done = {r[0] for r in cur.execute(_WITHDRAW_SQL, {"uids": [w.uid for w in found]})}
    for w in found:
        if w.uid in done:
            log.warning("bind of %s withdrawn: %s", w.uid, w.message())
    return [w for w in found if w.uid in done]


def check(
    pg: psycopg.Connection[Any], pools: Collection[str], nodes: Collection[str], *, cycle: bool
) -> list[Withdrawal]:
    """`send_check` and `withdraw` in the transaction of `pg`, outside a pipeline."""
    with pg.cursor() as lock, pg.cursor() as bound:
        send_check(lock, bound, pools, nodes, cycle=cycle)
        return withdraw(bound, pools, bound.fetchall())


def runs_within_bindings(
    runs: Iterable[tuple[str, Sequence[dict[str, Any]]]], bindings: Mapping[str, Any]
) -> bool:
    """Whether the (workload uid, pods) of new runs all lie within the bound decisions of their
    workloads (`bindings`: uid -> the binding's pods, for the workloads bound when locked), all
    of a workload's new runs together: then they add no GPU holder and need no check."""
    pods: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for uid, run_pods in runs:
        if uid not in bindings:
            return False
        pods[uid].extend(run_pods)
    return all(
        holds_within(pod_bindings(p), pod_bindings(bindings[uid])) for uid, p in pods.items()
    )
