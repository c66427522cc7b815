"""Retention against a rollup in flight, on PostgreSQL.

A rollup reads its pool's retention horizon, then the runs it makes its buckets of. Retention
records a new horizon, then deletes the runs that ended before it and the buckets before it. A
rollup that read the old horizon and read the runs after retention deleted them wrote the
buckets between the two horizons from what outlived retention: less than what ran, and after
retention's delete of buckets, so they stayed, and the `report` views showed them until the next
retention. Retention now takes and at once releases each pool's rollup lock (one at a time)
after recording the horizons and before deleting anything: a rollup holding it commits first,
with every run still there, and a rollup that takes it later reads the new horizon.

Pool `decay` (7-day window, 1-day half-life) of `test_retention_per_pool.py`: a 2-hour run of 4
A100 starting each of the 30 days before NOW, rolled up at NOW; retention at NOW (3 days, held
by the window) keeps from the hour 7 days and 1 hour before NOW (`READER_LAG_S`). At LATER, two
days on, a late run of queue b (8 GPUs, 80 CU, an hour from 6 days before NOW + 4 h) is
ingested, and a rollup redoes from its hour; retention at LATER keeps from the hour 5 days and 1
hour before NOW.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.domain.model import ClusterConfig, NodePool, Workload
from gpufair.domain.retention_horizon import READER_LAG_S
from gpufair.domain.rollup import TypedInterval, floor_hour
from gpufair.store import ingest_pipeline, rollup_repo, workload_repo
from gpufair.store.retention_repo import Retention, apply_retention
from tests.lock_waits import until, waiting_on_locks
from tests.store.test_retention_per_pool import DECAYING, cluster, history
from tests.store.test_rollups import HOUR, NOW, assert_close

DAY = 86400.0
LATER = NOW + 2 * DAY
KEPT = Retention(rollups_days=3)
LATE_START = NOW - 6 * DAY + 4 * HOUR


def _setup(db: Engine) -> ClusterConfig:
    """The history, retention at NOW, and the late run ingested at LATER (not rolled up)."""
    config = cluster({"decay": DECAYING})
    with db.connect() as conn:
        history(conn, config, NOW)
        apply_retention(conn, NOW, KEPT)  # commits
        workload_repo.submit(conn, [Workload("late", "b", "decay", 1, 8, LATE_START - 60)])
        pods = (EventPod("decay-n0", tuple(range(8))),)
        events = [
            LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, LATE_START, "late", pods),
            LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, LATE_START + HOUR, "late"),
        ]
        outcomes = ingest_pipeline.ingest(conn, events, LATER)
        assert {o.status for o in outcomes} == {ingest_pipeline.EventStatus.STORED}
        conn.commit()
    return config


def _horizon(db: Engine) -> float:
    with db.connect() as conn:
        return float(
            conn.execute(
                text(
                    "SELECT extract(epoch FROM kept_from)::float8 FROM retention_horizons "
                    "WHERE pool = 'decay'"
                )
            ).scalar_one()
        )


def _buckets_before(db: Engine, at_s: float) -> dict[str, int]:
    with db.connect() as conn:
        return {
            table: int(
                conn.execute(
                    text(
                        f"SELECT count(*) FROM {table} "
                        "WHERE pool = 'decay' AND bucket_start < to_timestamp(:at)"
                    ),
                    {"at": at_s},
                ).scalar_one()
            )
            for table in ("fairness_hourly", "usage_hourly")
        }


def _parked_at_the_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[threading.Event, threading.Event]:
    """The first read of runs by a rollup (after it read the horizon) waits for `go`, once it
    has set `parked`."""
    parked, go = threading.Event(), threading.Event()
    read = rollup_repo.intervals_between

    def parked_read(conn: Connection, pool: str, lo_s: float, hi_s: float) -> list[TypedInterval]:
        if not parked.is_set():
            parked.set()
            assert go.wait(timeout=30), "never let go"
        return read(conn, pool, lo_s, hi_s)

    monkeypatch.setattr(rollup_repo, "intervals_between", parked_read)
    return parked, go


def _in_thread(work: Callable[[], object], errors: list[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            work()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _race(
    db: Engine,
    monkeypatch: pytest.MonkeyPatch,
    roll: Callable[[Connection], object],
) -> bool:
    """`roll` in a transaction of its own, parked at its first read of runs, while retention
    runs at LATER; the rollup goes on once retention has finished or waits for a lock.
    Returns whether retention was waiting then."""
    parked, go = _parked_at_the_runs(monkeypatch)
    errors: list[BaseException] = []

    def rollup() -> None:
        with db.begin() as conn:
            roll(conn)

    def retention() -> None:
        with db.connect() as conn:
            apply_retention(conn, LATER, KEPT)
            conn.commit()

    rolling = _in_thread(rollup, errors)
    assert parked.wait(timeout=30), "the rollup never read the runs"
    retaining = _in_thread(retention, errors)
    until(
        lambda: not retaining.is_alive() or waiting_on_locks(db, "advisory") == 1,
        "retention neither finished nor waited",
    )
    waited = retaining.is_alive()
    go.set()
    rolling.join(timeout=30)
    retaining.join(timeout=30)
    assert errors == []
    return waited


def _assert_nothing_before_the_horizon(db: Engine, config: ClusterConfig) -> None:
    """Retention at LATER recorded the hour 5 days and 1 hour before NOW; no bucket lies before
    it, and the decayed usage at LATER is the exact integral of the runs."""
    horizon = _horizon(db)
    assert horizon == floor_hour(LATER - READER_LAG_S - 7 * DAY)
    assert _buckets_before(db, horizon) == {"fairness_hourly": 0, "usage_hourly": 0}
    with db.begin() as conn:
        pool = config.pools[0]
        assert rollup_repo.rollup_pool(conn, config, pool, LATER) == 0
        assert_close(
            rollup_repo.decayed_usage(conn, config, pool, LATER),
            rollup_repo.exact_usage(conn, config, pool, LATER),
            rel=1e-9,
        )


def test_a_rollup_that_read_the_old_horizon_writes_nothing_before_the_new_one(
    db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rollup at LATER redoes from the late run's hour (after the old horizon): it has read
    the old horizon and waits to read the runs while retention at LATER records the new one.
    Before, retention deleted the runs of days 6 and 7 and the late run and every bucket before
    its horizon, and the rollup then wrote the hours from the late run's to the horizon again
    without them: a fairness row an hour of the pool's capacity and no usage (the late run's 80
    CU-hours gone), left after retention's delete. Now retention waits for the rollup, which
    writes its buckets from every run, then deletes them with the rest."""
    config = _setup(db)
    pool: NodePool = config.pools[0]

    def roll(conn: Connection) -> None:
        assert rollup_repo.rollup_pool(conn, config, pool, LATER) == round(
            (floor_hour(LATER) - floor_hour(LATE_START)) / HOUR
        )

    waited = _race(db, monkeypatch, roll)
    _assert_nothing_before_the_horizon(db, config)
    assert waited, "retention deleted while a rollup that read the old horizon was in flight"


def test_a_job_holding_several_pools_rollup_locks_does_not_deadlock_with_retention(
    db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The periodic rollup rolls every pool up in one transaction, taking each pool's lock in
    turn and holding them all to its commit. Parked in its second pool (`decay`) after taking
    the first's (`other`, whose rollup wrote nothing), it holds both while retention waits for
    one of them; retention holds none while it waits, so both finish, and nothing lies before
    the new horizon."""
    config = _setup(db)
    both = cluster({"other": DECAYING, "decay": DECAYING})
    order: Sequence[NodePool] = both.pools
    assert [p.name for p in order] == ["other", "decay"]

    def roll(conn: Connection) -> None:
        for pool in order:
            rollup_repo.rollup_pool(conn, both, pool, LATER)

    _race(db, monkeypatch, roll)
    _assert_nothing_before_the_horizon(db, config)


def test_retention_waits_for_a_rollup_longer_than_the_connection_lock_timeout(
    db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A redo of a long history holds its pool's rollup lock for minutes, past the engine's
    lock timeout (10 s). Retention's wait for it has a timeout of its own (`ROLLUP_WAIT_S`):
    with the connection's lock timeout at 0.3 s and the rollup parked for 1.5 s, retention
    waits, then deletes as it would. Before, it failed (lock timeout) having deleted nothing."""
    config = _setup(db)
    pool: NodePool = config.pools[0]
    parked, go = _parked_at_the_runs(monkeypatch)
    errors: list[BaseException] = []

    def rollup() -> None:
        with db.begin() as conn:
            rollup_repo.rollup_pool(conn, config, pool, LATER)

    def retention() -> None:
        with db.connect() as conn:
            conn.execute(text("SET lock_timeout = 300"))
            conn.commit()
            apply_retention(conn, LATER, KEPT)
            conn.commit()

    rolling = _in_thread(rollup, errors)
    assert parked.wait(timeout=30), "the rollup never read the runs"
    retaining = _in_thread(retention, errors)
    until(lambda: waiting_on_locks(db, "advisory") == 1, "retention never waited")
    threading.Timer(1.5, go.set).start()
    rolling.join(timeout=30)
    retaining.join(timeout=30)
    assert errors == []
    _assert_nothing_before_the_horizon(db, config)
