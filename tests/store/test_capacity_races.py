"""Node capacity changes on PostgreSQL, against rollups and against each other: a capacity
change ingested late, or in flight while a rollup runs, is counted by the next rollup, and two
capacity changes of one pool committed side by side both reach the pool's capacity history.

Pool `p` of `test_rollups.make_config`: 4 A100 nodes of 8 GPUs (weight 10) and 4 T4 nodes of 4
(weight 1), 336 CU. Node a0 reported with 0 usable GPUs takes 80 CU away, node t0 4 CU."""

from __future__ import annotations

import threading
import uuid

import pytest
from sqlalchemy import Engine, text

from gpufair.domain.ledger import EventKind, LedgerEvent
from gpufair.domain.model import ClusterConfig
from gpufair.store import capacity_repo, ingest_pipeline, rollup_repo
from tests.lock_waits import until, waiting_on_locks
from tests.store.test_rollups import (
    HOUR,
    NOW,
    _first_rollup_race_setup,
    _rollup_during_uncommitted_ingest,
    assert_close,
)


def _capacity(node: str, gpus: int, at_s: float) -> LedgerEvent:
    return LedgerEvent(str(uuid.uuid4()), EventKind.NODE_CAPACITY, at_s, node=node, gpu_count=gpus)


def _assert_drop_counted(db: Engine, config: ClusterConfig) -> None:
    """After one more rollup at NOW: the capacity the top-level queues competed for beyond their
    deserved 250 CU, over the pool's 1-day window (no decay), is 86 CU x 19 h + 6 CU x 5 h =
    1,664 CU-hours, as the raw capacity history says. With a0's drop at NOW - 5 h missed by the
    buckets, only its part after floor(NOW) counts: 2,064 - 80 x 1234.5 s = 2,036.6 CU-hours."""
    pool = config.pools[0]
    with db.begin() as conn:
        rollup_repo.rollup_pool(conn, config, pool, NOW)
        usage = rollup_repo.decayed_usage(conn, config, pool, NOW)
        assert usage.group_capacity_cu_s[None] / HOUR == pytest.approx(1664.0, rel=1e-9)
        assert_close(usage, rollup_repo.exact_usage(conn, config, pool, NOW))


def test_late_capacity_change_is_rolled_up_again(db: Engine) -> None:
    """The pool is rolled up to NOW, then node a0's loss of its GPUs at NOW - 5 h arrives (a
    late event, acknowledged): the next rollup must redo those 5 hours. At BASE a capacity change
    marked nothing and the buckets kept 336 CU for good (2,036.6 CU-hours instead of 1,664)."""
    config, _late_run = _first_rollup_race_setup(db)
    with db.begin() as conn:
        assert rollup_repo.rollup_pool(conn, config, config.pools[0], NOW) == 48
        stored = ingest_pipeline.ingest(conn, [_capacity("a0", 0, NOW - 5 * HOUR)], NOW)
        assert [o.status for o in stored] == [ingest_pipeline.EventStatus.STORED]
    _assert_drop_counted(db, config)


def test_capacity_change_in_flight_at_an_hour_boundary_is_counted(db: Engine) -> None:
    """The pool is rolled up to floor(NOW - 6 h); a0's loss at NOW - 5 h is ingested and left
    uncommitted while the pool is rolled up to NOW (the rollup does not wait for it). The next
    rollup must count it (BASE: the watermark moved past it, 2,036.6 CU-hours instead of 1,664)."""
    config, _late_run = _first_rollup_race_setup(db)
    with db.begin() as conn:
        assert rollup_repo.rollup_pool(conn, config, config.pools[0], NOW - 6 * HOUR) == 42
    _rollup_during_uncommitted_ingest(db, config, [_capacity("a0", 0, NOW - 5 * HOUR)])
    _assert_drop_counted(db, config)


def test_capacity_changes_of_one_pool_committed_together_are_both_recorded(db: Engine) -> None:
    """a0 loses its 8 GPUs at NOW - 2 h in one transaction, left open; t0 its 4 GPUs at
    NOW - 1 h in another. Each recomputes the pool's capacity from the nodes it sees: the pool's
    latest capacity must be 336 - 80 - 4 = 252 CU whichever commits first. At BASE the second
    did not see the first (uncommitted) and recorded 332 CU as the latest, for good: rollups and
    reports divided by 80 CU that no longer exist."""
    _first_rollup_race_setup(db)
    errors: list[BaseException] = []

    def other() -> None:
        try:
            with db.begin() as conn:
                ingest_pipeline.ingest(conn, [_capacity("t0", 0, NOW - 1 * HOUR)], NOW)
        except BaseException as exc:
            errors.append(exc)

    with db.connect() as first:
        ingest_pipeline.ingest(first, [_capacity("a0", 0, NOW - 2 * HOUR)], NOW)
        second = threading.Thread(target=other)
        second.start()
        # Either it waits for the first (a lock), or it commits without seeing it.
        until(
            lambda: not second.is_alive() or waiting_on_locks(db) == 1,
            "the second capacity change neither finished nor waited",
        )
        first.commit()
    second.join(timeout=30)
    assert errors == []
    with db.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT extract(epoch FROM changed_at)::float8, capacity_cu "
                "FROM pool_capacity_changes WHERE pool = 'p' ORDER BY changed_at"
            )
        ).all()
        assert rows[-1][1] == pytest.approx(252.0)
        assert capacity_repo.capacity_now(conn)["p"][0] == pytest.approx(252.0)
        timeline = capacity_repo.capacity_timeline(conn, "p", NOW)
        assert timeline[-1].value == pytest.approx(252.0)
