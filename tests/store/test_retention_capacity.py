"""Retention of a pool's capacity history (`pool_capacity_changes`), on PostgreSQL.

Capacity is a step function: a row holds from its instant to the next one. Nothing pruned it,
and every recompute reads a pool's whole timeline. Retention now deletes the rows before its
rollup horizon except each pool's last one at or before it, which gives the capacity from the
horizon on: the timeline after the horizon, and so decayed usage, stay as they were.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.domain.model import ClusterConfig, FairSharePolicy, WindowKind
from gpufair.store import capacity_repo, rollup_repo
from gpufair.store.retention_repo import Retention, apply_retention
from tests.store.test_rollups import HOUR, NOW, POLICIES, assert_close, install, make_config

DAY = 86400.0


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    with db.connect() as connection:
        yield connection
        connection.rollback()


def _ready(config: ClusterConfig, *down: str) -> ClusterConfig:
    nodes = tuple(replace(n, ready=n.name not in down) for n in config.nodes)
    return replace(config, nodes=nodes)


def _history(conn: Connection, policy: FairSharePolicy) -> ClusterConfig:
    """Pool p installed at NOW - 10 d (4 A100 nodes of 80 CU and 4 T4 ones of 4 CU: 336 CU), then
    drains and resumes: rows at -10 d, -9 d, -8 d, -3 d and -1 h."""
    config = make_config(policy)
    steps = [(10 * DAY, ()), (9 * DAY, ("a0",)), (8 * DAY, ("a0", "t0")), (3 * DAY, ("t0",))]
    for ago, down in [*steps, (HOUR, ())]:
        install(conn, _ready(config, *down), NOW - ago)
    return config


def _rows(conn: Connection) -> list[tuple[float, float]]:
    return [
        (float(r[0]), float(r[1]))
        for r in conn.execute(
            text(
                "SELECT extract(epoch FROM changed_at)::float8, capacity_cu "
                "FROM pool_capacity_changes WHERE pool = 'p' ORDER BY changed_at"
            )
        )
    ]


def test_rows_before_the_horizon_go_but_the_one_in_force_at_it(conn: Connection) -> None:
    config = _history(conn, POLICIES["sliding-1d-no-decay"])
    assert _rows(conn) == [
        (NOW - 10 * DAY, 336.0),
        (NOW - 9 * DAY, 256.0),
        (NOW - 8 * DAY, 252.0),
        (NOW - 3 * DAY, 332.0),
        (NOW - HOUR, 336.0),
    ]
    pool = config.pools[0]
    before = rollup_repo.exact_usage(conn, config, pool, NOW)
    horizon = math.floor((NOW - 5 * DAY) / HOUR) * HOUR
    deleted = apply_retention(conn, NOW, Retention(rollups_days=5))
    assert deleted["capacity"] == 2
    assert _rows(conn) == [(NOW - 8 * DAY, 252.0), (NOW - 3 * DAY, 332.0), (NOW - HOUR, 336.0)]
    timeline = capacity_repo.capacity_timeline(conn, pool.name, NOW)
    assert [(s.start_s, s.end_s, s.value) for s in timeline] == [
        (NOW - 8 * DAY, NOW - 3 * DAY, 252.0),
        (NOW - 3 * DAY, NOW - HOUR, 332.0),
        (NOW - HOUR, NOW, 336.0),
    ]
    assert timeline[0].start_s < horizon
    assert_close(rollup_repo.exact_usage(conn, config, pool, NOW), before, rel=1e-12)
    # A second run finds nothing more to delete: the row in force at the horizon stays.
    assert apply_retention(conn, NOW + DAY, Retention(rollups_days=5))["capacity"] == 0


def test_a_row_at_the_horizon_needs_none_before_it(conn: Connection) -> None:
    _history(conn, POLICIES["sliding-1d-no-decay"])
    horizon = math.floor((NOW - 3 * DAY) / HOUR) * HOUR  # 3-day retention, a 1-day window
    conn.execute(
        text(
            "UPDATE pool_capacity_changes SET changed_at = to_timestamp(:h) WHERE capacity_cu = 332"
        ),
        {"h": horizon},
    )
    deleted = apply_retention(conn, NOW, Retention(rollups_days=3))
    assert deleted["capacity"] == 3
    assert [cu for _, cu in _rows(conn)] == [332.0, 336.0]


def test_a_pool_that_reads_all_history_keeps_every_row(conn: Connection) -> None:
    _history(conn, FairSharePolicy(window_kind=WindowKind.NONE))
    assert apply_retention(conn, NOW, Retention(rollups_days=5))["capacity"] == 0
    assert len(_rows(conn)) == 5
