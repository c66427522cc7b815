"""Fair-share history: every recompute of a pool, with each queue's explain record."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, text

from gpufair.domain.fairshare import FairShareResult


@dataclass(frozen=True, slots=True)
class StoredShare:
    """A queue's record as stored: the numbers the API and reports show."""

    computed_at_s: float
    queue: str
    parent: str | None
    priority: int
    deserved_cu: float
    demand_cu: float
    limit_cu: float | None
    allocated_cu: float
    weight_share: float
    usage_share: float
    priority_weight: float
    effective_weight: float
    fair_share_cu: float
    decayed_usage_cu_s: float
    fair_share_gpus_by_type: dict[str, float]


@dataclass(frozen=True, slots=True)
class StoredRun:
    run_id: int
    pool: str
    computed_at_s: float
    capacity_cu: float
    shares: tuple[StoredShare, ...]


def store_run(
    conn: Connection, result: FairShareResult, computed_at_s: float, config_version: int
) -> int:
    run_id = int(
        conn.execute(
            text(
                "INSERT INTO fair_share_runs (pool, computed_at, capacity_cu, config_version) "
                "VALUES (:pool, to_timestamp(:at), :cap, :version) RETURNING id"
            ),
            {
                "pool": result.pool,
                "at": computed_at_s,
                "cap": result.capacity_cu,
                "version": config_version,
            },
        ).scalar_one()
    )
    rows = [
        {
            "queue": s.queue,
            "parent": s.parent,
            "priority": s.priority,
            "deserved_cu": s.deserved_cu,
            "demand_cu": s.demand_cu,
            "limit_cu": s.limit_cu,
            "allocated_cu": s.allocated_cu,
            "weight_share": s.weight_share,
            "usage_share": s.usage_share,
            "priority_weight": s.priority_weight,
            "effective_weight": s.effective_weight,
            "fair_share_cu": s.fair_share_cu,
            "decayed_usage_cu_s": s.usage_cu_s,
            "by_type": dict(s.fair_share_gpus_by_type),
        }
        for s in result.shares.values()
    ]
    if rows:
        conn.execute(
            text(
                """
                INSERT INTO fair_share_history
                    (run_id, queue, pool, computed_at, parent, priority, deserved_cu, demand_cu,
                     limit_cu, allocated_cu, weight_share, usage_share, priority_weight,
                     effective_weight, fair_share_cu, decayed_usage_cu_s, fair_share_gpus_by_type)
                SELECT :run, r.queue, :pool, to_timestamp(:at), r.parent, r.priority,
                       r.deserved_cu, r.demand_cu, r.limit_cu, r.allocated_cu, r.weight_share,
                       r.usage_share, r.priority_weight, r.effective_weight, r.fair_share_cu,
                       r.decayed_usage_cu_s, r.by_type
                FROM jsonb_to_recordset(CAST(:doc AS jsonb)) AS r(
                    queue text, parent text, priority int, deserved_cu float8, demand_cu float8,
                    limit_cu float8, allocated_cu float8, weight_share float8,
                    usage_share float8, priority_weight float8, effective_weight float8,
                    fair_share_cu float8, decayed_usage_cu_s float8, by_type jsonb)
                """
            ),
            {"run": run_id, "pool": result.pool, "at": computed_at_s, "doc": json.dumps(rows)},
        )
    return run_id


_SHARE_COLUMNS = (
    "extract(epoch FROM computed_at)::float8 AS at, queue, parent, priority, deserved_cu, "
    "demand_cu, limit_cu, allocated_cu, weight_share, usage_share, priority_weight, "
    "effective_weight, fair_share_cu, decayed_usage_cu_s, fair_share_gpus_by_type"
)


def _share(r: Any) -> StoredShare:
    return StoredShare(
        r.at,
        r.queue,
        r.parent,
        r.priority,
        r.deserved_cu,
        r.demand_cu,
        r.limit_cu,
        r.allocated_cu,
        r.weight_share,
        r.usage_share,
        r.priority_weight,
        r.effective_weight,
        r.fair_share_cu,
        r.decayed_usage_cu_s,
        dict(r.fair_share_gpus_by_type),
    )


def latest_run(conn: Connection, pool: str) -> StoredRun | None:
    run = conn.execute(
        text(
            "SELECT id, extract(epoch FROM computed_at)::float8 AS at, capacity_cu "
            "FROM fair_share_runs WHERE pool = :pool ORDER BY computed_at DESC, id DESC LIMIT 1"
        ),
        {"pool": pool},
    ).one_or_none()
    if run is None:
        return None
    rows = conn.execute(
        text(f"SELECT {_SHARE_COLUMNS} FROM fair_share_history WHERE run_id = :run ORDER BY queue"),
        {"run": run.id},
    )
    return StoredRun(run.id, pool, run.at, run.capacity_cu, tuple(_share(r) for r in rows))


def history(
    conn: Connection, pool: str, queue: str | None, since_s: float, until_s: float, limit: int
) -> Sequence[StoredShare]:
    rows = conn.execute(
        text(
            f"SELECT {_SHARE_COLUMNS} FROM fair_share_history "
            "WHERE pool = :pool AND (CAST(:queue AS text) IS NULL OR queue = :queue) "
            "AND computed_at >= to_timestamp(:since) AND computed_at <= to_timestamp(:until) "
            "ORDER BY computed_at, queue LIMIT :limit"
        ),
        {"pool": pool, "queue": queue, "since": since_s, "until": until_s, "limit": limit},
    )
    return [_share(r) for r in rows]
