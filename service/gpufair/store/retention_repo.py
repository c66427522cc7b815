"""Ages out raw events, rollups, history and recorded scheduling cycles on configurable schedules.

Raw events are what runs are derived from, so an event goes only when its whole workload is done
with: the workload finished or was cancelled, and its latest event is older than the cutoff.
Heartbeats matter only as the latest sign of life, which the sweeper reads, and go sooner: all
but each workload's latest one.

Rollups (`usage_hourly`, `fairness_hourly`), the ended runs they are made of and capacity rows
but the one in force at the horizon are all a pool's own, and go pool by pool at that pool's
horizon (`store/retention_horizons.py`, `domain/retention_horizon.py`): `rollups_days`, unless
the pool's usage window or the current period of a budget on it (or on all pools) still reads
them; a warning says so once per process for each pool and set of reasons. A pool that counts
all history without decay keeps all of its own rows, and holds no other pool's. Each horizon is
recorded before anything goes: a full rollup redo of the pool starts no earlier, and a rollup in
flight that read the older one commits first (`retention_horizons.record`).

Nothing else waits for a horizon: events go at `events_days` with their workload, node capacity
events (of a node, not a pool) at `events_days` too, and workloads stay. Periodic jobs' claims
go after `CLAIMS_DAYS`, except each job's latest success (the overdue alert's reference).

Finished and cancelled workloads stay, however old: a uid names one workload for good (a
replayed SubmitWorkloads of it is a no-op, not a new run), their row carries the mark that
refuses late events once their events are gone, and ExplainWorkload, ListWorkloads and
`report.workload_accounting` show them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, text

from gpufair.domain.retention_horizon import DAY_S
from gpufair.store import node_history_repo, retention_horizons
from gpufair.store.idempotency import CYCLE_REFERENCE


@dataclass(frozen=True, slots=True)
class Retention:
    events_days: float = 180.0
    heartbeats_days: float = 7.0
    rollups_days: float = 400.0
    history_days: float = 90.0
    replies_days: float = 7.0
    cycles_days: float = 7.0


# Rows one statement deletes at most (workloads: a tenth of it); each batch is committed. One
# statement per kind took a whole backlog at once (a first run on a large ledger, or a run after
# retention was shortened): past the engine's statement timeout it rolled back whole, every day.
BATCH_ROWS = 10_000
# Periodic jobs' claims (`store/claims_repo.py`), but each job's latest success, which stays.
CLAIMS_DAYS = 30


def apply_retention(conn: Connection, now_s: float, keep: Retention) -> dict[str, int]:
    """Delete what is past its age; returns rows deleted per kind. Works in batches of at most
    `BATCH_ROWS` rows, committing `conn` after each: a run cut short keeps what it deleted, and
    the next one goes on from there. Rollups, ended runs and capacity rows go pool by pool, at
    each pool's horizon (`retention_horizons.pool_horizons`)."""
    deleted: dict[str, int] = {}
    horizons = retention_horizons.pool_horizons(conn, now_s, keep.rollups_days)
    retention_horizons.say_held(horizons, keep.rollups_days)
    # Recorded before anything goes, and never moved back: a full rollup redo of a pool starts
    # no earlier, so it cannot write again what this run deletes or an earlier one did. Every
    # rollup in flight that read an older horizon has committed when `record` returns.
    retention_horizons.record(conn, horizons)

    def run(
        name: str, table: str, where: str, cutoff_s: float, join: str = "", **params: object
    ) -> None:
        """Delete the rows of `table` (alias `x` in `where`, after `join`) matching `where`,
        batch by batch (none when the cutoff is -inf); adds the count to `deleted[name]`."""
        deleted.setdefault(name, 0)
        if cutoff_s == -math.inf:
            return
        sql = text(
            f"DELETE FROM {table} WHERE ctid = ANY(ARRAY("
            f"SELECT x.ctid FROM {table} x {join} WHERE {where} LIMIT :batch))"
        )
        args = {**params, "cutoff": cutoff_s, "batch": BATCH_ROWS}
        total = 0
        while True:
            n = conn.execute(sql, args).rowcount or 0
            conn.commit()
            total += n
            if n < BATCH_ROWS:
                break
        deleted[name] += total

    run(
        "heartbeats",
        "ledger_events",
        """
        x.kind = 'heartbeat' AND x.occurred_at < to_timestamp(:cutoff)
          AND EXISTS (
              SELECT 1 FROM ledger_events newer
              WHERE newer.workload_uid = x.workload_uid AND newer.kind = 'heartbeat'
                AND newer.occurred_at > x.occurred_at)
        """,
        now_s - keep.heartbeats_days * DAY_S,
    )
    # A workload's events go all together, and the workload is marked: its runs stay as they
    # are, and a late run event for it is refused (`ingest_pipeline`).
    deleted["events"] = deleted["workloads_purged"] = 0
    per_batch = max(1, BATCH_ROWS // 10)
    while True:
        events, marked = conn.execute(
            _PURGE_SQL, {"cutoff": now_s - keep.events_days * DAY_S, "batch": per_batch}
        ).one()
        conn.commit()
        deleted["events"] += int(events)
        deleted["workloads_purged"] += int(marked)
        if marked < per_batch:
            break
    run(
        "node_events",
        "ledger_events",
        "x.kind = 'node_capacity' AND x.occurred_at < to_timestamp(:cutoff)",
        now_s - keep.events_days * DAY_S,
    )
    _prune_pools(run, {pool: h.kept_from_s for pool, h in horizons.items()})
    _prune_node_history(run, min((h.kept_from_s for h in horizons.values()), default=-math.inf))
    history_s = now_s - keep.history_days * DAY_S
    run("history", "fair_share_runs", "x.computed_at < to_timestamp(:cutoff)", history_s)
    run(
        "history_rows",
        "fair_share_history",
        "x.computed_at < to_timestamp(:cutoff)",
        history_s,
    )
    replies_s = now_s - keep.replies_days * DAY_S
    run("replies", "request_replies", "x.created_at < to_timestamp(:cutoff)", replies_s)
    # Recorded Schedule cycles: only each pool's newest is read (metrics, workload listings),
    # and those a stored request reply refers to (a replayed Schedule), which are as recent.
    kept, referred = conn.execute(_CYCLES_KEPT_SQL).one()
    run(
        "cycles",
        "schedule_cycles",
        "x.decided_at < to_timestamp(:cutoff) AND x.id <> ALL(:kept) AND x.id < :referred",
        now_s - keep.cycles_days * DAY_S,
        kept=list(kept or []),
        referred=referred,
    )
    # Each job's latest success stays, however old: the overdue alert reads the time since it
    # (`gpufair_periodic_job_last_success_timestamp_seconds`), and a job failing for longer
    # than the claims are kept would otherwise lose it and fall silent.
    run(
        "claims",
        "job_claims",
        """
        x.period_start < to_timestamp(:cutoff)
          AND (x.outcome IS NULL OR x.outcome NOT LIKE 'ok%' OR EXISTS (
              SELECT 1 FROM job_claims newer
              WHERE newer.job = x.job AND newer.outcome LIKE 'ok%'
                AND newer.period_start > x.period_start))
        """,
        now_s - CLAIMS_DAYS * DAY_S,
    )
    # Rollups take the marks of configured pools; those of a pool since removed would stay. A
    # pool configured again comes with a new config version, and its rollups are redone whole.
    marks = conn.execute(
        text(
            "DELETE FROM rollup_dirty_marks m "
            "WHERE NOT EXISTS (SELECT 1 FROM node_pools p WHERE p.name = m.pool)"
        )
    )
    deleted["dirty_marks"] = marks.rowcount or 0
    return deleted


def _prune_pools(run: Callable[..., None], kept_from: dict[str, float]) -> None:
    """Each pool's ended runs, rollups and capacity rows before its horizon (`kept_from`, pool
    by pool). Runs and rollups: one statement a batch for all pools, as one horizon for all
    was; each row meets its pool's horizon in a join, and the latest horizon, a plain bound,
    lets the scan use the same indexes as before. A pool with no finite horizon is left out:
    nothing of it goes."""
    finite = {pool: at for pool, at in kept_from.items() if math.isfinite(at)}
    latest_s = max(finite.values(), default=-math.inf)
    horizon = {
        "join": "JOIN (SELECT pool, to_timestamp(at) AS at FROM unnest(CAST(:pools AS text[]), "
        "CAST(:horizons AS float8[])) AS u(pool, at)) AS h ON h.pool = x.pool",
        "pools": list(finite),
        "horizons": list(finite.values()),
    }
    run(
        "intervals",
        "allocation_intervals",
        "x.ended_at < to_timestamp(:cutoff) AND x.ended_at < h.at",
        latest_s,
        **horizon,
    )
    for table in ("usage_hourly", "fairness_hourly"):
        where = "x.bucket_start < to_timestamp(:cutoff) AND x.bucket_start < h.at"
        run(table, table, where, latest_s, **horizon)
    # Capacity is a step function: of a pool's rows before its horizon, the last one holds at
    # the horizon and stays; the others are read by nothing that is kept. Few rows: pool by
    # pool, along their key (joined, the look for a later row cost 20 times as much).
    for pool, at in (finite or {"": -math.inf}).items():  # no pool: `run` counts none
        run(
            "capacity",
            "pool_capacity_changes",
            """
            x.pool = :pool AND x.changed_at < to_timestamp(:cutoff)
              AND EXISTS (
                  SELECT 1 FROM pool_capacity_changes later
                  WHERE later.pool = x.pool AND later.changed_at > x.changed_at
                    AND later.changed_at <= to_timestamp(:cutoff))
            """,
            at,
            pool=pool,
        )


def _prune_node_history(run: Callable[..., None], kept_from_s: float) -> None:
    """Each node's capacity reports and config rows (`node_history_repo`) before the earliest
    pool horizon, but the latest of each node before it: a node is no pool's own, and a
    rebuild of a pool's capacity rows from any instant it keeps starts from the ones in force
    there. A pool that keeps all its history keeps all of these too."""
    for table, where in node_history_repo.RETENTION_WHERE.items():
        run(table, table, where, kept_from_s)


# Up to :batch finished workloads whose events are all older than the cutoff: their events go,
# and they are marked, in one statement.
_PURGE_SQL = text(
    """
    WITH batch AS (
        SELECT w.uid FROM workloads w
        WHERE w.state IN ('finished', 'cancelled')
          AND EXISTS (SELECT 1 FROM ledger_events e WHERE e.workload_uid = w.uid)
          AND NOT EXISTS (
              SELECT 1 FROM ledger_events newer
              WHERE newer.workload_uid = w.uid AND newer.occurred_at >= to_timestamp(:cutoff))
        LIMIT :batch),
    purged AS (
        DELETE FROM ledger_events e USING batch b WHERE e.workload_uid = b.uid
        RETURNING e.workload_uid),
    marked AS (
        UPDATE workloads w SET events_purged_at = now()
        FROM (SELECT DISTINCT workload_uid FROM purged) AS p
        WHERE w.uid = p.workload_uid
        RETURNING 1)
    SELECT (SELECT count(*) FROM purged), (SELECT count(*) FROM marked)
    """
)

# The cycles that stay whatever their age: each pool's newest, and its newest that was not a
# dry run; and the oldest cycle a stored request reply names (ids grow with time: every cycle
# from it on stays). Read once per run.
_CYCLES_KEPT_SQL = text(
    f"""
    SELECT
        (SELECT array_agg(id) FROM (
            SELECT max(id) AS id FROM schedule_cycles GROUP BY pool
            UNION SELECT max(id) FROM schedule_cycles WHERE NOT dry_run GROUP BY pool) AS n),
        COALESCE((
            SELECT min(convert_from(reply, 'UTF8')::int8) FROM request_replies
            WHERE method = '{CYCLE_REFERENCE}'
              AND convert_from(reply, 'UTF8') ~ '^[0-9]{{1,18}}$'), 9223372036854775807)
    """
)
