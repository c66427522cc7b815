"""Rollups on PostgreSQL: decayed usage from hourly moments equals the exact integral over raw
intervals, replays in any order give identical rollups, and late events re-roll what they touch."""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.domain.config_diff import diff_configs
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
from gpufair.domain.usage import UsageInputs
from gpufair.jobs.runner import JobSettings, PeriodicJobs
from gpufair.services.recompute import recompute_pool
from gpufair.store import (
    capacity_repo,
    config_repo,
    ingest_pipeline,
    locks,
    retention_repo,
    rollup_repo,
    workload_repo,
)
from tests.lock_waits import until, waiting_on_locks

NOW = 1_767_225_600.0 + 1234.5  # 2026-01-01 00:20:34.5 UTC: mid-hour on purpose
HOUR = 3600.0


def quota(deserved: float, weight: float = 1.0) -> Mapping[str, QueueQuota]:
    return frozen_map({"p": QueueQuota("p", deserved_cu=deserved, over_quota_weight=weight)})


def make_config(policy: FairSharePolicy) -> ClusterConfig:
    return ClusterConfig(
        gpu_types=(GpuType("a100", 80, 10), GpuType("t4", 16, 1)),
        pools=(NodePool("p", policy=policy),),
        nodes=tuple(Node(f"a{i}", "p", "a100", 8, 64000, 512000) for i in range(4))
        + tuple(Node(f"t{i}", "p", "t4", 4, 32000, 128000) for i in range(4)),
        queues=(
            Queue("dept", None, quota(200, 2)),
            Queue("a", "dept", quota(80)),
            Queue("b", "dept", quota(60, 3)),
            Queue("c", None, quota(50)),
        ),
    )


def install(conn: Connection, config: ClusterConfig, at_s: float) -> None:
    changes = diff_configs(config_repo.load_config(conn), config)
    config_repo.apply_changes(conn, config, changes)
    config_repo.record_version(conn, changes)
    capacity_repo.record_if_changed(conn, at_s, "config")


def random_history(
    rng: random.Random, runs: int, span_s: float
) -> tuple[list[Workload], list[LedgerEvent]]:
    """Runs of leaf workloads over [NOW - span_s, NOW], some still open at NOW."""
    workloads, events = [], []
    for n in range(runs):
        queue = rng.choice(["a", "b", "c"])
        uid = f"w{n}"
        workloads.append(
            Workload(uid, queue, "p", pods=1, gpus_per_pod=1, submit_time_s=NOW - span_s)
        )
        start = NOW - rng.uniform(0, span_s)
        node = rng.choice(["a0", "a1", "a2", "a3", "t0", "t1", "t2", "t3"])
        gpus = rng.randint(1, 4)
        pods = (EventPod(node, tuple(range(gpus))),)
        events.append(
            LedgerEvent(
                str(uuid.UUID(int=rng.getrandbits(128))), EventKind.STARTED, start, uid, pods
            )
        )
        if rng.random() < 0.8:
            end = min(NOW - 1, start + rng.expovariate(1 / (5 * HOUR)))
            events.append(
                LedgerEvent(str(uuid.UUID(int=rng.getrandbits(128))), EventKind.STOPPED, end, uid)
            )
    return workloads, events


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    with db.connect() as connection:
        yield connection
        connection.rollback()


def assert_close(got: UsageInputs, want: UsageInputs, rel: float = 1e-6) -> None:
    for q in set(got.usage_cu_s) | set(want.usage_cu_s):
        g, w = got.usage_cu_s.get(q, 0.0), want.usage_cu_s.get(q, 0.0)
        assert g == pytest.approx(w, rel=rel, abs=1e-6), q
    for grp in set(got.group_capacity_cu_s) | set(want.group_capacity_cu_s):
        g, w = got.group_capacity_cu_s.get(grp, 0.0), want.group_capacity_cu_s.get(grp, 0.0)
        assert g == pytest.approx(w, rel=rel, abs=1e-6), grp


POLICIES = {
    "sliding-2d-halflife-6h": FairSharePolicy(window_s=2 * 86400, half_life_s=6 * HOUR),
    "sliding-1d-no-decay": FairSharePolicy(window_s=86400),
    "tumbling-1d": FairSharePolicy(
        window_kind=WindowKind.TUMBLING,
        window_s=86400,
        window_anchor_unix_s=0,
        half_life_s=12 * HOUR,
    ),
    "all-history-halflife-1d": FairSharePolicy(window_kind=WindowKind.NONE, half_life_s=86400),
}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_usage_from_rollups_equals_exact_integral(conn: Connection, name: str) -> None:
    config = make_config(POLICIES[name])
    install(conn, config, NOW - 4 * 86400)
    workloads, events = random_history(random.Random(7), 300, 3 * 86400)
    workload_repo.submit(conn, workloads)
    outcomes = ingest_pipeline.ingest(conn, events, NOW)
    assert {o.status for o in outcomes} == {ingest_pipeline.EventStatus.STORED}
    pool = config.pools[0]
    written = rollup_repo.rollup_pool(conn, config, pool, NOW)
    assert written == 4 * 24  # every hour since the first run, up to the last complete one
    exact = rollup_repo.exact_usage(conn, config, pool, NOW)
    assert exact.usage_cu_s["a"] > 0 and exact.group_capacity_cu_s[None] > 0
    assert_close(rollup_repo.decayed_usage(conn, config, pool, NOW), exact)
    # 50 minutes later without a new rollup: more comes from the raw edge, same answer.
    later = NOW + 3000
    assert_close(
        rollup_repo.decayed_usage(conn, config, pool, later),
        rollup_repo.exact_usage(conn, config, pool, later),
    )


def snapshot(conn: Connection) -> list[tuple[object, ...]]:
    rows = conn.execute(
        text(
            "SELECT pool, queue, gpu_type, extract(epoch FROM bucket_start), "
            "round(gpu_seconds::numeric, 6), round(cu_seconds::numeric, 6), "
            "round(over_quota_cu_seconds::numeric, 6) FROM usage_hourly ORDER BY 1, 2, 3, 4"
        )
    ).all()
    rows += conn.execute(
        text(
            "SELECT pool, queue, '', extract(epoch FROM bucket_start), "
            "round(usage_moment::numeric, 6), round(group_capacity_moment::numeric, 6), 0 "
            "FROM fairness_hourly ORDER BY 1, 2, 4"
        )
    ).all()
    return [tuple(r) for r in rows]


def test_replaying_10000_events_shuffled_gives_identical_rollups(conn: Connection) -> None:
    config = make_config(POLICIES["sliding-2d-halflife-6h"])
    install(conn, config, NOW - 4 * 86400)
    rng = random.Random(11)
    workloads, events = random_history(rng, 5600, 3 * 86400)
    events = events[:10_000]
    assert len(events) == 10_000
    workload_repo.submit(conn, workloads)
    pool = config.pools[0]

    results = []
    for order in range(2):
        shuffled = events[:]
        random.Random(order).shuffle(shuffled)
        for i in range(0, len(shuffled), 2500):
            ingest_pipeline.ingest(conn, shuffled[i : i + 2500], NOW)
        if order == 1:  # a replay of everything on top changes nothing
            replay = ingest_pipeline.ingest(conn, events, NOW)
            assert {o.status for o in replay} == {ingest_pipeline.EventStatus.DUPLICATE}
        rollup_repo.rollup_pool(conn, config, pool, NOW)
        usage = rollup_repo.decayed_usage(conn, config, pool, NOW)
        results.append((snapshot(conn), usage))
        conn.execute(
            text(
                "TRUNCATE ledger_events, allocation_intervals, usage_hourly, fairness_hourly, rollup_watermarks"
            )
        )
        conn.execute(text("UPDATE workloads SET state = 'pending'"))
    (rows_a, usage_a), (rows_b, usage_b) = results
    assert len(rows_a) > 500  # 3 queues x 2 types x 72 hours, and the fairness moments
    assert rows_a == rows_b
    assert_close(usage_a, usage_b, rel=1e-12)


def test_late_stop_rerolls_only_from_its_end(conn: Connection) -> None:
    config = make_config(replace(POLICIES["sliding-1d-no-decay"]))
    install(conn, config, NOW - 2 * 86400)
    pool = config.pools[0]
    workload_repo.submit(conn, [Workload("long", "c", "p", 1, 1, NOW - 86400)])
    start = LedgerEvent(
        str(uuid.uuid4()), EventKind.STARTED, NOW - 20 * HOUR, "long", (EventPod("a0", (0, 1)),)
    )
    ingest_pipeline.ingest(conn, [start], NOW)
    rollup_repo.rollup_pool(conn, config, pool, NOW)
    # Open run: 2 A100 = 20 CU for 20 h, minus deserved 50 -> no over-quota usage; 20 CU x 20 h total.
    used = conn.execute(text("SELECT sum(cu_seconds) FROM usage_hourly")).scalar_one()
    assert used == pytest.approx(20 * 20 * HOUR - 20 * (NOW % HOUR), rel=1e-9)

    stop = LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, NOW - 10 * HOUR, "long")
    ingest_pipeline.ingest(conn, [stop], NOW)
    marks = "SELECT count(*), extract(epoch FROM min(dirty_from)) FROM rollup_dirty_marks"
    count, dirty = conn.execute(text(marks)).one()
    assert count == 1 and float(dirty) == pytest.approx(NOW - 10 * HOUR, abs=1e-3)
    # 10 hours redone (from the stop's hour), not the run's 20, and the mark is gone.
    assert rollup_repo.rollup_pool(conn, config, pool, NOW) == 10
    assert conn.execute(text(marks)).one() == (0, None)
    used = conn.execute(text("SELECT sum(cu_seconds) FROM usage_hourly")).scalar_one()
    assert used == pytest.approx(20 * 10 * HOUR, rel=1e-9)


def test_retention_drops_the_dirty_marks_of_removed_pools_only(conn: Connection) -> None:
    """Rollups take the marks of configured pools; marks of a pool no longer configured would
    stay forever: retention deletes those 2 and keeps pool p's 2, however old (one 500 days old,
    one from the capacity its config recorded)."""
    install(conn, make_config(POLICIES["sliding-1d-no-decay"]), NOW - 86400)
    conn.execute(
        text(
            "INSERT INTO rollup_dirty_marks (pool, dirty_from) VALUES "
            "('gone', to_timestamp(:now)), ('gone', to_timestamp(:now)), "
            "('p', to_timestamp(:now) - interval '500 days')"
        ),
        {"now": NOW},
    )
    deleted = retention_repo.apply_retention(conn, NOW, retention_repo.Retention())
    assert deleted["dirty_marks"] == 2
    left = conn.execute(text("SELECT pool, count(*) FROM rollup_dirty_marks GROUP BY pool"))
    assert [tuple(r) for r in left] == [("p", 2)]


def test_concurrent_rollups_of_one_pool_never_collide(db: Engine) -> None:
    """The periodic rollup, recomputes and Schedule calls may roll one pool up at the same time:
    each round starts 4 writers together on buckets none has written; none may fail, and the
    buckets are those one writer alone makes."""

    config = make_config(POLICIES["sliding-2d-halflife-6h"])
    pool = config.pools[0]
    with db.begin() as conn:
        install(conn, config, NOW - 2 * 86400)
        workloads, events = random_history(random.Random(11), 120, 1.5 * 86400)
        workload_repo.submit(conn, workloads)
        ingest_pipeline.ingest(conn, events, NOW)
    with db.begin() as conn:
        rollup_repo.rollup_pool(conn, config, pool, NOW)
        alone = snapshot(conn)
    assert len(alone) > 100

    errors: list[BaseException] = []
    written: list[int] = []
    for _ in range(5):
        with db.begin() as conn:  # forget every bucket: the next writers all start from scratch
            conn.execute(text("DELETE FROM rollup_watermarks"))
            conn.execute(text("DELETE FROM fairness_hourly"))
            conn.execute(text("DELETE FROM usage_hourly"))
        barrier = threading.Barrier(4)

        def writer(barrier: threading.Barrier = barrier) -> None:
            try:
                with db.begin() as conn:
                    barrier.wait(timeout=10)
                    written.append(rollup_repo.rollup_pool(conn, config, pool, NOW))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=writer) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert errors == []
        with db.connect() as conn:
            assert snapshot(conn) == alone
    # In each round exactly one writer did the work; the other three found it done.
    assert sorted(written) == [0] * 15 + [2 * 24] * 5


def _first_rollup_race_setup(db: Engine) -> tuple[ClusterConfig, list[LedgerEvent]]:
    """Pool `p` with one run of 2 A100 (20 CU) over [NOW-10h, NOW-8h), never rolled up (no
    watermark row). Returns the config and a late run of 8 A100 (80 CU) over [NOW-5h, NOW-3h)."""
    config = make_config(POLICIES["sliding-1d-no-decay"])
    with db.begin() as conn:
        install(conn, config, NOW - 2 * 86400)
        workload_repo.submit(
            conn,
            [Workload(u, "c", "p", 1, 1, NOW - 86400) for u in ("early", "late")],
        )
        ingest_pipeline.ingest(
            conn,
            [
                LedgerEvent(
                    str(uuid.uuid4()),
                    EventKind.STARTED,
                    NOW - 10 * HOUR,
                    "early",
                    (EventPod("a0", (0, 1)),),
                ),
                LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, NOW - 8 * HOUR, "early"),
            ],
            NOW,
        )
        assert conn.execute(text("SELECT count(*) FROM rollup_watermarks")).scalar_one() == 0
    late = [
        LedgerEvent(
            str(uuid.uuid4()),
            EventKind.STARTED,
            NOW - 5 * HOUR,
            "late",
            (EventPod("a1", tuple(range(8))),),
        ),
        LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, NOW - 3 * HOUR, "late"),
    ]
    return config, late


def _assert_late_run_counted(db: Engine, config: ClusterConfig) -> None:
    """After one more rollup at the same instant: 2 x 2 + 8 x 2 = 20 GPU-hours and 20 CU x 2 h
    + 80 CU x 2 h = 200 CU-hours rolled up, and queue c's decayed usage (no decay, over its
    deserved 50 CU) (80 - 50) CU x 2 h = 60 CU-hours, as the raw intervals say. With the late
    run missed: 4 GPU-hours, 40 CU-hours and no usage."""
    pool = config.pools[0]
    with db.begin() as conn:
        rollup_repo.rollup_pool(conn, config, pool, NOW)
        gpu_s, cu_s = conn.execute(
            text("SELECT sum(gpu_seconds), sum(cu_seconds) FROM usage_hourly")
        ).one()
        assert (gpu_s / HOUR, cu_s / HOUR) == pytest.approx((20.0, 200.0), rel=1e-9)
        usage = rollup_repo.decayed_usage(conn, config, pool, NOW)
        assert usage.usage_cu_s.get("c", 0.0) / HOUR == pytest.approx(60.0, rel=1e-9)
        assert_close(usage, rollup_repo.exact_usage(conn, config, pool, NOW))


def test_late_run_ingested_during_a_pools_first_rollup_is_counted(db: Engine) -> None:
    """The first rollup of a pool has read the runs and waits to write its buckets (a table lock
    held here); meanwhile a late run is ingested, without waiting for the rollup. Its usage must
    be counted by the next rollup: without a watermark row to mark, it was lost (BASE: 4
    GPU-hours instead of 20)."""
    config, late = _first_rollup_race_setup(db)
    pool = config.pools[0]
    errors: list[BaseException] = []

    def rollup() -> None:
        try:
            with db.begin() as conn:
                # Every hour since the capacity recorded at NOW - 2 d.
                assert rollup_repo.rollup_pool(conn, config, pool, NOW) == 48
        except BaseException as exc:
            errors.append(exc)

    def ingest() -> None:
        try:
            with db.begin() as conn:
                ingest_pipeline.ingest(conn, late, NOW)
        except BaseException as exc:
            errors.append(exc)

    with db.connect() as holder:
        # The rollup's first write is the DELETE of its buckets: it waits for this lock, after
        # having read the runs.
        holder.execute(text("LOCK TABLE fairness_hourly IN EXCLUSIVE MODE"))
        rolling = threading.Thread(target=rollup)
        rolling.start()
        until(lambda: waiting_on_locks(db) == 1, "the rollup never reached its writes")
        ingesting = threading.Thread(target=ingest)
        ingesting.start()
        # The ingest ends while the rollup still waits: ingests never wait for rollups.
        until(lambda: not ingesting.is_alive(), "the ingest waited for the rollup")
        assert rolling.is_alive()
        holder.rollback()
    rolling.join(timeout=30)
    ingesting.join(timeout=30)
    assert errors == []
    _assert_late_run_counted(db, config)


def _rollup_during_uncommitted_ingest(
    db: Engine, config: ClusterConfig, late: list[LedgerEvent]
) -> None:
    """Ingest `late` on one connection and, before it commits, roll the pool up at NOW on
    another: the rollup must finish without waiting for the ingest, which then commits."""
    pool = config.pools[0]
    errors: list[BaseException] = []

    def rollup() -> None:
        try:
            with db.begin() as conn:
                rollup_repo.rollup_pool(conn, config, pool, NOW)
        except BaseException as exc:
            errors.append(exc)

    with db.connect() as ingesting:
        ingest_pipeline.ingest(ingesting, late, NOW)
        rolling = threading.Thread(target=rollup)
        rolling.start()
        rolling.join(timeout=30)
        assert not rolling.is_alive(), "the rollup waited for the ingest"
        ingesting.commit()
    assert errors == []


def test_late_run_in_flight_during_a_pools_first_rollup_is_counted(db: Engine) -> None:
    """The other order: an ingest of a late run has written but not committed when the pool's
    first rollup runs. The rollup cannot see that run and does not wait for it; the next
    rollup must count it (BASE: the first wrote its watermark past the late run, which was
    never counted: 4 GPU-hours instead of 20)."""
    config, late = _first_rollup_race_setup(db)
    _rollup_during_uncommitted_ingest(db, config, late)
    _assert_late_run_counted(db, config)


def test_late_run_in_flight_at_an_hour_boundary_is_counted(db: Engine) -> None:
    """Not only a first rollup: the pool is rolled up to floor(NOW - 6 h) (the early run's 4
    GPU-hours), then a run over [NOW-5h, NOW-3h), after that watermark, is ingested and left
    uncommitted while the pool is rolled up to NOW. At BASE its ingest found
    nothing to mark (its change lay after the watermark of the moment) and the rollup, which could
    not see it, moved the watermark past it: 4 GPU-hours rolled up instead of 20."""
    config, late = _first_rollup_race_setup(db)
    pool = config.pools[0]
    with db.begin() as conn:
        # Every hour since the capacity recorded at NOW - 2 d, up to floor(NOW - 6 h).
        assert rollup_repo.rollup_pool(conn, config, pool, NOW - 6 * HOUR) == 42
        gpu_s = conn.execute(text("SELECT sum(gpu_seconds) FROM usage_hourly")).scalar_one()
        assert gpu_s / HOUR == pytest.approx(4.0, rel=1e-9)
    _rollup_during_uncommitted_ingest(db, config, late)
    _assert_late_run_counted(db, config)


def _rollup_in_job(db: Engine) -> None:
    jobs = PeriodicJobs(db, JobSettings(), clock=lambda: NOW, replica="test")
    try:
        jobs._rollup(NOW)
    finally:
        jobs.stop()


def _rollup_in_recompute(db: Engine) -> None:
    with db.begin() as conn:
        recompute_pool(conn, "p", NOW)


@pytest.mark.parametrize("roll", [_rollup_in_job, _rollup_in_recompute], ids=["job", "recompute"])
def test_config_applied_while_a_rollup_waits_is_rolled_up_again(
    db: Engine, roll: Callable[[Engine], None]
) -> None:
    """A rollup (the periodic job's, or a recompute's) has read the config and waits for the
    pool's rollup lock (held here) while an ApplyConfig raises queue c's deserved CU from 50 to
    70 and commits. The rollup counts with the config it read; the next rollup, with the new
    one, must redo the buckets: queue c's run of 80 CU for 2 h is then 10 CU over its quota,
    20 CU-hours of over-quota and decayed usage. At BASE the first stamped its buckets with the
    version it read after the lock, the new one, so they were never redone: 60 CU-hours."""
    config, late = _first_rollup_race_setup(db)
    with db.begin() as conn:
        ingest_pipeline.ingest(conn, late, NOW)
    raised = replace(
        config,
        queues=tuple(replace(q, quotas=quota(70)) if q.name == "c" else q for q in config.queues),
    )
    errors: list[BaseException] = []

    def rollup() -> None:
        try:
            roll(db)
        except BaseException as exc:
            errors.append(exc)

    with db.connect() as holder:
        locks.xact_lock(holder, locks.rollup_key("p"))
        rolling = threading.Thread(target=rollup)
        rolling.start()
        until(lambda: waiting_on_locks(db) == 1, "the rollup never reached the pool's lock")
        with db.begin() as conn:
            install(conn, raised, NOW)
        holder.rollback()
    rolling.join(timeout=30)
    assert errors == []
    pool = raised.pools[0]
    with db.begin() as conn:
        stored = config_repo.load_config(conn)
        assert {q.name: q.quota("p").deserved_cu for q in stored.queues}["c"] == 70
        rollup_repo.rollup_pool(conn, stored, pool, NOW)
        over_s = conn.execute(
            text("SELECT sum(over_quota_cu_seconds) FROM usage_hourly WHERE queue = 'c'")
        ).scalar_one()
        assert over_s / HOUR == pytest.approx(20.0, rel=1e-9)
        usage = rollup_repo.decayed_usage(conn, stored, pool, NOW)
        assert usage.usage_cu_s.get("c", 0.0) / HOUR == pytest.approx(20.0, rel=1e-9)
        assert_close(usage, rollup_repo.exact_usage(conn, stored, pool, NOW))


def with_history(conn: Connection, *, seed: int, runs: int) -> ClusterConfig:
    """The config of a 2-day window with a 6 h half-life, installed 4 days before NOW, and
    `runs` random runs over the 3 days before NOW, ingested."""
    config = make_config(POLICIES["sliding-2d-halflife-6h"])
    install(conn, config, NOW - 4 * 86400)
    workloads, events = random_history(random.Random(seed), runs, 3 * 86400)
    workload_repo.submit(conn, workloads)
    outcomes = ingest_pipeline.ingest(conn, events, NOW)
    assert {o.status for o in outcomes} == {ingest_pipeline.EventStatus.STORED}
    return config


def test_a_node_or_budget_change_redoes_no_history_and_a_quota_change_redoes_the_window(
    conn: Connection,
) -> None:
    """A batch system drains and resumes nodes all day, each a new config version. Buckets are
    made of the runs, the queues, the GPU types' weights and the capacity; a node's change
    reaches them only through the capacity, whose change leaves a dirty mark from its instant.
    So a version that changed only nodes or budgets must not redo the pool's history (it did:
    every bucket since the first run), while a quota's change redoes what the 2-day window reads
    (it redid all 4 days; `test_rollup_quota_change.py` holds the rest)."""
    config = with_history(conn, seed=5, runs=300)
    pool = config.pools[0]
    assert rollup_repo.rollup_pool(conn, config, pool, NOW) == 4 * 24
    rolled = snapshot(conn)

    drained = replace(
        config,
        nodes=tuple(replace(n, ready=False) if n.name == "a0" else n for n in config.nodes),
    )
    with_budget = replace(drained, budgets=(Budget("a", BudgetPeriod.WEEK, 500.0, "p"),))
    for changed in (drained, with_budget):
        install(conn, changed, NOW)
        # The drain lowers the capacity from NOW: the hour of NOW is not rolled up yet.
        assert rollup_repo.rollup_pool(conn, changed, pool, NOW) == 0
        assert snapshot(conn) == rolled
    # What the skipped redo would have written is what is there.
    conn.execute(text("DELETE FROM rollup_watermarks"))
    assert rollup_repo.rollup_pool(conn, with_budget, pool, NOW) == 4 * 24
    assert snapshot(conn) == rolled

    raised = replace(
        with_budget,
        queues=tuple(replace(q, quotas=quota(70)) if q.name == "c" else q for q in config.queues),
    )
    install(conn, raised, NOW)
    assert rollup_repo.rollup_pool(conn, raised, pool, NOW) == 2 * 24
    now_rows = snapshot(conn)
    assert now_rows != rolled  # queue c's over-quota usage counted against 70 CU now
    # The buckets before the window's first hour keep what the old quota made of them.
    assert rows_before(rolled, NOW - 1234.5 - 2 * 86400)
    assert rows_before(now_rows, NOW - 1234.5 - 2 * 86400) == rows_before(
        rolled, NOW - 1234.5 - 2 * 86400
    )


def rows_before(rows: list[tuple[object, ...]], at_s: float) -> list[tuple[object, ...]]:
    """The rows of `snapshot` whose bucket starts before `at_s`."""
    return [r for r in rows if float(str(r[3])) < at_s]


def test_a_redo_in_spans_writes_the_rows_of_one_piece(
    conn: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long history is rolled up in spans of `REDO_SPAN_S` (one jsonb value per span, well
    under PostgreSQL's 256 MB, and no minutes of Python between two statements). Runs cross the
    spans' edges; the rows must be those of the history rolled up in one piece."""
    config = with_history(conn, seed=9, runs=400)
    pool = config.pools[0]
    assert rollup_repo.REDO_SPAN_S >= 4 * 86400  # this history is one span by default
    assert rollup_repo.rollup_pool(conn, config, pool, NOW) == 4 * 24
    whole = snapshot(conn)
    whole_usage = rollup_repo.decayed_usage(conn, config, pool, NOW)
    assert len(whole) > 500

    monkeypatch.setattr(rollup_repo, "REDO_SPAN_S", 5 * HOUR)  # 96 hours in 20 spans
    conn.execute(text("DELETE FROM rollup_watermarks"))
    conn.execute(text("DELETE FROM usage_hourly"))
    conn.execute(text("DELETE FROM fairness_hourly"))
    assert rollup_repo.rollup_pool(conn, config, pool, NOW) == 4 * 24
    assert snapshot(conn) == whole
    assert_close(rollup_repo.decayed_usage(conn, config, pool, NOW), whole_usage, rel=1e-12)
