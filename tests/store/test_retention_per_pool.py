"""Each pool's rollups, runs and capacity history go at that pool's own horizon, on PostgreSQL.

The horizon was one for every pool: the earliest instant any pool's window or any budget's
period read. A pool counting all history without decay kept every pool's rollups, runs and
capacity rows for good. Now a pool's rows are held only by what reads that pool: its own
window, and the budgets on it or on all pools.

Two pools of 2 A100 nodes (8 GPUs, 10 CU each: 160 CU), installed 31 days before the end of the
history, a node of each drained 20 days before it; in each, a 2-hour run of 4 GPUs starts 1, 2,
..., 30 days before the end, on queues a and b in turn.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.domain.model import (
    Budget,
    BudgetPeriod,
    ClusterConfig,
    FairSharePolicy,
    GpuType,
    Node,
    NodePool,
    Queue,
    QueueQuota,
    WindowKind,
    Workload,
    frozen_map,
)
from gpufair.domain.retention_horizon import Horizon
from gpufair.store import (
    ingest_pipeline,
    report_repo,
    retention_horizons,
    rollup_repo,
    workload_repo,
)
from gpufair.store.retention_repo import Retention, apply_retention
from tests.store.test_rollups import HOUR, NOW, assert_close, install, snapshot

DAY = 86400.0
DECAYING = FairSharePolicy(window_s=7 * DAY, half_life_s=DAY)
NO_DECAY = FairSharePolicy(window_kind=WindowKind.NONE)
RUNS = range(1, 31)  # days before the end a run starts


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    with db.connect() as connection:
        yield connection
        connection.rollback()


def cluster(policies: Mapping[str, FairSharePolicy], *budgets: Budget) -> ClusterConfig:
    def quotas(deserved: float) -> Mapping[str, QueueQuota]:
        return frozen_map({p: QueueQuota(p, deserved_cu=deserved) for p in policies})

    return ClusterConfig(
        gpu_types=(GpuType("a100", 80, 10),),
        pools=tuple(NodePool(p, policy=policy) for p, policy in policies.items()),
        nodes=tuple(
            Node(f"{p}-n{i}", p, "a100", 8, 64000, 512000) for p in policies for i in range(2)
        ),
        queues=(Queue("a", None, quotas(20)), Queue("b", None, quotas(20))),
        budgets=budgets,
    )


def history(conn: Connection, config: ClusterConfig, end_s: float) -> None:
    """The config installed at end - 31 d, node n1 of each pool drained at end - 20 d, and a
    2-hour run of 4 GPUs in each pool starting each of the 30 days before `end_s`."""
    install(conn, config, end_s - 31 * DAY)
    drained = tuple(replace(n, ready=not n.name.endswith("-n1")) for n in config.nodes)
    install(conn, replace(config, nodes=drained), end_s - 20 * DAY)
    workloads, events = [], []
    for pool in config.pools:
        for d in RUNS:
            uid, start = f"{pool.name}-{d}", end_s - d * DAY
            workloads.append(Workload(uid, "ab"[d % 2], pool.name, 1, 4, start - 60))
            pods = (EventPod(f"{pool.name}-n0", (0, 1, 2, 3)),)
            events.append(LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, start, uid, pods))
            events.append(LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, start + 2 * HOUR, uid))
    workload_repo.submit(conn, workloads)
    outcomes = ingest_pipeline.ingest(conn, events, end_s)
    assert {o.status for o in outcomes} == {ingest_pipeline.EventStatus.STORED}
    for pool in config.pools:
        rollup_repo.rollup_pool(conn, config, pool, end_s)


def _per_pool(conn: Connection, sql: str) -> dict[str, int]:
    return {str(p): int(n) for p, n in conn.execute(text(sql + " GROUP BY 1 ORDER BY 1"))}


def _runs(conn: Connection) -> dict[str, int]:
    return _per_pool(conn, "SELECT pool, count(*) FROM allocation_intervals")


def _capacity_rows(conn: Connection) -> dict[str, int]:
    return _per_pool(conn, "SELECT pool, count(*) FROM pool_capacity_changes")


def _recorded(conn: Connection) -> list[tuple[str, str, float]]:
    rows = conn.execute(
        text(
            "SELECT kind, pool, extract(epoch FROM kept_from)::float8 FROM retention_horizons "
            "ORDER BY kind, pool"
        )
    )
    return [(str(k), str(p), float(t)) for k, p, t in rows]


def test_a_decaying_pool_goes_at_its_horizon_while_a_no_decay_pool_keeps_everything(
    conn: Connection,
) -> None:
    """Rollup retention of 3 days. Pool `decay` (7-day window, 1-day half-life) is held by its
    window to the hour before the one 7 days back (`READER_LAG_S`): its 23 runs that started 8
    to 30 days back go, and with them its 575 hours of buckets from its first (31 days back) to
    that hour: a fairness row an hour of
    the root (the over-quota capacity a and b compete for), and a fairness and a usage row of the
    run's queue in each of the 3 buckets each run's 2 hours meet; and its capacity row of day -31
    (day -20's holds at the horizon). Pool `all` counts all history
    without decay: every one of its rows stays. Decayed usage of both is what it was."""
    config = cluster({"decay": DECAYING, "all": NO_DECAY})
    history(conn, config, NOW)
    before = {p.name: rollup_repo.decayed_usage(conn, config, p, NOW) for p in config.pools}
    rows = snapshot(conn)
    assert _runs(conn) == {"all": 30, "decay": 30}
    assert _capacity_rows(conn) == {"all": 2, "decay": 2}
    horizon = NOW - 7 * DAY - 1234.5 - HOUR  # on the hour
    deleted = apply_retention(conn, NOW, Retention(rollups_days=3))
    assert (deleted["intervals"], deleted["capacity"]) == (23, 1)
    assert (deleted["fairness_hourly"], deleted["usage_hourly"]) == (575 + 23 * 3, 23 * 3)
    kept = [r for r in rows if r[0] == "all" or float(str(r[3])) >= horizon]
    assert len(rows) - len(kept) == 575 + 23 * 3 * 2
    assert snapshot(conn) == kept
    assert _runs(conn) == {"all": 30, "decay": 7}
    assert _capacity_rows(conn) == {"all": 2, "decay": 1}
    for pool in config.pools:
        after = rollup_repo.decayed_usage(conn, config, pool, NOW)
        assert_close(after, before[pool.name], rel=1e-12)
        assert_close(after, rollup_repo.exact_usage(conn, config, pool, NOW))
    # Only the finite horizon is recorded; a second run finds nothing more.
    assert _recorded(conn) == [("rollups", "decay", horizon)]
    again = apply_retention(conn, NOW, Retention(rollups_days=3))
    assert sum(again[k] for k in ("intervals", "usage_hourly", "fairness_hourly", "capacity")) == 0


def test_each_pools_horizon_and_what_holds_it(conn: Connection) -> None:
    """The reasons are the pool's own: the no-decay pool's window holds it, nothing holds the
    decaying one beyond its window."""
    history(conn, cluster({"decay": DECAYING, "all": NO_DECAY}), NOW)
    assert retention_horizons.pool_horizons(conn, NOW, 3) == {
        "all": Horizon(float("-inf"), ("its usage window, all history without decay",)),
        "decay": Horizon(NOW - 7 * DAY - 1234.5 - HOUR, ("its usage window",)),
    }
    # Retention of 10 days reads further back than the 7-day window: the configured age holds.
    assert retention_horizons.pool_horizons(conn, NOW, 10)["decay"] == Horizon(
        NOW - 10 * DAY - 1234.5, ()
    )


LATER = NOW + 20 * DAY  # 2026-01-21 00:20:34.5 UTC: its month began 20 days before
MONTH_START = NOW - 1234.5


@pytest.mark.parametrize(
    ("budget_pool", "held_from"),
    [
        # A monthly budget on pool `held` keeps that pool's month, not the other's.
        ("held", {"held": MONTH_START, "free": LATER - 7 * DAY - 1234.5 - HOUR}),
        # A monthly budget on all pools keeps every pool's month.
        (None, {"held": MONTH_START, "free": MONTH_START}),
    ],
)
def test_a_budget_keeps_the_period_of_the_pools_it_reads(
    conn: Connection, budget_pool: str | None, held_from: dict[str, float]
) -> None:
    """Two pools with 7-day windows, retention of 3 days, 20 days into a month: a monthly
    budget of queue a keeps the buckets and runs of its month in the pools it reads (its 10
    runs of the month in each: days 2, 4, ..., 20 back), and its consumption stays what it was;
    a pool it does not read goes back only to its window (its 3 runs: days 2, 4, 6 back)."""
    budget = Budget("a", BudgetPeriod.MONTH, 10_000.0, budget_pool)
    config = cluster({"held": DECAYING, "free": DECAYING}, budget)
    history(conn, config, LATER)
    at = datetime.fromtimestamp(LATER, UTC)
    (before,) = report_repo.budgets(conn, at)
    assert before.period_start.timestamp() == MONTH_START
    assert before.consumed_cu_hours == (800 if budget_pool else 1600)
    horizons = retention_horizons.pool_horizons(conn, LATER, 3)
    assert {p: h.kept_from_s for p, h in horizons.items()} == held_from
    on = "" if budget_pool else " on all pools"
    budget_text = f"the monthly budget of queue 'a'{on}: its period"
    assert horizons["held"].held_by == (budget_text, "its usage window")
    apply_retention(conn, LATER, Retention(rollups_days=3))
    (after,) = report_repo.budgets(conn, at)
    assert after.consumed_cu_hours == pytest.approx(before.consumed_cu_hours, rel=1e-12)
    first = _per_pool(
        conn, "SELECT pool, min(extract(epoch FROM bucket_start))::float8 FROM fairness_hourly"
    )
    assert first == {p: int(t) for p, t in held_from.items()}
    runs_of_a = _per_pool(conn, "SELECT pool, count(*) FROM allocation_intervals WHERE queue = 'a'")
    assert runs_of_a == {p: 10 if t == MONTH_START else 3 for p, t in held_from.items()}
    assert _recorded(conn) == sorted(("rollups", p, t) for p, t in held_from.items())


def test_a_redo_after_retention_starts_at_each_pools_own_horizon(conn: Connection) -> None:
    """After the retention of the first test, a change of k in both pools (nothing a bucket is
    made of) redoes each pool no further back than its rows are kept: `decay` the 168 hours its
    window reads (its horizon is an hour earlier, `READER_LAG_S`), `all` the 744 from its first
    run's day; the rows written equal those kept."""
    config = cluster({"decay": DECAYING, "all": NO_DECAY})
    history(conn, config, NOW)
    apply_retention(conn, NOW, Retention(rollups_days=3))
    kept = snapshot(conn)
    changed = replace(
        config, pools=tuple(replace(p, policy=replace(p.policy, k=2.0)) for p in config.pools)
    )
    install(conn, changed, NOW)
    redone = {p.name: rollup_repo.rollup_pool(conn, changed, p, NOW) for p in changed.pools}
    assert redone == {"decay": 7 * 24, "all": 31 * 24}
    assert snapshot(conn) == kept


def test_the_horizon_recorded_for_every_pool_still_bounds_each_redo(conn: Connection) -> None:
    """A row of pool '' (recorded when one horizon held for every pool) bounds the redo of a
    pool with no row of its own: the no-decay pool redoes from it, not from its first run."""
    config = cluster({"all": NO_DECAY})
    history(conn, config, NOW)
    every = NOW - 10 * DAY - 1234.5
    conn.execute(
        text("INSERT INTO retention_horizons (kind, pool, kept_from) VALUES ('rollups', '', :t)"),
        {"t": datetime.fromtimestamp(every, UTC)},
    )
    changed = replace(config, pools=(replace(config.pools[0], policy=replace(NO_DECAY, k=2.0)),))
    install(conn, changed, NOW)
    assert rollup_repo.rollup_pool(conn, changed, changed.pools[0], NOW) == 10 * 24


def test_a_removed_pools_rows_go_at_the_configured_age(conn: Connection) -> None:
    """Pool `gone`, no longer configured, is read by no window: its runs and buckets older than
    the 10 days configured go (its runs of days 11 to 30), while the no-decay pool keeps all."""
    config = cluster({"all": NO_DECAY, "gone": NO_DECAY})
    history(conn, config, NOW)
    install(conn, cluster({"all": NO_DECAY}), NOW)
    assert retention_horizons.pool_horizons(conn, NOW, 10)["gone"] == Horizon(
        NOW - 10 * DAY - 1234.5, ()
    )
    deleted = apply_retention(conn, NOW, Retention(rollups_days=10))
    assert deleted["intervals"] == 20
    assert _runs(conn) == {"all": 30, "gone": 10}


def test_a_late_event_brings_back_no_bucket_retention_deleted(conn: Connection) -> None:
    """Retention of 3 days deletes pool `decay`'s run of day -20, but its workload's events stay
    (180 days). A late stop of it derives the run again, from day -20; the next rollup redoes
    from the pool's horizon (nothing after it changed), not from day -20: it wrote 480 hours of
    buckets back. Decayed usage is what it was."""
    config = cluster({"decay": DECAYING, "all": NO_DECAY})
    history(conn, config, NOW)
    decay = config.pools[0]
    before = rollup_repo.decayed_usage(conn, config, decay, NOW)
    apply_retention(conn, NOW, Retention(rollups_days=3))
    kept = snapshot(conn)
    late = LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, NOW - 20 * DAY + 3 * HOUR, "decay-20")
    (outcome,) = ingest_pipeline.ingest(conn, [late], NOW)
    assert outcome.status == ingest_pipeline.EventStatus.STORED
    assert _runs(conn) == {"all": 30, "decay": 8}
    assert rollup_repo.rollup_pool(conn, config, decay, NOW) == 7 * 24 + 1
    assert snapshot(conn) == kept
    assert_close(rollup_repo.decayed_usage(conn, config, decay, NOW), before, rel=1e-12)
