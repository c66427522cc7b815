"""A full rollup redo after retention, on PostgreSQL: it starts where retention keeps rollups.

A redo (a config change of queues, GPU types or pool policy) started at the pool's oldest
capacity row, which retention never deleted, or its oldest run still stored: it wrote again the
buckets retention had deleted, capacity without usage or the usage of the few runs that ended
after the horizon. It now starts at the horizon retention recorded, and the buckets it rewrites
are exactly those retention kept.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.domain.retention_horizon import READER_LAG_S
from gpufair.store import rollup_repo
from gpufair.store.retention_repo import Retention, apply_retention
from tests.store.test_rollups import HOUR, NOW, install, snapshot, with_history

DAY = 86400.0


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    with db.connect() as connection:
        yield connection
        connection.rollback()


def test_a_redo_after_retention_rewrites_the_kept_buckets_only(conn: Connection) -> None:
    """3 days of runs in a pool installed 4 days before NOW, a 2-day window: retention at 1 day
    keeps the buckets from the hour the window started in an hour before (`READER_LAG_S`): 49
    hours. A change of the pool's k (nothing a bucket is made of) redoes the buckets the window
    reads (48), and the rows equal the kept ones."""
    config = with_history(conn, seed=5, runs=300)
    pool = config.pools[0]
    assert rollup_repo.rollup_pool(conn, config, pool, NOW) == 4 * 24
    apply_retention(conn, NOW, Retention(rollups_days=1))
    kept = snapshot(conn)
    horizon = math.floor((NOW - READER_LAG_S - 2 * DAY) / HOUR) * HOUR
    assert min(float(r[3]) for r in kept) == horizon and len(kept) > 300
    changed = replace(config, pools=(replace(pool, policy=replace(pool.policy, k=2.0)),))
    install(conn, changed, NOW)
    assert rollup_repo.rollup_pool(conn, changed, changed.pools[0], NOW) == 48
    assert snapshot(conn) == kept
    recorded = conn.execute(
        text(
            "SELECT kind, extract(epoch FROM kept_from)::float8 FROM retention_horizons "
            "ORDER BY kind"
        )
    ).all()
    assert [tuple(r) for r in recorded] == [("rollups", horizon)]


def test_the_recorded_horizon_never_moves_back(conn: Connection) -> None:
    """A later run that keeps more (a longer retention) cannot bring deleted buckets back: the
    recorded horizon stays the later one."""
    with_history(conn, seed=5, runs=20)
    apply_retention(conn, NOW, Retention(rollups_days=1))
    apply_retention(conn, NOW, Retention(rollups_days=3))
    kept_from = conn.execute(
        text("SELECT extract(epoch FROM kept_from)::float8 FROM retention_horizons")
    ).scalar_one()
    assert kept_from == math.floor((NOW - READER_LAG_S - 2 * DAY) / HOUR) * HOUR
