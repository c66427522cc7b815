"""Ages out raw events, rollups, history and recorded scheduling cycles on configurable schedules.

Raw events are what runs are derived from, so an event goes only when its whole workload is done
with: the workload finished or was cancelled, and its latest event is older than the cutoff.
Heartbeats matter only as the latest sign of life, which the sweeper reads, and go sooner: all
but each workload's latest one.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, text

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


def apply_retention(conn: Connection, now_s: float, keep: Retention) -> dict[str, int]:
    """Delete what is past its age; returns rows deleted per kind. Works in batches of at most
    `BATCH_ROWS` rows, committing `conn` after each: a run cut short keeps what it deleted, and
    the next one goes on from there."""
    day = 86400.0
    deleted: dict[str, int] = {}

    def run(name: str, table: str, where: str, cutoff_days: float, **params: object) -> None:
        """Delete the rows of `table` (alias `x` in `where`) matching `where`, batch by batch."""
        sql = text(
            f"DELETE FROM {table} WHERE ctid = ANY(ARRAY("
            f"SELECT x.ctid FROM {table} x WHERE {where} LIMIT :batch))"
        )
        args = {**params, "cutoff": now_s - cutoff_days * day, "batch": BATCH_ROWS}
        total = 0
        while True:
            n = conn.execute(sql, args).rowcount or 0
            conn.commit()
            total += n
            if n < BATCH_ROWS:
                break
        deleted[name] = total

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
        keep.heartbeats_days,
    )
    # A workload's events go all together, and the workload is marked: its runs stay as they
    # are, and a late run event for it is refused (`ingest_pipeline`).
    deleted["events"] = deleted["workloads_purged"] = 0
    per_batch = max(1, BATCH_ROWS // 10)
    while True:
        events, marked = conn.execute(
            _PURGE_SQL, {"cutoff": now_s - keep.events_days * day, "batch": per_batch}
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
        keep.events_days,
    )
    run(
        "intervals",
        "allocation_intervals",
        "x.ended_at < to_timestamp(:cutoff)",
        keep.rollups_days,
    )
    for table in ("usage_hourly", "fairness_hourly"):
        run(table, table, "x.bucket_start < to_timestamp(:cutoff)", keep.rollups_days)
    run("history", "fair_share_runs", "x.computed_at < to_timestamp(:cutoff)", keep.history_days)
    run(
        "history_rows",
        "fair_share_history",
        "x.computed_at < to_timestamp(:cutoff)",
        keep.history_days,
    )
    run("replies", "request_replies", "x.created_at < to_timestamp(:cutoff)", keep.replies_days)
    # Recorded Schedule cycles: only each pool's newest is read (metrics, workload listings),
    # and those a stored request reply refers to (a replayed Schedule), which are as recent.
    kept, referred = conn.execute(_CYCLES_KEPT_SQL).one()
    run(
        "cycles",
        "schedule_cycles",
        "x.decided_at < to_timestamp(:cutoff) AND x.id <> ALL(:kept) AND x.id < :referred",
        keep.cycles_days,
        kept=list(kept or []),
        referred=referred,
    )
    run("claims", "job_claims", "x.period_start < to_timestamp(:cutoff)", 30.0)
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
