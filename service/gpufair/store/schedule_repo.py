"""What a scheduling cycle reads and writes in PostgreSQL.

The life of a decision:
- `bind`: the workload becomes `bound` with its placement; its GPUs count as taken from then on.
  A `started` event makes it `running` (the batch system's pods are what the ledger counts). A
  binding not confirmed within `bind_timeout_s` is released: the workload is pending again and its
  GPUs free, so a batch system that crashed between decision and start cannot leak capacity.
- `evict`: recorded as in flight; the victim keeps its GPUs until its `stopped`/`preempted` event,
  and later cycles hold the capacity for the workload it was evicted for. The first cycle after
  the victim stopped still gets the eviction (a standing claim: the beneficiary binds first on
  the freed capacity); once that cycle is recorded it is forgotten.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, cast

import psycopg
from sqlalchemy import Connection, text

from gpufair.domain.capacity import binding_gpus
from gpufair.domain.model import Allocation, PodBinding, Workload
from gpufair.domain.snapshot import CycleResult, EvictionInFlight, PendingCode, PendingReason
from gpufair.store import bind_overlaps
from gpufair.store.workload_repo import SPECS

DEFAULT_BIND_TIMEOUT_S = 300.0  # `gpufair serve --bind-timeout-s`, `api/server.py` build_server


def release_expired_binds(conn: Connection, pool: str, now_s: float) -> int:
    result = conn.execute(
        text(
            "UPDATE workloads SET state = 'pending', binding = NULL, bound_at = NULL, "
            "bind_expires_at = NULL, state_changed_at = now() "
            "WHERE pool = :pool AND state = 'bound' AND bind_expires_at < to_timestamp(:now)"
        ),
        {"pool": pool, "now": now_s},
    )
    return result.rowcount or 0


def _pod_json(binding: PodBinding) -> dict[str, Any]:
    """One bound pod as stored; a partition's start only when there is one."""
    found: dict[str, Any] = {
        "pod_index": binding.pod_index,
        "node": binding.node,
        "gpu_indices": list(binding.gpu_indices),
        "gpu_fraction": binding.gpu_fraction,
    }
    if binding.partition_start is not None:
        found["partition_start"] = binding.partition_start
    return found


def bindings_from_json(pods: Sequence[dict[str, Any]]) -> tuple[PodBinding, ...]:
    """Pod bindings as stored in `allocation_intervals.pods` and `workloads.binding`."""
    return tuple(
        PodBinding(
            pod_index=p.get("pod_index", i),
            node=p["node"],
            gpu_indices=tuple(p["gpu_indices"]),
            gpu_fraction=p.get("gpu_fraction", 1.0),
            partition_start=p.get("partition_start"),
        )
        for i, p in enumerate(pods)
    )


def holding_and_pending(conn: Connection, pool: str) -> tuple[list[Allocation], list[Workload]]:
    """What holds GPUs now (open runs as the batch system reported them, and bound decisions)
    and what waits, oldest submission first.

    One statement, so one snapshot even under READ COMMITTED: a `started` event may commit while
    a cycle reads (ingest does not wait for the pool lock), and its workload moves from bound (or
    pending) to running. Read by separate statements, it could be missed by both, its GPUs looking
    free to the cycle, which bound other work onto them (seen under load). Here it is seen once,
    in one state or the other."""
    rows = conn.execute(
        text(
            """
            SELECT 0 AS part, i.workload_uid AS uid, w.spec_digest, i.gpu_type, i.pods,
                   extract(epoch FROM i.started_at)::float8 AS since,
                   NULL::timestamptz AS submit_time
            FROM allocation_intervals i JOIN workloads w ON w.uid = i.workload_uid
            WHERE i.pool = :pool AND i.ended_at IS NULL
            UNION ALL
            SELECT 1, uid, spec_digest, binding->>'gpu_type', binding->'pods',
                   extract(epoch FROM bound_at)::float8, NULL
            FROM workloads WHERE pool = :pool AND state = 'bound'
            UNION ALL
            SELECT 2, uid, spec_digest, NULL, NULL, NULL, submit_time
            FROM workloads WHERE pool = :pool AND state = 'pending'
            ORDER BY part, submit_time, uid, gpu_type
            """
        ),
        {"pool": pool},
    ).all()
    runs: dict[str, list[Any]] = defaultdict(list)
    for r in rows:
        if r.part == 0:
            runs[r.uid].append(r)
    bound = [r for r in rows if r.part == 1]
    waiting = [r for r in rows if r.part == 2]
    keys = [(uid, group[0].spec_digest) for uid, group in runs.items()]
    keys += [(r.uid, r.spec_digest) for r in (*bound, *waiting)]
    specs = SPECS.workloads(conn, keys)
    run_specs, bound_specs = specs[: len(runs)], specs[len(runs) : len(runs) + len(bound)]
    allocations = [
        Allocation(
            workload=spec,
            bindings=bindings_from_json([p for r in group for p in r.pods]),
            started_at_s=group[0].since,
            gpu_type=group[0].gpu_type,
        )
        for spec, group in zip(run_specs, runs.values(), strict=True)
    ]
    allocations += [
        Allocation(
            workload=spec,
            bindings=bindings_from_json(r.pods),
            started_at_s=r.since,
            gpu_type=r.gpu_type,
        )
        for spec, r in zip(bound_specs, bound, strict=True)
    ]
    return allocations, specs[len(runs) + len(bound) :]


def evictions_in_flight(conn: Connection, pool: str) -> list[EvictionInFlight]:
    """The pool's recorded evictions: those whose victims still hold capacity, and those whose
    victims stopped since the last cycle (standing claims, passed to one cycle and then
    forgotten by `forget_standing_claims`)."""
    rows = conn.execute(
        text("SELECT victim_uid, beneficiary_uid, move_to FROM evictions WHERE pool = :pool"),
        {"pool": pool},
    )
    return [
        EvictionInFlight(r.victim_uid, r.beneficiary_uid)
        if r.move_to is None
        else EvictionInFlight(
            r.victim_uid,
            r.beneficiary_uid,
            bindings_from_json(r.move_to["pods"]),
            r.move_to["gpu_type"],
        )
        for r in rows
    ]


def move_of(conn: Connection, uid: str) -> EvictionInFlight | None:
    """The move (defragmentation eviction) in flight for workload `uid`, if any."""
    row = conn.execute(
        text(
            "SELECT beneficiary_uid, move_to FROM evictions "
            "WHERE victim_uid = :uid AND move_to IS NOT NULL"
        ),
        {"uid": uid},
    ).one_or_none()
    if row is None:
        return None
    return EvictionInFlight(
        uid, row.beneficiary_uid, bindings_from_json(row.move_to["pods"]), row.move_to["gpu_type"]
    )


def moved_gpus_since(conn: Connection, pool: str, since_s: float) -> float:
    """GPUs the pool's moves (defragmentation) decided after `since_s` took: its move budget's
    use (`NodePool.max_moved_share_per_hour`)."""
    return float(
        conn.execute(
            text(
                "SELECT COALESCE(sum(gpus), 0) FROM moves "
                "WHERE pool = :pool AND decided_at > to_timestamp(:since)"
            ),
            {"pool": pool, "since": since_s},
        ).scalar_one()
    )


def _pods_doc(bindings: Sequence[PodBinding]) -> list[dict[str, Any]]:
    return [_pod_json(p) for p in bindings]


CHANGED = PendingReason(
    PendingCode.CHANGED_DURING_CYCLE,
    "the workload changed (cancelled or started) while the cycle ran; not placed",
)


def forget_standing_claims(conn: Connection, victim_uids: Sequence[str]) -> None:
    """Drop evictions whose victims had stopped before the cycle just recorded: that cycle
    served their beneficiaries' standing claims."""
    if victim_uids:
        conn.execute(
            text("DELETE FROM evictions WHERE victim_uid = ANY(:uids)"),
            {"uids": list(victim_uids)},
        )


def record_cycle(
    conn: Connection,
    pool: str,
    result: CycleResult,
    reply: bytes,
    now_s: float,
    bind_timeout_s: float,
) -> tuple[int, dict[str, PendingReason]]:
    """Store the cycle and its decisions; returns its id and the binds that were not kept,
    with the reason each waits again: not written because their workload stopped being pending
    while the cycle ran (cancelled, or started by the batch system on its own), or withdrawn
    because the batch system started other work on their GPUs meanwhile (`bind_overlaps`, the
    last step, under `locks.BIND_CHECK` until the caller commits). Those must not be reported
    as placed."""
    cycle_id = int(
        conn.execute(
            text(
                "INSERT INTO schedule_cycles (pool, decided_at, reply, binds, evicts, pending) "
                "VALUES (:pool, to_timestamp(:now), :reply, :b, :e, :p) RETURNING id"
            ),
            {
                "pool": pool,
                "now": now_s,
                "reply": reply,
                "b": len(result.binds),
                "e": len(result.evicts),
                "p": len(result.pending),
            },
        ).scalar_one()
    )
    written: set[str] = set()
    if result.binds:
        written = {
            row[0]
            for row in conn.execute(
                text(
                    """
                UPDATE workloads w SET state = 'bound', binding = r.binding,
                    bound_at = to_timestamp(:now), bind_expires_at = to_timestamp(:expires),
                    state_changed_at = now()
                FROM jsonb_to_recordset(CAST(:doc AS jsonb)) AS r(uid text, binding jsonb)
                WHERE w.uid = r.uid AND w.state = 'pending'
                RETURNING w.uid
                """
                ),
                {
                    "now": now_s,
                    "expires": now_s + bind_timeout_s,
                    "doc": json.dumps(
                        [
                            {
                                "uid": b.workload_uid,
                                "binding": {
                                    "gpu_type": b.gpu_type,
                                    "cycle_id": cycle_id,
                                    "pods": [_pod_json(p) for p in b.bindings],
                                },
                            }
                            for b in result.binds
                        ]
                    ),
                },
            )
        }
    if result.evicts:
        conn.execute(
            text(
                """
                INSERT INTO evictions (victim_uid, beneficiary_uid, pool, reason, cycle_id,
                                       decided_at, move_to)
                SELECT r.victim, r.beneficiary, :pool, r.reason, :cycle, to_timestamp(:now),
                       r.move_to
                FROM jsonb_to_recordset(CAST(:doc AS jsonb))
                     AS r(victim text, beneficiary text, reason text, move_to jsonb)
                ON CONFLICT (victim_uid) DO NOTHING
                """
            ),
            {
                "pool": pool,
                "cycle": cycle_id,
                "now": now_s,
                "doc": json.dumps(
                    [
                        {
                            "victim": e.workload_uid,
                            "beneficiary": e.beneficiary_uid,
                            "reason": e.reason.value,
                            "move_to": {"gpu_type": e.move_gpu_type, "pods": _pods_doc(e.move_to)}
                            if e.move_to
                            else None,
                        }
                        for e in result.evicts
                    ]
                ),
            },
        )
        _record_moves(conn, pool, result, now_s)
    skipped = {b.workload_uid: CHANGED for b in result.binds if b.workload_uid not in written}
    if written:
        nodes = {p.node for b in result.binds if b.workload_uid in written for p in b.bindings}
        pg = cast("psycopg.Connection[Any]", conn.connection.driver_connection)
        for w in bind_overlaps.check(pg, [pool], nodes, cycle=True):
            if w.uid in written:
                skipped[w.uid] = PendingReason(PendingCode.GPUS_TAKEN_DURING_CYCLE, w.message())
    return cycle_id, skipped


def _record_moves(conn: Connection, pool: str, result: CycleResult, now_s: float) -> None:
    """Log the cycle's moves for the hourly move budget; entries older than an hour go."""
    moves = [
        {"victim": e.workload_uid, "gpus": sum(binding_gpus(b) for b in e.move_to)}
        for e in result.evicts
        if e.move_to
    ]
    if not moves:
        return
    conn.execute(
        text(
            "DELETE FROM moves WHERE pool = :pool AND decided_at <= to_timestamp(:now) - "
            "interval '1 hour'"
        ),
        {"pool": pool, "now": now_s},
    )
    conn.execute(
        text(
            """
            INSERT INTO moves (pool, victim_uid, gpus, decided_at)
            SELECT :pool, r.victim, r.gpus, to_timestamp(:now)
            FROM jsonb_to_recordset(CAST(:doc AS jsonb)) AS r(victim text, gpus float8)
            ON CONFLICT DO NOTHING
            """
        ),
        {"pool": pool, "now": now_s, "doc": json.dumps(moves)},
    )


def replace_reply(conn: Connection, cycle_id: int, reply: bytes, binds: int) -> None:
    conn.execute(
        text("UPDATE schedule_cycles SET reply = :reply, binds = :binds WHERE id = :id"),
        {"reply": reply, "binds": binds, "id": cycle_id},
    )


def last_cycle_id(conn: Connection) -> int:
    """The highest cycle id of any pool (0 before the first): a cycle stored with a higher id
    began writing after this was read (ids come from a sequence, a read of the primary key)."""
    return int(conn.execute(text("SELECT COALESCE(max(id), 0) FROM schedule_cycles")).scalar_one())


def cycle_after(conn: Connection, pool: str, after_id: int) -> tuple[int, bytes] | None:
    """The latest cycle of `pool` with an id above `after_id`, with its stored reply (made with
    cycle id 0: the caller sets it)."""
    row = conn.execute(
        text(
            "SELECT id, reply FROM schedule_cycles WHERE id > :after AND pool = :pool "
            "ORDER BY id DESC LIMIT 1"
        ),
        {"after": after_id, "pool": pool},
    ).one_or_none()
    return None if row is None else (int(row.id), bytes(row.reply))


def cycle_reply(conn: Connection, cycle_id: int) -> bytes:
    """The stored reply of cycle `cycle_id` (made with cycle id 0: the caller sets it)."""
    return bytes(
        conn.execute(
            text("SELECT reply FROM schedule_cycles WHERE id = :id"), {"id": cycle_id}
        ).scalar_one()
    )
