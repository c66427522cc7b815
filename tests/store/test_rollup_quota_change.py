"""A quota change redoes the rollups the pool's usage window reads, not its whole history.

30 days of runs of queue c (deserved 50 CU), one a day of 8 A100 GPUs (80 CU) from 12:00 to 14:00
UTC: 30 CU over quota for 2 h, 60 CU-hours a day. With a 7-day sliding window and no half-life,
its decayed usage is 7 x 60 = 420 CU-hours. Raising c's quota to 70 CU makes each day 20
CU-hours: the window reads 7 x 20 = 140, the exact integral of the runs under the new quota,
while the 23 older days keep the 60 counted when they were rolled up. Whenever the window then
reads further back (lengthened, or the same window at an earlier instant), the older buckets are
redone first; a change of the half-life, or a window of all history, redoes everything.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.domain.model import ClusterConfig, FairSharePolicy, WindowKind, Workload
from gpufair.store import ingest_pipeline, rollup_repo, workload_repo
from tests.store.test_rollups import (
    HOUR,
    NOW,
    assert_close,
    install,
    make_config,
    quota,
    rows_before,
    snapshot,
)

DAY = 86400.0
MIDNIGHT = NOW - 1234.5  # NOW is 00:20:34.5 UTC
RUN_DAYS = 30
INSTALLED = MIDNIGHT - (RUN_DAYS + 1) * DAY  # the nodes' capacity counts from here


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    with db.connect() as connection:
        yield connection
        connection.rollback()


def daily_runs(conn: Connection) -> None:
    workloads, events = [], []
    for k in range(1, RUN_DAYS + 1):
        uid = f"c{k}"
        start = MIDNIGHT - k * DAY + 12 * HOUR
        workloads.append(Workload(uid, "c", "p", pods=1, gpus_per_pod=8, submit_time_s=start))
        pods = (EventPod("a0", tuple(range(8))),)
        events += [
            LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, start, uid, pods),
            LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, start + 2 * HOUR, uid),
        ]
    workload_repo.submit(conn, workloads)
    outcomes = ingest_pipeline.ingest(conn, events, NOW)
    assert {o.status for o in outcomes} == {ingest_pipeline.EventStatus.STORED}


def with_c(config: ClusterConfig, deserved: float) -> ClusterConfig:
    queues = tuple(
        replace(q, quotas=quota(deserved)) if q.name == "c" else q for q in config.queues
    )
    return replace(config, queues=queues)


def with_policy(config: ClusterConfig, policy: FairSharePolicy) -> ClusterConfig:
    return replace(config, pools=(replace(config.pools[0], policy=policy),))


def c_usage_cu_h(conn: Connection, config: ClusterConfig, now_s: float) -> float:
    """Queue c's decayed usage from the rollups, held to the exact integral of the raw runs."""
    pool = config.pools[0]
    usage = rollup_repo.decayed_usage(conn, config, pool, now_s)
    assert_close(usage, rollup_repo.exact_usage(conn, config, pool, now_s), rel=1e-9)
    return usage.usage_cu_s["c"] / HOUR


def over_quota_cu_h(conn: Connection) -> float:
    """Queue c's over-quota CU-hours in `usage_hourly`, over all the buckets kept."""
    over_s = conn.execute(
        text("SELECT sum(over_quota_cu_seconds) FROM usage_hourly WHERE queue = 'c'")
    ).scalar_one()
    return float(over_s) / HOUR


def current_from(conn: Connection) -> float | None:
    at = conn.execute(
        text("SELECT extract(epoch FROM current_from)::float8 FROM rollup_watermarks")
    ).scalar_one()
    return None if at is None else float(at)


def rolled(conn: Connection, config: ClusterConfig, now_s: float = NOW) -> int:
    return rollup_repo.rollup_pool(conn, config, config.pools[0], now_s)


@pytest.fixture
def week(conn: Connection) -> ClusterConfig:
    """The 7-day window, 30 days of runs rolled up: 420 CU-hours in the window."""
    config = make_config(FairSharePolicy(window_s=7 * DAY))
    install(conn, config, INSTALLED)
    daily_runs(conn)
    assert rolled(conn, config) == (RUN_DAYS + 1) * 24  # every hour since the nodes came
    assert current_from(conn) is None
    assert c_usage_cu_h(conn, config, NOW) == pytest.approx(7 * 60, rel=1e-12)
    assert over_quota_cu_h(conn) == pytest.approx(RUN_DAYS * 60, rel=1e-12)
    return config


def test_a_quota_change_redoes_the_window_and_keeps_older_buckets(
    conn: Connection, week: ClusterConfig
) -> None:
    before = snapshot(conn)
    raised = with_c(week, 70)
    install(conn, raised, NOW)
    assert rolled(conn, raised) == 7 * 24  # the hours since MIDNIGHT - 7 d, not 31 days of them
    assert current_from(conn) == MIDNIGHT - 7 * DAY
    assert c_usage_cu_h(conn, raised, NOW) == pytest.approx(7 * 20, rel=1e-12)
    assert over_quota_cu_h(conn) == pytest.approx(23 * 60 + 7 * 20, rel=1e-12)
    older = rows_before(before, MIDNIGHT - 7 * DAY)
    assert older and rows_before(snapshot(conn), MIDNIGHT - 7 * DAY) == older
    # Nothing changed since: an hour later only that hour is rolled up.
    assert rolled(conn, raised, NOW + HOUR) == 1
    assert current_from(conn) == MIDNIGHT - 7 * DAY


def test_a_longer_window_redoes_the_older_buckets_first(
    conn: Connection, week: ClusterConfig
) -> None:
    raised = with_c(week, 70)
    install(conn, raised, NOW)
    assert rolled(conn, raised) == 7 * 24
    longer = with_policy(raised, FairSharePolicy(window_s=20 * DAY))
    install(conn, longer, NOW)
    assert rolled(conn, longer) == 20 * 24
    assert current_from(conn) == MIDNIGHT - 20 * DAY
    assert c_usage_cu_h(conn, longer, NOW) == pytest.approx(20 * 20, rel=1e-12)
    assert over_quota_cu_h(conn) == pytest.approx(10 * 60 + 20 * 20, rel=1e-12)


def test_the_window_at_an_earlier_instant_redoes_what_it_reads_first(
    conn: Connection, week: ClusterConfig
) -> None:
    """No config change this time: the same window read 5 days earlier (a clock put back)
    reaches before the hour the quota change was redone from, and only the watermark's
    `current_from` says those buckets were made with the old quota."""
    raised = with_c(week, 70)
    install(conn, raised, NOW)
    assert rolled(conn, raised) == 7 * 24
    earlier = NOW - 5 * DAY
    assert rolled(conn, raised, earlier) == 7 * 24  # from MIDNIGHT - 12 d to MIDNIGHT - 5 d
    assert current_from(conn) == MIDNIGHT - 12 * DAY
    assert c_usage_cu_h(conn, raised, earlier) == pytest.approx(7 * 20, rel=1e-12)
    assert over_quota_cu_h(conn) == pytest.approx(18 * 60 + 12 * 20, rel=1e-12)


@pytest.mark.parametrize(
    ("policy", "cu_h", "agree_from"),
    [
        (FairSharePolicy(window_kind=WindowKind.NONE), RUN_DAYS * 20, None),
        # A tumbling window of 14 days whose period began 12 days ago.
        (
            FairSharePolicy(
                window_kind=WindowKind.TUMBLING,
                window_s=14 * DAY,
                window_anchor_unix_s=MIDNIGHT - 12 * DAY,
            ),
            12 * 20,
            MIDNIGHT - 12 * DAY,
        ),
    ],
    ids=["all-history", "tumbling-anchor"],
)
def test_a_window_reaching_further_back_redoes_what_it_reads(
    conn: Connection,
    week: ClusterConfig,
    policy: FairSharePolicy,
    cu_h: float,
    agree_from: float | None,
) -> None:
    raised = with_c(week, 70)
    install(conn, raised, NOW)
    assert rolled(conn, raised) == 7 * 24
    changed = with_policy(raised, policy)
    install(conn, changed, NOW)
    rolled(conn, changed)
    assert current_from(conn) == agree_from  # None: all history was redone
    assert c_usage_cu_h(conn, changed, NOW) == pytest.approx(cu_h, rel=1e-12)


def test_a_half_life_change_still_redoes_everything(conn: Connection, week: ClusterConfig) -> None:
    raised = with_c(week, 70)
    install(conn, raised, NOW)
    assert rolled(conn, raised) == 7 * 24
    decayed = with_policy(raised, FairSharePolicy(window_s=7 * DAY, half_life_s=DAY))
    install(conn, decayed, NOW)
    assert rolled(conn, decayed) == (RUN_DAYS + 1) * 24
    assert current_from(conn) is None
    assert over_quota_cu_h(conn) == pytest.approx(RUN_DAYS * 20, rel=1e-12)
    c_usage_cu_h(conn, decayed, NOW)  # the exact integral, decayed
