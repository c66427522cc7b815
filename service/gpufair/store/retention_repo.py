"""Ages out raw events, rollups, history and recorded scheduling cycles on configurable schedules.

Raw events are what runs are derived from, so an event goes only when its whole workload is done
with: the workload finished or was cancelled, and its latest event is older than the cutoff.
Heartbeats matter only as the latest sign of life, which the sweeper reads, and go sooner: all
but each workload's latest one.

Rollups (`usage_hourly`, `fairness_hourly`), the ended runs they are made of and each pool's
capacity rows but the one in force at the horizon go at `rollups_days`, unless something still
reads them (`rollup_horizon`): the recompute reads each pool's usage window (decayed usage: the
buckets inside it, the runs at its edges), and `report.budget_status_at` each budget's current
period (usage since its UTC day, ISO week or month began). The horizon is then the earliest of
the three, on the hour, and a warning says so once per process for each set of reasons:
housekeeping never changes a fair share or a budget's consumption. A pool whose window is all
history reads back as far as its half-life leaves a weight a double can tell from zero
(`NEGLIGIBLE_HALF_LIVES`); without a half-life, all history counts alike, and no rollup or run
goes while such a pool is configured. The horizon is recorded (`retention_horizons`): a full
rollup redo starts no earlier.

Finished and cancelled workloads stay, however old: a uid names one workload for good (a
replayed SubmitWorkloads of it is a no-op, not a new run), their row carries the mark that
refuses late events once their events are gone, and ExplainWorkload, ListWorkloads and
`report.workload_accounting` show them.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection, text

from gpufair.domain.model import WindowKind
from gpufair.domain.rollup import floor_hour
from gpufair.domain.usage import window_bounds
from gpufair.store import config_repo
from gpufair.store.idempotency import CYCLE_REFERENCE

log = logging.getLogger(__name__)


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


# An all-history window with a half-life h weighs usage older than this many h by less than
# 2^-53 of the newest, below what a double adds to a sum: deleting it changes no fair share.
NEGLIGIBLE_HALF_LIVES = 53
DAY_S = 86400.0


@dataclass(frozen=True, slots=True)
class Horizon:
    kept_from_s: float  # rollups and ended runs before it go; -inf: none go
    held_by: tuple[str, ...]  # what holds it before the configured age ("pool 'p': ...")


def rollup_horizon(conn: Connection, now_s: float, rollups_days: float) -> Horizon:
    """From when rollups and ended runs stay: `rollups_days` before `now_s`, or earlier where a
    pool's usage window or a budget's current period still reads them; on the hour (the
    buckets kept are whole ones, and every run they are made of ends after it)."""
    configured_s = now_s - rollups_days * DAY_S
    needs: list[tuple[float, str]] = []
    for pool in config_repo.load_config(conn).pools:
        policy = pool.policy
        lo_s = window_bounds(now_s, policy)[0]
        what = f"pool {pool.name!r}: its usage window"
        if policy.window_kind == WindowKind.NONE and policy.half_life_s:
            lo_s = now_s - NEGLIGIBLE_HALF_LIVES * policy.half_life_s
            what += (
                f", all history, halved each {_days(policy.half_life_s)} "
                f"({NEGLIGIBLE_HALF_LIVES} half-lives)"
            )
        elif policy.window_kind == WindowKind.NONE:
            what += ", all history without decay"
        needs.append((lo_s, what))
    for queue, pool_name, period, start_s in conn.execute(_BUDGET_STARTS_SQL, {"now": now_s}):
        where = f" in pool {pool_name!r}" if pool_name else ""
        needs.append((start_s, f"the {_PER[period]} budget of queue {queue!r}{where}: its period"))
    held = sorted((lo_s, what) for lo_s, what in needs if lo_s < configured_s)
    kept_from_s = min([configured_s] + [lo_s for lo_s, _ in held])
    if math.isfinite(kept_from_s):
        kept_from_s = floor_hour(kept_from_s)
    return Horizon(kept_from_s, tuple(what for _, what in held))


# Each budget's current period start, as report.budget_status_at computes it (UTC wall clock).
_BUDGET_STARTS_SQL = text(
    """
    SELECT queue, pool, period,
           extract(epoch FROM date_trunc(period, to_timestamp(:now) AT TIME ZONE 'UTC')
                              AT TIME ZONE 'UTC')::float8
    FROM budgets ORDER BY queue, pool, period
    """
)


_PER = {"day": "daily", "week": "weekly", "month": "monthly"}


def _days(seconds: float) -> str:
    return f"{seconds / DAY_S:g} d" if seconds >= DAY_S else f"{seconds / 3600:g} h"


_warned: set[tuple[str, ...]] = set()  # the reasons already logged by this process


def forget_warnings() -> None:
    """Log a held horizon again (tests)."""
    _warned.clear()


def _say_held(horizon: Horizon, rollups_days: float) -> None:
    if not horizon.held_by or horizon.held_by in _warned:
        return
    _warned.add(horizon.held_by)
    since = (
        "the start"
        if math.isinf(horizon.kept_from_s)
        else datetime.fromtimestamp(horizon.kept_from_s, UTC).strftime("%Y-%m-%d %H:%M UTC")
    )
    log.warning(
        "retention: rollups, runs and capacity history are kept from %s, not %s as "
        "--rollup-retention-days says: %s still read%s them",
        since,
        _days(rollups_days * DAY_S),
        "; ".join(horizon.held_by),
        "s" if len(horizon.held_by) == 1 else "",
    )


def apply_retention(conn: Connection, now_s: float, keep: Retention) -> dict[str, int]:
    """Delete what is past its age; returns rows deleted per kind. Works in batches of at most
    `BATCH_ROWS` rows, committing `conn` after each: a run cut short keeps what it deleted, and
    the next one goes on from there. Rollups and ended runs go at `rollup_horizon`."""
    deleted: dict[str, int] = {}
    horizon = rollup_horizon(conn, now_s, keep.rollups_days)
    _say_held(horizon, keep.rollups_days)
    if math.isfinite(horizon.kept_from_s):
        # Recorded before anything goes, and never moved back: a full rollup redo starts no
        # earlier, so it cannot write again what this run deletes or an earlier one did.
        conn.execute(_RECORD_HORIZON_SQL, {"at": horizon.kept_from_s})
        conn.commit()

    def run(name: str, table: str, where: str, cutoff_s: float, **params: object) -> None:
        """Delete the rows of `table` (alias `x` in `where`) matching `where`, batch by batch
        (none when the cutoff is -inf)."""
        deleted[name] = 0
        if cutoff_s == -math.inf:
            return
        sql = text(
            f"DELETE FROM {table} WHERE ctid = ANY(ARRAY("
            f"SELECT x.ctid FROM {table} x WHERE {where} LIMIT :batch))"
        )
        args = {**params, "cutoff": cutoff_s, "batch": BATCH_ROWS}
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
    run(
        "intervals",
        "allocation_intervals",
        "x.ended_at < to_timestamp(:cutoff)",
        horizon.kept_from_s,
    )
    for table in ("usage_hourly", "fairness_hourly"):
        run(table, table, "x.bucket_start < to_timestamp(:cutoff)", horizon.kept_from_s)
    # Capacity is a step function: of the rows before the horizon, the last one of each pool
    # holds at the horizon and stays; the others are read by nothing that is kept.
    run(
        "capacity",
        "pool_capacity_changes",
        """
        x.changed_at < to_timestamp(:cutoff)
          AND EXISTS (
              SELECT 1 FROM pool_capacity_changes later
              WHERE later.pool = x.pool AND later.changed_at > x.changed_at
                AND later.changed_at <= to_timestamp(:cutoff))
        """,
        horizon.kept_from_s,
    )
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
    run("claims", "job_claims", "x.period_start < to_timestamp(:cutoff)", now_s - 30 * DAY_S)
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


_RECORD_HORIZON_SQL = text(
    """
    INSERT INTO retention_horizons (kind, kept_from) VALUES ('rollups', to_timestamp(:at))
    ON CONFLICT (kind) DO UPDATE
    SET kept_from = greatest(retention_horizons.kept_from, EXCLUDED.kept_from)
    """
)

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
