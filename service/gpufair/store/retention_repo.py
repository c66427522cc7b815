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


def apply_retention(conn: Connection, now_s: float, keep: Retention) -> dict[str, int]:
    """Delete what is past its age; returns rows deleted per kind."""
    day = 86400.0
    deleted: dict[str, int] = {}

    def run(name: str, sql: str, cutoff_days: float) -> None:
        result = conn.execute(text(sql), {"cutoff": now_s - cutoff_days * day})
        deleted[name] = result.rowcount or 0

    run(
        "heartbeats",
        """
        DELETE FROM ledger_events e
        WHERE e.kind = 'heartbeat' AND e.occurred_at < to_timestamp(:cutoff)
          AND EXISTS (
              SELECT 1 FROM ledger_events newer
              WHERE newer.workload_uid = e.workload_uid AND newer.kind = 'heartbeat'
                AND newer.occurred_at > e.occurred_at)
        """,
        keep.heartbeats_days,
    )
    # A workload's events go all together, and the workload is marked: its runs stay as they
    # are, and a late run event for it is refused (`ingest_pipeline`).
    events = conn.execute(
        text(
            """
            WITH purged AS (
                DELETE FROM ledger_events e USING workloads w
                WHERE e.workload_uid = w.uid AND w.state IN ('finished', 'cancelled')
                  AND NOT EXISTS (
                      SELECT 1 FROM ledger_events newer
                      WHERE newer.workload_uid = e.workload_uid
                        AND newer.occurred_at >= to_timestamp(:cutoff))
                RETURNING e.workload_uid),
            marked AS (
                UPDATE workloads w SET events_purged_at = now()
                FROM (SELECT DISTINCT workload_uid FROM purged) AS p
                WHERE w.uid = p.workload_uid
                RETURNING 1)
            SELECT (SELECT count(*) FROM purged), (SELECT count(*) FROM marked)
            """
        ),
        {"cutoff": now_s - keep.events_days * day},
    ).one()
    deleted["events"], deleted["workloads_purged"] = int(events[0]), int(events[1])
    run(
        "node_events",
        "DELETE FROM ledger_events WHERE kind = 'node_capacity' "
        "AND occurred_at < to_timestamp(:cutoff)",
        keep.events_days,
    )
    run(
        "intervals",
        "DELETE FROM allocation_intervals WHERE ended_at < to_timestamp(:cutoff)",
        keep.rollups_days,
    )
    for table in ("usage_hourly", "fairness_hourly"):
        run(
            table,
            f"DELETE FROM {table} WHERE bucket_start < to_timestamp(:cutoff)",
            keep.rollups_days,
        )
    run(
        "history",
        "DELETE FROM fair_share_runs WHERE computed_at < to_timestamp(:cutoff)",
        keep.history_days,
    )
    run(
        "history_rows",
        "DELETE FROM fair_share_history WHERE computed_at < to_timestamp(:cutoff)",
        keep.history_days,
    )
    run(
        "replies",
        "DELETE FROM request_replies WHERE created_at < to_timestamp(:cutoff)",
        keep.replies_days,
    )
    # Recorded Schedule cycles: only each pool's newest is read (metrics, workload listings),
    # and those a stored request reply refers to (a replayed Schedule), which are as recent.
    run("cycles", _CYCLES_SQL, keep.cycles_days)
    run("claims", "DELETE FROM job_claims WHERE period_start < to_timestamp(:cutoff)", 30.0)
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


# The newest cycle of each pool (and its newest one that was not a dry run) stays whatever its
# age, and so does every cycle from the oldest one a stored request reply names on (ids grow with
# time, so that is one bound, read once).
_CYCLES_SQL = f"""
    WITH newest AS (
        SELECT pool, max(id) AS id, max(id) FILTER (WHERE NOT dry_run) AS recorded
        FROM schedule_cycles GROUP BY pool),
    referred AS (
        SELECT min(convert_from(reply, 'UTF8')::int8) AS id FROM request_replies
        WHERE method = '{CYCLE_REFERENCE}' AND convert_from(reply, 'UTF8') ~ '^[0-9]{{1,18}}$')
    DELETE FROM schedule_cycles c USING newest n
    WHERE c.pool = n.pool AND c.id < n.id AND c.id IS DISTINCT FROM n.recorded
      AND c.decided_at < to_timestamp(:cutoff)
      AND c.id < COALESCE((SELECT id FROM referred), 9223372036854775807)
"""
