"""What ListWorkloads reads: workloads by pool, queue and state, each pending one with its place
in its queue, a page at a time.

Order: pool, queue, then the queue's non-pending workloads by uid (place 0), then its pending ones
in the order a Schedule cycle takes them within the queue (DESIGN §4.1: priority class, highest
first; then submit time; then uid, compared by code point as the cycle does). Places count every
pending workload of the queue, whatever the state filter.

Paging is by key (`PageKey`: the sort key of the last row served), not by offset, so a page is a
bounded index range however deep the listing goes, and work that changes state between pages
shifts nothing: a row is served at most once, in its place as of the page that serves it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from gpufair.domain.model import Workload
from gpufair.store.workload_repo import workload_from_json

ALL_STATES = ("pending", "bound", "running", "finished", "cancelled")
DEFAULT_STATES = ("pending", "bound", "running")


@dataclass(frozen=True, slots=True)
class PageKey:
    """Where a page ends: (pool, queue, pending 0/1, -priority class, submit time in µs, uid)."""

    pool: str
    queue: str
    pending: int
    neg_priority: int
    submit_us: int
    uid: str

    def as_list(self) -> list[Any]:
        return [self.pool, self.queue, self.pending, self.neg_priority, self.submit_us, self.uid]


@dataclass(frozen=True, slots=True)
class ListedWorkload:
    workload: Workload
    state: str
    position: int  # 1-based place among the queue's pending workloads; 0 if not pending
    state_changed_at: datetime
    binding: dict[str, Any] | None  # bound: {"gpu_type", "pods"}
    runs: tuple[tuple[str, tuple[dict[str, Any], ...]], ...]  # running: (gpu_type, pods) per run
    evicting: bool
    key: PageKey


_KEY = 'pool, queue, k_pending, k_prio, k_time, uid COLLATE "C"'

_PAGE = f"""
WITH scope AS (
    SELECT uid, queue, pool, state, spec, state_changed_at, binding,
           CASE WHEN state = 'pending' THEN 1 ELSE 0 END AS k_pending,
           CASE WHEN state = 'pending'
                THEN -COALESCE((spec->>'priority_class')::bigint, 0) ELSE 0 END AS k_prio,
           CASE WHEN state = 'pending'
                THEN (extract(epoch FROM submit_time) * 1000000)::bigint ELSE 0 END AS k_time
    FROM workloads
    WHERE (CAST(:pool AS text) = '' OR pool = :pool)
      AND (CAST(:queue AS text) = '' OR queue = :queue)
      AND (state = ANY(:states) OR state = 'pending')
), placed AS (
    SELECT *, CASE WHEN k_pending = 1 THEN row_number() OVER (
               PARTITION BY pool, queue, k_pending ORDER BY k_prio, k_time, uid COLLATE "C")
           ELSE 0 END AS position
    FROM scope
)
SELECT * FROM placed
WHERE state = ANY(:states)
  AND (CAST(:after AS jsonb) IS NULL
       OR ({_KEY}) > (CAST(:after AS jsonb)->>0, CAST(:after AS jsonb)->>1,
                      (CAST(:after AS jsonb)->>2)::int, (CAST(:after AS jsonb)->>3)::bigint,
                      (CAST(:after AS jsonb)->>4)::bigint,
                      (CAST(:after AS jsonb)->>5) COLLATE "C"))
ORDER BY {_KEY}
LIMIT :limit
"""


def list_page(
    conn: Connection,
    *,
    pool: str,
    queue: str,
    states: Sequence[str],
    after: PageKey | None,
    limit: int,
) -> list[ListedWorkload]:
    """Up to `limit` workloads after `after` (from the start when None), in listing order."""
    rows = conn.execute(
        text(_PAGE),
        {
            "pool": pool,
            "queue": queue,
            "states": list(states),
            "after": None if after is None else json.dumps(after.as_list()),
            "limit": limit,
        },
    ).all()
    uids = [r.uid for r in rows]
    runs: dict[str, list[tuple[str, tuple[dict[str, Any], ...]]]] = {}
    evicting: set[str] = set()
    if any(r.state == "running" for r in rows):
        for r in conn.execute(
            text(
                "SELECT workload_uid, gpu_type, pods FROM allocation_intervals "
                "WHERE ended_at IS NULL AND workload_uid = ANY(:uids) ORDER BY started_at, id"
            ),
            {"uids": uids},
        ):
            runs.setdefault(r.workload_uid, []).append((r.gpu_type, tuple(r.pods)))
    if any(r.state in ("bound", "running") for r in rows):
        evicting = {
            r.victim_uid
            for r in conn.execute(
                text("SELECT victim_uid FROM evictions WHERE victim_uid = ANY(:uids)"),
                {"uids": uids},
            )
        }
    return [
        ListedWorkload(
            workload=workload_from_json(r.spec),
            state=r.state,
            position=int(r.position),
            state_changed_at=r.state_changed_at,
            binding=r.binding if r.state == "bound" else None,
            runs=tuple(runs.get(r.uid, ())) if r.state == "running" else (),
            evicting=r.uid in evicting and r.state in ("bound", "running"),
            key=PageKey(r.pool, r.queue, r.k_pending, r.k_prio, r.k_time, r.uid),
        )
        for r in rows
    ]


def names_known(conn: Connection, *, pool: str, queue: str) -> tuple[bool, bool]:
    """Whether `pool` and `queue` name something to list: configured now, or held by a stored
    workload (a removed pool's or queue's work is still listed). An empty name is known."""
    row = conn.execute(
        text(
            "SELECT CAST(:pool AS text) = '' "
            "OR EXISTS (SELECT 1 FROM node_pools WHERE name = :pool) "
            "OR EXISTS (SELECT 1 FROM workloads WHERE pool = :pool) AS pool, "
            "CAST(:queue AS text) = '' "
            "OR EXISTS (SELECT 1 FROM queues WHERE name = :queue) "
            "OR EXISTS (SELECT 1 FROM workloads WHERE queue = :queue) AS queue"
        ),
        {"pool": pool, "queue": queue},
    ).one()
    return bool(row.pool), bool(row.queue)


def latest_cycle_replies(conn: Connection, pools: Sequence[str]) -> dict[str, bytes]:
    """The stored reply (a serialized ScheduleResponse) of each pool's latest Schedule cycle."""
    if not pools:
        return {}
    rows = conn.execute(
        text(
            "SELECT DISTINCT ON (pool) pool, reply FROM schedule_cycles "
            "WHERE pool = ANY(:pools) AND NOT dry_run ORDER BY pool, decided_at DESC, id DESC"
        ),
        {"pools": list(pools)},
    )
    return {r.pool: bytes(r.reply) for r in rows}
