"""GetFairShare and GetConfig answer from memory (api/read_cache.py), and every replica serves
what any of them committed: two servers on one database, each with its own engine (as two
processes would be), one writing and one reading."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from sqlalchemy import Engine, event

from gpufair.api.read_cache import DEFAULT_STALENESS_S
from gpufair.api.server import RunningServer, build_server
from gpufair.client import GpufairClient
from gpufair.services.recompute import recompute_pool
from gpufair.store.database import make_engine
from gpufair.v1 import cluster_pb2, scheduler_pb2


def cluster(gpus_per_node: int) -> cluster_pb2.ClusterConfig:
    config = cluster_pb2.ClusterConfig()
    config.gpu_types.add(name="a100", memory_gib=80, compute_weight=10.0)
    pool = config.pools.add(name="default")
    pool.policy.window_s = 7 * 86400.0
    config.nodes.add(name="n1", pool="default", gpu_type="a100", gpu_count=gpus_per_node)
    for name in ("alpha", "beta"):
        queue = config.queues.add(name=name)
        queue.quotas.add(pool="default", deserved_cu=20)
    return config


def serve(engine: Engine, **kwargs: Any) -> tuple[RunningServer, GpufairClient]:
    running = build_server(engine, "127.0.0.1:0", max_workers=4, **kwargs)
    return running, GpufairClient(f"127.0.0.1:{running.port}", attempts=1, timeout_s=20)


@pytest.fixture
def engine_b(database_url: str, db: Engine) -> Iterator[Engine]:
    """A second replica's engine: its own connections and its own count of commits."""
    engine = make_engine(database_url, pool_size=2)
    yield engine
    engine.dispose()


@pytest.fixture
def replicas(db: Engine, engine_b: Engine) -> Iterator[tuple[GpufairClient, GpufairClient]]:
    server_a, a = serve(db)
    server_b, b = serve(engine_b)
    yield a, b
    a.close()
    b.close()
    server_a.stop(0.5)
    server_b.stop(0.5)


def test_a_replica_serves_the_fair_shares_another_committed(
    replicas: tuple[GpufairClient, GpufairClient], db: Engine
) -> None:
    a, b = replicas
    a.apply_config(cluster(8))
    first = b.get_fair_share("default")  # b computes the pool's first run
    assert {q.queue: q.demand_cu for q in first.queues} == {"alpha": 0.0, "beta": 0.0}
    assert b.get_fair_share("default") == first

    a.submit_workloads(
        [scheduler_pb2.Workload(uid="w1", queue="alpha", pool="default", pods=1, gpus_per_pod=4)]
    )
    # The recompute job runs on replica a's side (its engine) and commits.
    computed_at_s = time.time()
    with db.begin() as conn:
        recompute_pool(conn, "default", computed_at_s)
    time.sleep(DEFAULT_STALENESS_S)

    share = b.get_fair_share("default")
    assert {q.queue: q.demand_cu for q in share.queues} == {"alpha": 40.0, "beta": 0.0}
    assert share.computed_at.ToNanoseconds() / 1e9 == pytest.approx(computed_at_s, abs=1e-6)
    assert share.capacity_cu == pytest.approx(80.0)
    assert a.get_fair_share("default") == share


def test_a_replica_serves_the_config_another_applied(
    replicas: tuple[GpufairClient, GpufairClient],
) -> None:
    a, b = replicas
    a.apply_config(cluster(8))
    before = b.get_config()
    assert before.config_version == 1
    assert [n.gpu_count for n in before.config.nodes] == [8]

    assert a.apply_config(cluster(16)).config_version == 2
    time.sleep(DEFAULT_STALENESS_S)
    after = b.get_config()
    assert after.config_version == 2
    assert [n.gpu_count for n in after.config.nodes] == [16]


def test_reads_run_no_query_and_a_replica_reads_its_own_writes_at_once(
    db: Engine, engine_b: Engine
) -> None:
    """With a staleness bound of a minute, repeated reads touch no database; a write through
    the same replica shows in the very next read all the same."""
    running, b = serve(engine_b, read_staleness_s=60.0, health_interval_s=3600.0)
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    try:
        b.apply_config(cluster(8))
        b.get_fair_share("default")  # computes and commits the first run: the next reads check
        b.get_config()
        b.get_fair_share("default")
        event.listen(engine_b, "before_cursor_execute", count)
        checks = running.keys.checks
        for _ in range(100):
            assert b.get_config().config_version == 1
            assert b.get_fair_share("default").capacity_cu == pytest.approx(80.0)
        assert statements == []
        assert running.keys.checks == checks

        b.apply_config(cluster(16))
        assert b.get_config().config_version == 2
        b.submit_workloads(
            [
                scheduler_pb2.Workload(
                    uid=str(uuid.uuid4()), queue="beta", pool="default", pods=1, gpus_per_pod=2
                )
            ]
        )
        with engine_b.begin() as conn:
            recompute_pool(conn, "default", time.time())
        share = b.get_fair_share("default")
        assert share.capacity_cu == pytest.approx(160.0)
        assert {q.queue: q.demand_cu for q in share.queues} == {"alpha": 0.0, "beta": 20.0}
    finally:
        event.remove(engine_b, "before_cursor_execute", count)
        b.close()
        running.stop(0.5)


def test_reads_from_memory_are_answered_while_every_work_slot_is_held(db: Engine) -> None:
    """GetFairShare and GetConfig served from memory take no work slot: with the server's one
    slot held (as by database work), they answer, and a call that needs the database waits
    until its deadline for the slot (api/work_slots.py)."""
    running = build_server(
        db, "127.0.0.1:0", max_workers=1, read_staleness_s=60.0, health_interval_s=3600.0
    )
    address = f"127.0.0.1:{running.port}"
    client = GpufairClient(address, attempts=1, timeout_s=20)
    quick = GpufairClient(address, attempts=1, timeout_s=0.5)
    try:
        client.apply_config(cluster(8))
        client.submit_workloads(
            [scheduler_pb2.Workload(uid="w1", queue="beta", pool="default", pods=1, gpus_per_pod=2)]
        )
        client.get_fair_share("default")  # computes and commits the first run: checks again
        # PostgreSQL's notifications of those commits (this process's own too) reach the count
        # on the listener's connection: one arriving after the reads below would make the next
        # read check the database, which needs the held slot. Wait until the listener's round
        # trip has confirmed past them (all notifications before it arrived), then warm.
        assert running.notices is not None
        committed = time.monotonic()
        give_up = committed + 10.0
        while running.notices.confirmed_at <= committed:
            assert time.monotonic() < give_up, "the listener confirmed nothing within 10 s"
            time.sleep(0.01)
        client.get_config()
        client.get_fair_share("default")
        assert running.slots is not None
        with running.slots.held(None):
            for _ in range(20):
                assert quick.get_fair_share("default").capacity_cu == pytest.approx(80.0)
                assert quick.get_config().config_version == 1
            with pytest.raises(grpc.RpcError) as waited:
                quick.list_workloads()
            assert waited.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # With the slot free again, the listing that needs the database answers: the one workload.
        listed = client.list_workloads()
        assert [
            (s.workload.uid, s.workload.queue, s.workload.gpus_per_pod, s.state) for s in listed
        ] == [("w1", "beta", 2.0, "pending")]
    finally:
        client.close()
        quick.close()
        running.stop(0.5)


def test_only_commits_that_move_a_key_make_the_next_read_check(engine_b: Engine) -> None:
    """Submissions (like reported events and recorded cycles) leave the cached replies current:
    the reads after them run no check. A recompute or a config apply of this replica makes the
    very next read check, and serve what it committed."""
    running, b = serve(engine_b, read_staleness_s=60.0, health_interval_s=3600.0)
    try:
        b.apply_config(cluster(8))
        b.get_fair_share("default")
        b.get_fair_share("default")
        b.get_config()
        checks = running.keys.checks
        for n in range(5):
            b.submit_workloads(
                [
                    scheduler_pb2.Workload(
                        uid=f"w{n}", queue="beta", pool="default", pods=1, gpus_per_pod=2
                    )
                ]
            )
            assert b.get_fair_share("default").capacity_cu == pytest.approx(80.0)
            assert b.get_config().config_version == 1
        assert running.keys.checks == checks

        with engine_b.begin() as conn:
            recompute_pool(conn, "default", time.time())
        share = b.get_fair_share("default")
        assert running.keys.checks == checks + 1
        assert {q.queue: q.demand_cu for q in share.queues} == {"alpha": 0.0, "beta": 100.0}
        b.apply_config(cluster(16))
        assert b.get_config().config_version == 2
        b.get_fair_share("default")  # its key names the config version too
        assert running.keys.checks == checks + 3
    finally:
        b.close()
        running.stop(0.5)


def test_another_replicas_commit_shows_when_its_notification_arrives(
    db: Engine, engine_b: Engine
) -> None:
    """With a staleness bound of a minute, only the notification can tell replica b that a
    committed a new config or a recompute: b serves each within a quarter of a second (the
    notification is counted a median 0.3 ms after the commit), far inside the bound."""
    server_a, a = serve(db, read_staleness_s=60.0, health_interval_s=3600.0)
    server_b, b = serve(engine_b, read_staleness_s=60.0, health_interval_s=3600.0)
    try:
        a.apply_config(cluster(8))
        assert b.get_config().config_version == 1
        assert b.get_fair_share("default").capacity_cu == pytest.approx(80.0)

        assert a.apply_config(cluster(16)).config_version == 2
        shown = time.monotonic()
        while b.get_config().config_version != 2:
            assert time.monotonic() - shown < 0.25
            time.sleep(0.002)

        a.submit_workloads(
            [
                scheduler_pb2.Workload(
                    uid="w1", queue="alpha", pool="default", pods=1, gpus_per_pod=4
                )
            ]
        )
        with db.begin() as conn:
            recompute_pool(conn, "default", time.time())
        shown = time.monotonic()
        while {q.queue: q.demand_cu for q in b.get_fair_share("default").queues}["alpha"] != 40.0:
            assert time.monotonic() - shown < 0.25
            time.sleep(0.002)
        assert b.get_fair_share("default").capacity_cu == pytest.approx(160.0)
    finally:
        a.close()
        b.close()
        server_a.stop(0.5)
        server_b.stop(0.5)


def test_the_notification_of_a_replicas_own_commit_makes_no_second_read(
    db: Engine, engine_b: Engine
) -> None:
    """Replica b's own config apply is read at once, by the one check after it; PostgreSQL's
    notification of that commit, arriving after the check (held back here until then), does
    not make the next read check the database again. Replica a's apply still shows on b as
    soon as its notification arrives."""
    server_a, a = serve(db, read_staleness_s=60.0, health_interval_s=3600.0)
    running, b = serve(engine_b, read_staleness_s=60.0, health_interval_s=3600.0)
    notices = running.notices
    assert notices is not None
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    held = threading.Event()
    heard = notices._heard

    def heard_when_let(*args: Any) -> None:
        held.wait()
        heard(*args)

    try:
        b.apply_config(cluster(8))
        assert b.get_config().config_version == 1
        notices._heard = heard_when_let  # type: ignore[method-assign]
        assert b.apply_config(cluster(16)).config_version == 2
        checks = running.keys.checks
        assert b.get_config().config_version == 2  # its own write, read by one check
        assert running.keys.checks == checks + 1
        let = time.monotonic()
        held.set()
        while notices.confirmed_at <= let:  # every notification before `let` is counted
            time.sleep(0.005)
        event.listen(engine_b, "before_cursor_execute", count)
        for _ in range(10):
            assert b.get_config().config_version == 2
        # keys.checks: the caches' queries (on a connection of their own); statements: the rest.
        assert (statements, running.keys.checks) == ([], checks + 1)
        assert notices.heard >= 2 and notices.own >= 1

        assert a.apply_config(cluster(8)).config_version == 3
        shown = time.monotonic()
        while b.get_config().config_version != 3:
            assert time.monotonic() - shown < 0.25
            time.sleep(0.002)
    finally:
        held.set()
        event.remove(engine_b, "before_cursor_execute", count)
        a.close()
        b.close()
        server_a.stop(0.5)
        running.stop(0.5)
