"""A rollup whose watermark is older than its pool's retention horizon, on PostgreSQL.

The pool's rollups were skipped while retention ran (or the pool was removed and configured
again): retention deleted the runs that ended before the horizon and the buckets before it,
and left the watermark where it was. The next rollup went on from the watermark and wrote the
buckets before the horizon again from what outlived retention: less than what ran. The decayed
usage and the budgets never read them (the window and every budget's period hold the horizon),
but `report.usage_daily` and its kin showed them until the next retention. Now no rollup writes a
bucket before the horizon, whatever its watermark.

One pool of 2 A100 nodes (10 CU a GPU), installed 31 days before LATER (20 days into January
2026), a node drained 20 days before it; a monthly budget of queue a on the pool; a 2-hour run
of 4 GPUs starting 1, 2, ..., 30 days before LATER on queues a and b in turn, and a run of 4
GPUs of queue a over the month's start (from 2 days before it to 1 day after).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.domain.model import Budget, BudgetPeriod, ClusterConfig, Workload
from gpufair.domain.rollup import floor_hour
from gpufair.store import ingest_pipeline, report_repo, rollup_repo, workload_repo
from gpufair.store.retention_repo import Retention, apply_retention
from tests.store.test_retention_per_pool import DECAYING, LATER, MONTH_START, cluster
from tests.store.test_rollups import HOUR, assert_close, install, snapshot

DAY = 86400.0
CU = 10.0  # per A100
BEHIND = floor_hour(LATER - 25 * DAY)  # the watermark left behind: 5 days before the month


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    with db.connect() as connection:
        yield connection
        connection.rollback()


def runs() -> list[tuple[str, str, float, float]]:
    """(uid, queue, start, end) of every run, 4 GPUs each."""
    daily = [
        (f"d{d}", "ab"[d % 2], LATER - d * DAY, LATER - d * DAY + 2 * HOUR) for d in range(1, 31)
    ]
    return [*daily, ("over", "a", MONTH_START - 2 * DAY, MONTH_START + DAY)]


def with_history(conn: Connection, config: ClusterConfig, until_s: float = LATER) -> None:
    """The config installed 31 days before LATER, node n1 drained 20 days before it (when
    `until_s` is later), and the runs that start before `until_s`."""
    install(conn, config, LATER - 31 * DAY)
    if until_s > LATER - 20 * DAY:
        drained = tuple(replace(n, ready=not n.name.endswith("-n1")) for n in config.nodes)
        install(conn, replace(config, nodes=drained), LATER - 20 * DAY)
    workloads, events = [], []
    for uid, queue, start, end in runs():
        if start >= until_s:
            continue
        workloads.append(Workload(uid, queue, "late", 1, 4, start - 60))
        pods = (EventPod("late-n0", (0, 1, 2, 3)),)
        events.append(LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, start, uid, pods))
        events.append(LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, end, uid))
    workload_repo.submit(conn, workloads)
    outcomes = ingest_pipeline.ingest(conn, events, until_s)
    assert {o.status for o in outcomes} == {ingest_pipeline.EventStatus.STORED}


def exact_cu_hours(lo_s: float, hi_s: float, queue: str) -> float:
    """CU-hours of `queue` in [lo_s, hi_s), from the runs themselves."""
    return sum(
        4 * CU * max(0.0, min(end, hi_s) - max(start, lo_s)) / HOUR
        for _, q, start, end in runs()
        if q == queue
    )


def daily_report(conn: Connection) -> dict[tuple[float, str], float]:
    rows = conn.execute(
        text(
            "SELECT extract(epoch FROM period_start)::float8, queue, sum(cu_hours) "
            "FROM report.usage_daily WHERE pool = 'late' GROUP BY 1, 2"
        )
    )
    return {(float(day), str(q)): float(cu) for day, q, cu in rows}


def first_buckets(conn: Connection) -> list[float | None]:
    """The earliest bucket of `fairness_hourly` and of `usage_hourly` (None: no row)."""
    return [
        conn.execute(
            text(f"SELECT extract(epoch FROM min(bucket_start))::float8 FROM {t}")
        ).scalar()
        for t in ("fairness_hourly", "usage_hourly")
    ]


def test_a_rollup_behind_the_horizon_writes_no_bucket_before_it(conn: Connection) -> None:
    """The pool's rollups stop 25 days before LATER; retention at LATER (3 days, held to the
    month's start by the budget) deletes the runs of days 21 to 30 and every bucket before the
    month. The rollup that catches up writes from the month's start, not from its watermark: the
    daily report has no day before the month (it had Dec 27 to 31, with the run over the month's
    start alone, none of the day's 2-hour run), each day of the month is the exact integral of
    the runs, and so are the decayed usage and the budget's consumption."""
    budget = Budget("a", BudgetPeriod.MONTH, 10_000.0, "late")
    config = cluster({"late": DECAYING}, budget)
    pool = config.pools[0]
    with_history(conn, config)
    assert rollup_repo.rollup_pool(conn, config, pool, BEHIND) == 6 * 24
    exact = rollup_repo.exact_usage(conn, config, pool, LATER)  # every run still stored
    deleted = apply_retention(conn, LATER, Retention(rollups_days=3))
    assert deleted["intervals"] == 10  # days 21 to 30
    written = rollup_repo.rollup_pool(conn, config, pool, LATER)

    assert_close(rollup_repo.decayed_usage(conn, config, pool, LATER), exact, rel=1e-9)
    (status,) = report_repo.budgets(conn, datetime.fromtimestamp(LATER, UTC))
    as_of = floor_hour(LATER)
    assert status.consumed_cu_hours == pytest.approx(
        exact_cu_hours(MONTH_START, as_of, "a"), rel=1e-12
    )
    want: dict[tuple[float, str], float] = defaultdict(float)
    for day in range(20):
        lo = MONTH_START + day * DAY
        for queue in "ab":
            if cu := exact_cu_hours(lo, min(lo + DAY, as_of), queue):
                want[(lo, queue)] = cu
    got = daily_report(conn)
    before = {day: cu for day, cu in got.items() if day[0] < MONTH_START}
    assert before == {}, "days before the horizon, made of what outlived retention"
    assert got.keys() == want.keys()
    for key, cu in want.items():
        assert got[key] == pytest.approx(cu, rel=1e-12), key
    assert first_buckets(conn) == [MONTH_START, MONTH_START]
    assert written == 20 * 24


def test_a_pool_configured_again_after_retention_writes_nothing_before_its_horizon(
    conn: Connection,
) -> None:
    """The pool, with its runs of days 26 to 30, is rolled up and removed 25 days before
    LATER. Retention at LATER (10 days: nothing holds a pool no longer configured) deletes its
    runs and buckets. Configured again at LATER, its first rollup redid the hours its window
    reads and went on from its watermark: it wrote the 15 days from there to the horizon again,
    its last capacity row without any of its runs. Now it starts at the horizon."""
    config = cluster({"late": DECAYING})
    pool = config.pools[0]
    with_history(conn, config, until_s=BEHIND)
    assert rollup_repo.rollup_pool(conn, config, pool, BEHIND) == 6 * 24
    install(conn, replace(config, pools=(), nodes=(), queues=()), BEHIND)
    deleted = apply_retention(conn, LATER, Retention(rollups_days=10))
    assert deleted["intervals"] == 5
    assert snapshot(conn) == []
    install(conn, config, LATER)
    written = rollup_repo.rollup_pool(conn, config, pool, LATER)
    horizon = floor_hour(LATER - 10 * DAY)
    assert first_buckets(conn) == [horizon, None]
    assert written == 10 * 24
    assert_close(
        rollup_repo.decayed_usage(conn, config, pool, LATER),
        rollup_repo.exact_usage(conn, config, pool, LATER),
        rel=1e-9,
    )
