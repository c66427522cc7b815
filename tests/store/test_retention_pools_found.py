"""Retention finds every pool with rows to prune, on PostgreSQL: also one with runs alone.

Retention looked for the pools no longer configured among those with capacity rows or a rollup
watermark. A pool gets its first capacity row from the config apply that makes it and a
watermark from its first rollup, but a pool configured before the ledger existed (a database
made at revision 0001: its pools have no capacity row until an apply or a node report after
the upgrade) that ran work and was removed before any rollup of it committed (no replica ran
the periodic jobs, or its rollups failed) had runs and neither: its runs were never pruned.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.domain.config_diff import diff_configs
from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.domain.model import Workload
from gpufair.domain.retention_horizon import Horizon
from gpufair.domain.rollup import floor_hour
from gpufair.store import config_repo, ingest_pipeline, retention_horizons, workload_repo
from gpufair.store.retention_repo import Retention, apply_retention
from tests.store.test_retention_per_pool import DECAYING, cluster
from tests.store.test_rollups import HOUR, NOW, install

DAY = 86400.0


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    with db.connect() as connection:
        yield connection
        connection.rollback()


def test_a_removed_pool_with_runs_alone_goes_at_the_configured_age(conn: Connection) -> None:
    """Pools `kept` and `old` configured as before the ledger (no capacity row), a 2-hour run
    in `old` starting each of the 30 days before NOW, `old` removed at NOW - 1 h with no rollup
    ever: it has runs and no capacity row or watermark. Retention of 10 days deletes its 20 runs
    older than its horizon (the configured age: nothing reads a pool no longer configured) and
    records that horizon."""
    both = cluster({"kept": DECAYING, "old": DECAYING})
    changes = diff_configs(config_repo.load_config(conn), both)
    config_repo.apply_changes(conn, both, changes)
    config_repo.record_version(conn, changes)
    workloads, events = [], []
    for d in range(1, 31):
        uid, start = f"old-{d}", NOW - d * DAY
        workloads.append(Workload(uid, "a", "old", 1, 4, start - 60))
        pods = (EventPod("old-n0", (0, 1, 2, 3)),)
        events.append(LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, start, uid, pods))
        events.append(LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, start + 2 * HOUR, uid))
    workload_repo.submit(conn, workloads)
    outcomes = ingest_pipeline.ingest(conn, events, NOW - HOUR)
    assert {o.status for o in outcomes} == {ingest_pipeline.EventStatus.STORED}
    install(conn, cluster({"kept": DECAYING}), NOW - HOUR)
    held = conn.execute(
        text(
            "SELECT (SELECT count(*) FROM pool_capacity_changes WHERE pool = 'old'), "
            "(SELECT count(*) FROM rollup_watermarks WHERE pool = 'old'), "
            "(SELECT count(*) FROM allocation_intervals WHERE pool = 'old')"
        )
    ).one()
    assert tuple(held) == (0, 0, 30)

    horizon = floor_hour(NOW - 10 * DAY)
    assert retention_horizons.pool_horizons(conn, NOW, 10)["old"] == Horizon(horizon, ())
    deleted = apply_retention(conn, NOW, Retention(rollups_days=10))
    assert deleted["intervals"] == 20
    left = conn.execute(
        text("SELECT count(*) FROM allocation_intervals WHERE pool = 'old'")
    ).scalar_one()
    assert left == 10
    recorded = conn.execute(
        text(
            "SELECT extract(epoch FROM kept_from)::float8 FROM retention_horizons "
            "WHERE kind = 'rollups' AND pool = 'old'"
        )
    ).scalar_one()
    assert recorded == horizon
