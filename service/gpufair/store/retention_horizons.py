"""Each pool's retention horizon: computed from what reads the pool's rows, recorded, warned of.

The pools are the configured ones and every pool that was (a pool since removed still has
rollups, runs and capacity rows): those with capacity rows, runs or a rollup watermark. What
holds each one is in `domain/retention_horizon.py`. The horizon retention deleted a pool's rows
up to is recorded per pool in `retention_horizons` before anything goes, and never moved back: a
full rollup redo of the pool (`rollup_repo.rollup_pool`) starts no earlier, so it cannot write
again what retention deleted; and nothing goes until every rollup of the pool in flight, which
may have read the older horizon, has committed (`record`). A row of pool '' was recorded when
one horizon held for every pool, and still bounds every pool's redo.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime

from sqlalchemy import Connection, text

from gpufair.domain.retention_horizon import (
    DAY_S,
    READER_LAG_S,
    Horizon,
    duration_text,
    horizon,
    window_reads_from,
)
from gpufair.domain.stored_limits import within_limits
from gpufair.store import config_repo, locks

log = logging.getLogger(__name__)

_PER = {"day": "daily", "week": "weekly", "month": "monthly"}


def pool_horizons(conn: Connection, now_s: float, rollups_days: float) -> dict[str, Horizon]:
    """Per pool, from when its rollups, ended runs and capacity history stay: `rollups_days`
    before `now_s`, or earlier where its usage window, or the current period of a budget on it
    or on all pools, still reads them at any instant from `READER_LAG_S` before `now_s` on."""
    configured_s = now_s - rollups_days * DAY_S
    reads_at_s = now_s - READER_LAG_S  # the earliest instant: the earliest starts
    needs: dict[str, list[tuple[float, str]]] = {
        pool: [] for (pool,) in conn.execute(_POOLS_WITH_ROWS_SQL)
    }
    # The config as the recompute and the rollups read it (`within_limits`): a window or
    # half-life stored beyond today's limits by an earlier version is read clamped there. As
    # stored, a window of 1e308 s gave a horizon no timestamp holds, and every run failed.
    for configured in within_limits(config_repo.load_config(conn))[0].pools:
        needs.setdefault(configured.name, []).append(
            window_reads_from(configured.policy, reads_at_s)
        )
    # A budget on a pool with neither rows nor a config has nothing to hold.
    for queue, pool_name, period, start_s in conn.execute(_BUDGET_STARTS_SQL, {"now": reads_at_s}):
        on = "" if pool_name else " on all pools"
        what = f"the {_PER[period]} budget of queue {queue!r}{on}: its period"
        for pool in [pool_name] if pool_name else list(needs):
            if pool in needs:
                needs[pool].append((start_s, what))
    return {pool: horizon(configured_s, pool_needs) for pool, pool_needs in sorted(needs.items())}


def record(conn: Connection, horizons: dict[str, Horizon]) -> None:
    """Record each finite horizon, never moving a recorded one back; commits. Then waits for the
    rollups in flight of those pools: on return, no rollup of them that read an older horizon
    is still running, so deleting up to the new one is safe.

    A rollup reads the horizon and then the runs, under its pool's rollup lock
    (`locks.rollup_key`), held to the end of its caller's transaction. One that read the old
    horizon and read the runs after retention deleted them wrote the buckets between the two
    horizons from what outlived retention, after retention's delete of buckets: less than what
    ran, left for the `report` views until the next retention. So each pool's lock is taken
    here and released at once (a transaction of its own, committed): a rollup holding it
    commits first, with every run still stored, and one that takes it later reads the new
    horizon (committed before). One pool at a time, holding nothing else: the periodic rollup
    holds several pools' locks at once, so holding two here could deadlock with it. The wait
    may last as long as a rollup's redo of a long history, past the engine's lock timeout (10 s)
    and statement timeout (30 s), so it has a timeout of its own (`ROLLUP_WAIT_S`); a rollup holding its lock longer still
    makes this run fail before it deletes anything, and the next run goes on."""
    finite = {pool: h.kept_from_s for pool, h in horizons.items() if math.isfinite(h.kept_from_s)}
    if finite:
        conn.execute(_RECORD_SQL, {"pools": list(finite), "at": list(finite.values())})
    conn.commit()
    for pool in sorted(finite):
        locks.xact_lock_waiting(conn, locks.rollup_key(pool), ROLLUP_WAIT_S)
        conn.commit()


# How long retention waits for one pool's rollup in flight (`record`): a redo of years of
# history, 30 days a statement, takes minutes on a large ledger.
ROLLUP_WAIT_S = 600

# The pools that may have rows to prune besides the configured ones: those with capacity rows,
# runs or a rollup watermark. A pool gets its first capacity row from the config apply that
# makes it (the last of them retention keeps) and a watermark from its first rollup (never
# deleted), but not every pool with runs has either: one configured before the ledger was (a
# database made at revision 0001 has no capacity rows until an apply or a node report after the
# upgrade), removed before a rollup of it committed. Each table is read by skipping from pool to
# pool along an index that leads with the pool: capacity rows by their key; runs by (pool,
# started_at) backwards, from each pool's latest start, which retention deletes last (the
# oldest, which it deletes first, stay in the index as dead entries until a vacuum).
_POOLS_WITH_ROWS_SQL = text(
    """
    WITH RECURSIVE p(pool) AS (
        (SELECT pool FROM pool_capacity_changes ORDER BY pool LIMIT 1)
        UNION ALL
        SELECT (SELECT c.pool FROM pool_capacity_changes c WHERE c.pool > p.pool
                ORDER BY c.pool LIMIT 1)
        FROM p WHERE p.pool IS NOT NULL),
    r(pool) AS (
        (SELECT pool FROM allocation_intervals ORDER BY pool DESC, started_at DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT a.pool FROM allocation_intervals a WHERE a.pool < r.pool
                ORDER BY a.pool DESC, a.started_at DESC LIMIT 1)
        FROM r WHERE r.pool IS NOT NULL)
    SELECT pool FROM p WHERE pool IS NOT NULL
    UNION SELECT pool FROM r WHERE pool IS NOT NULL
    UNION SELECT pool FROM rollup_watermarks
    """
)

# Each budget's current period start, as report.budget_status_at computes it (UTC wall clock).
_BUDGET_STARTS_SQL = text(
    """
    SELECT queue, pool, period,
           extract(epoch FROM date_trunc(period, to_timestamp(:now) AT TIME ZONE 'UTC')
                              AT TIME ZONE 'UTC')::float8
    FROM budgets ORDER BY queue, pool, period
    """
)

_RECORD_SQL = text(
    """
    INSERT INTO retention_horizons (kind, pool, kept_from)
    SELECT 'rollups', pool, to_timestamp(at)
    FROM unnest(CAST(:pools AS text[]), CAST(:at AS float8[])) AS h(pool, at)
    ON CONFLICT (kind, pool) DO UPDATE
    SET kept_from = greatest(retention_horizons.kept_from, EXCLUDED.kept_from)
    """
)


_warned: set[tuple[str, tuple[str, ...]]] = set()  # (pool, reasons) already logged


def forget_warnings() -> None:
    """Log a held horizon again (tests)."""
    _warned.clear()


def say_held(horizons: dict[str, Horizon], rollups_days: float) -> None:
    """A warning for each pool held before the configured age, once per process for each set of
    reasons: housekeeping never changes a fair share or a budget's consumption."""
    for pool, held in horizons.items():
        if not held.held_by or (pool, held.held_by) in _warned:
            continue
        _warned.add((pool, held.held_by))
        since = (
            "the start"
            if math.isinf(held.kept_from_s)
            else datetime.fromtimestamp(held.kept_from_s, UTC).strftime("%Y-%m-%d %H:%M UTC")
        )
        log.warning(
            "retention: pool %r keeps its rollups, runs and capacity history from %s, not %s "
            "as --rollup-retention-days says: %s still read%s them",
            pool,
            since,
            duration_text(rollups_days * DAY_S),
            "; ".join(held.held_by),
            "s" if len(held.held_by) == 1 else "",
        )
