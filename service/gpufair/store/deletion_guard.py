"""The one check every config deletion passes, whichever RPC asks for it (ApplyConfig,
DeleteObjects, UpsertNodes' prune).

A deletion is refused (FAILED_PRECONDITION, nothing written) when
- an object that remains still refers to a deleted one (a node to its pool, a budget to its
  queue...): `config_scope.dangling_references`;
- work uses it now: a bound or running workload of a deleted pool or queue, a bound decision or an
  open run on a deleted node or GPU type, or an eviction in flight whose beneficiary is of a
  deleted pool or queue (its capacity is being freed for it). Such work must finish, be cancelled
  or stop first: otherwise its `stopped` event would name objects that no longer exist and the
  cycle would hold GPUs nobody can see.

A node shrunk below a GPU its bound or running work holds is refused the same way
(`work_beyond_gpu_counts`): the cycle would count that GPU nowhere and hand its node's others out.

Pending workloads do not block: a pending workload of a deleted queue simply waits (explain says
why) until its queue exists again or it is cancelled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, text

from gpufair.domain.config_diff import ConfigChange
from gpufair.domain.config_scope import MAX_SHOWN, capped, dangling_references, deletions
from gpufair.domain.errors import FailedPrecondition
from gpufair.domain.model import ClusterConfig


def work_using(conn: Connection, gone: Mapping[str, set[str]]) -> list[str]:
    """What active work uses the objects in `gone`, as "<work> uses <kind> <name>" lines (at most
    MAX_SHOWN + 1 per kind of use: enough to refuse and to say "and more")."""
    pools = sorted(gone.get("pool", set()))
    queues = sorted(gone.get("queue", set()))
    nodes = sorted(gone.get("node", set()))
    types = sorted(gone.get("gpu_type", set()))
    lines: list[str] = []
    limit = MAX_SHOWN + 1
    if pools or queues:
        for r in conn.execute(
            text(
                "SELECT uid, state, pool, queue, pool = ANY(:pools) AS by_pool FROM workloads "
                "WHERE state IN ('bound', 'running') AND (pool = ANY(:pools) OR queue = ANY(:queues)) "
                "ORDER BY uid LIMIT :limit"
            ),
            {"pools": pools, "queues": queues, "limit": limit},
        ):
            what = f"pool {r.pool}" if r.by_pool else f"queue {r.queue}"
            lines.append(f"{r.state} workload {r.uid} uses {what}")
        for r in conn.execute(
            text(
                "SELECT e.victim_uid, b.uid AS beneficiary, b.pool, b.queue, "
                "b.pool = ANY(:pools) AS by_pool "
                "FROM evictions e JOIN workloads v ON v.uid = e.victim_uid "
                "JOIN workloads b ON b.uid = e.beneficiary_uid "
                "WHERE v.state IN ('bound', 'running') "
                "AND (b.pool = ANY(:pools) OR b.queue = ANY(:queues)) "
                "ORDER BY e.victim_uid LIMIT :limit"
            ),
            {"pools": pools, "queues": queues, "limit": limit},
        ):
            what = f"pool {r.pool}" if r.by_pool else f"queue {r.queue}"
            lines.append(
                f"workload {r.beneficiary}, awaiting the eviction of {r.victim_uid}, uses {what}"
            )
    if nodes or types:
        for r in conn.execute(
            text(
                """
                SELECT DISTINCT uid, state, gpu_type, node FROM (
                    SELECT w.uid, 'bound' AS state, w.binding->>'gpu_type' AS gpu_type,
                           p->>'node' AS node
                    FROM workloads w, jsonb_array_elements(w.binding->'pods') p
                    WHERE w.state = 'bound'
                    UNION ALL
                    SELECT i.workload_uid, 'running', i.gpu_type, p->>'node'
                    FROM allocation_intervals i, jsonb_array_elements(i.pods) p
                    WHERE i.ended_at IS NULL
                ) used
                WHERE node = ANY(:nodes) OR gpu_type = ANY(:types)
                ORDER BY uid, node LIMIT :limit
                """
            ),
            {"nodes": nodes, "types": types, "limit": limit},
        ):
            what = f"node {r.node}" if r.node in gone.get("node", ()) else f"gpu_type {r.gpu_type}"
            lines.append(f"{r.state} workload {r.uid} uses {what}")
    return lines


@dataclass(frozen=True)
class HeldGpu:
    """Work holding a GPU of a node: its highest GPU index there."""

    state: str  # bound or running
    uid: str
    node: str
    gpu: int


def work_beyond_gpu_counts(conn: Connection, gpu_counts: Mapping[str, int]) -> list[HeldGpu]:
    """What bound or running work holds a GPU that a node of `gpu_counts` would no longer have
    (an index at or past its new count): the highest index per work and node, by node and work,
    at most MAX_SHOWN + 1."""
    if not gpu_counts:
        return []
    names = sorted(gpu_counts)
    rows = conn.execute(
        text(
            """
            SELECT uid, state, node, max(gpu::int) AS gpu FROM (
                SELECT w.uid, 'bound' AS state, p->>'node' AS node, p->'gpu_indices' AS gpus
                FROM workloads w, jsonb_array_elements(w.binding->'pods') p
                WHERE w.state = 'bound'
                UNION ALL
                SELECT i.workload_uid, 'running', p->>'node', p->'gpu_indices'
                FROM allocation_intervals i, jsonb_array_elements(i.pods) p
                WHERE i.ended_at IS NULL
            ) used
            JOIN unnest(CAST(:nodes AS text[]), CAST(:counts AS int[])) AS s(node, gpu_count)
                USING (node),
            jsonb_array_elements_text(used.gpus) AS gpu
            WHERE gpu::int >= s.gpu_count
            GROUP BY uid, state, node
            ORDER BY node, uid LIMIT :limit
            """
        ),
        {"nodes": names, "counts": [gpu_counts[n] for n in names], "limit": MAX_SHOWN + 1},
    )
    return [HeldGpu(r.state, r.uid, r.node, int(r.gpu)) for r in rows]


def refuse_unsafe_deletions(
    conn: Connection, final: ClusterConfig, changes: Sequence[ConfigChange]
) -> None:
    """Raise FailedPrecondition naming what blocks the deletions in `changes`, if anything does;
    `final` is the config as it would be once they are made."""
    gone = deletions(changes)
    if not gone:
        return
    blockers = dangling_references(final, gone) + work_using(conn, gone)
    if blockers:
        names = "; ".join(
            f"{kind} {', '.join(sorted(names)[:MAX_SHOWN])}"
            + (f" and {len(names) - MAX_SHOWN} more" if len(names) > MAX_SHOWN else "")
            for kind, names in sorted(gone.items())
        )
        raise FailedPrecondition(
            f"cannot delete {names}. In use: {capped(blockers)}. Nothing was changed."
        )
