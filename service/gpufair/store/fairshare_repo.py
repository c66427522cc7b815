"""Fair-share history: every recompute of a pool, with each queue's explain record.

A pool's latest run is the one stored last (the highest id), not the one dated latest: a run is
dated by the clock of the replica that computed it, and one whose clock ran ahead would otherwise
hide every later run until real time passed its date. History comes in the same order.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy.dialects import postgresql

from gpufair.domain.fairshare import FairShareResult
from gpufair.domain.model import Queue
from gpufair.store import queue_history
from gpufair.store.commit_watch import wrote_read_key
from gpufair.store.ledger_tables import fair_share_history


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


def _jsonable(value: object) -> object:
    return dict(value) if isinstance(value, Mapping) else value


def store_run(
    conn: Connection, result: FairShareResult, computed_at_s: float, config_version: int
) -> int:
    wrote_read_key(conn)  # GetFairShare's cached replies check again once this commits
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
        {name: _jsonable(getattr(share, name)) for name in _STORED}
        for share in result.shares.values()
    ]
    if rows:
        conn.execute(
            text(
                f"""
                INSERT INTO fair_share_history (run_id, pool, computed_at, {", ".join(_STORED)})
                SELECT :run, :pool, to_timestamp(:at), {", ".join(f"r.{c}" for c in _STORED)}
                FROM jsonb_to_recordset(CAST(:doc AS jsonb)) AS r({_RECORD_TYPES})
                """
            ),
            {"run": run_id, "pool": result.pool, "at": computed_at_s, "doc": json.dumps(rows)},
        )
    return run_id


# The stored record's columns, in StoredShare's order after its instant: written from the domain's
# QueueShare (same names) and read back into StoredShare, so a column is named in one place.
_STORED = tuple(f.name for f in fields(StoredShare))[1:]
_PG = postgresql.dialect()  # type: ignore[no-untyped-call]
# The record type jsonb_to_recordset reads the rows as: each column's type from the table.
_RECORD_TYPES = ", ".join(
    f"{c} {fair_share_history.c[c].type.compile(dialect=_PG)}" for c in _STORED
)
_SHARE_COLUMNS = f"extract(epoch FROM computed_at)::float8 AS at, {', '.join(_STORED)}"


def _share(r: Any) -> StoredShare:
    return StoredShare(r.at, *(getattr(r, c) for c in _STORED))


def latest_run(conn: Connection, pool: str) -> StoredRun | None:
    run = conn.execute(
        text(
            "SELECT id, extract(epoch FROM computed_at)::float8 AS at, capacity_cu "
            "FROM fair_share_runs WHERE pool = :pool ORDER BY id DESC LIMIT 1"
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


def competed_weights(run: StoredRun) -> dict[str, float]:
    """The effective weights a stored run hands the next computation (the dead band's
    `previous_effective_weights`): those of the queues that competed for over-quota capacity,
    as `FairShareResult.effective_weights` gives them, finite and ≥ 0.

    A record keeps no flag for competing: a queue that competed has W' > 0 (w / Σw over the
    competing queues, or an equal share among best-effort queues), and one that did not is
    stored with W', P and effective weight 0. That 0 is not remembered, or the band would hold
    a returning queue at it (`FairShareResult.effective_weights`)."""
    return {
        s.queue: s.effective_weight
        for s in run.shares
        if s.weight_share > 0.0 and math.isfinite(s.effective_weight) and s.effective_weight >= 0.0
    }


def previous_weights(conn: Connection, run: StoredRun, queues: Sequence[Queue]) -> dict[str, float]:
    """What the next computation of `run`'s pool takes as previous effective weights: the
    queues that competed in `run` (`competed_weights`), less those deleted and created again
    since (`queue_history`): the old queue's weight is not the new one's to keep."""
    weights = competed_weights(run)
    weighed = [q for q in queues if q.name in weights]
    for name in queue_history.recreated_since(conn, weighed, run.computed_at_s):
        weights.pop(name, None)
    return weights


def history(
    conn: Connection, pool: str, queue: str | None, since_s: float, until_s: float, limit: int
) -> Sequence[StoredShare]:
    rows = conn.execute(
        text(
            f"SELECT {_SHARE_COLUMNS} FROM fair_share_history "
            "WHERE pool = :pool AND (CAST(:queue AS text) IS NULL OR queue = :queue) "
            "AND computed_at >= to_timestamp(:since) AND computed_at <= to_timestamp(:until) "
            "ORDER BY run_id, queue LIMIT :limit"
        ),
        {"pool": pool, "queue": queue, "since": since_s, "until": until_s, "limit": limit},
    )
    return [_share(r) for r in rows]


def pool_known(conn: Connection, pool: str) -> bool:
    """Configured now, or with a fair-share run kept (a deleted pool's history still counts)."""
    return bool(
        conn.execute(
            text(
                "SELECT EXISTS (SELECT 1 FROM node_pools WHERE name = :pool) "
                "OR EXISTS (SELECT 1 FROM fair_share_runs WHERE pool = :pool)"
            ),
            {"pool": pool},
        ).scalar_one()
    )


def queue_known(conn: Connection, pool: str, queue: str) -> bool:
    """Configured now, or with a record in the pool's history (a deleted queue's still counts)."""
    return bool(
        conn.execute(
            text(
                "SELECT EXISTS (SELECT 1 FROM queues WHERE name = :queue) "
                "OR EXISTS (SELECT 1 FROM fair_share_history WHERE pool = :pool AND queue = :queue)"
            ),
            {"pool": pool, "queue": queue},
        ).scalar_one()
    )
