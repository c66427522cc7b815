"""The snapshot a servicer keeps between cycles (`services/snapshot_source.py`) is exactly what a
fresh read gives, after every kind of change: submissions, binds, started and stopped events,
cancellations, config changes, a cycle run by another replica, direct SQL writes, a deleted
interval, expired binds released by a dry run that rolls back, and a TRUNCATE. After each step
the kept rows are compared with `schedule_repo.holding_and_pending` (the full read, another
statement) and the whole cycle input with one built without kept state, and the cycle run over
the kept input with the records its last cycle loaded (`SnapshotSource.carried`) with the cycle
over the fresh input without them; and it is checked that only the changed rows were read
again."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from gpufair.api.server import RunningServer, build_server
from gpufair.client import GpufairClient
from gpufair.domain.cycle import run_cycle
from gpufair.domain.stored_limits import within_limits
from gpufair.services import schedule
from gpufair.services.snapshot_source import SnapshotSource
from gpufair.store import config_repo, fairshare_repo, schedule_repo
from gpufair.store.database import make_engine
from gpufair.v1 import scheduler_pb2
from tests.api.ledger_support import STARTED, STOPPED, cluster, event, report
from tests.conftest import truncate_all
from tests.serve_support import ServeProcess


def wl(uid: str, queue: str = "llm", pods: int = 1, gpus: float = 1) -> scheduler_pb2.Workload:
    return scheduler_pb2.Workload(uid=uid, queue=queue, pool="main", pods=pods, gpus_per_pod=gpus)


def rows_read(source: SnapshotSource) -> int:
    return source.rows.stats("main")[1]


def keys_read(source: SnapshotSource) -> int:
    return source.rows.stats("main")[2]


def check(engine: Engine, source: SnapshotSource, *, configured: bool = True) -> int:
    """Compare the kept snapshot with a fresh one in one transaction; returns how many full
    rows the kept one read for it."""
    before = rows_read(source)
    now_s = time.time()
    with engine.connect() as conn:
        kept = source.holding_and_pending(conn, "main")
        fresh = schedule_repo.holding_and_pending(conn, "main")
        assert kept == (tuple(fresh[0]), tuple(fresh[1]))
        if not configured:
            conn.rollback()
            return rows_read(source) - before
        assert source.config(conn) == within_limits(config_repo.load_config(conn))[0]
        assert source.latest_run(conn, "main") == fairshare_repo.latest_run(conn, "main")
        with_kept, _ = schedule.build_snapshot(conn, "main", now_s, source)
        without, _ = schedule.build_snapshot(conn, "main", now_s)
        assert with_kept == without
        # The cycle over the kept rows, given the records the pool's last cycle here loaded
        # (as `schedule.decide` gives them), decides as a cycle over the fresh read without.
        carried = source.carried("main")
        assert run_cycle(with_kept, carried) == run_cycle(without)
        conn.rollback()
    return rows_read(source) - before


@pytest.fixture
def replica(database_url: str, db: Engine) -> Iterator[RunningServer]:
    """Another replica: its own engine and server, so its own kept state."""
    other = make_engine(database_url, pool_size=2)
    running = build_server(other, "127.0.0.1:0", max_workers=4)
    yield running
    running.stop(1.0)
    other.dispose()


def test_kept_snapshot_equals_a_fresh_read_after_each_change(
    client: GpufairClient, db: Engine, replica: RunningServer
) -> None:
    source = SnapshotSource()
    client.apply_config(cluster())
    client.submit_workloads([wl(f"w{i}") for i in range(6)] + [wl("big", pods=2, gpus=8)])
    assert check(db, source) == 7  # the first read takes every row
    assert check(db, source) == 0  # nothing changed: nothing read
    assert source.config_loads == 1
    assert source.carried("main").reused == 7  # the same rows: every record loaded again

    # A cycle binds: the bound rows are a new group, read whole; the submission's group lost
    # rows, so its remaining ones are named by key (they are the versions already held).
    first = client.schedule("main")
    bound = {b.uid: b for b in first.binds}
    assert 3 <= len(bound) < 7
    keys = keys_read(source)
    assert check(db, source) == len(bound)
    assert keys_read(source) - keys == 7 - len(bound)

    # The batch system starts two bound workloads (intervals open) and one of them stops.
    started = sorted(bound)[:2]
    for uid in started:
        pods = [(p.node, list(p.gpu_indices), p.gpu_fraction) for p in bound[uid].pods]
        report(client, event(STARTED, uid, time.time(), pods))
    assert check(db, source) >= 2
    report(client, event(STOPPED, started[0], time.time()))
    check(db, source)
    assert check(db, source) == 0

    # Submissions and a cancellation of a pending and of a bound workload.
    client.submit_workloads([wl("late1", queue="vision"), wl("late2", queue="vision")])
    assert check(db, source) == 2
    client.cancel_workload("late1")
    still_bound = sorted(set(bound) - set(started))[0]
    client.cancel_workload(still_bound)
    check(db, source)
    assert check(db, source) == 0

    # A config change (a node drained) reloads the config, and only then.
    loads = source.config_loads
    client.set_nodes_ready(["a2"], ready=False)
    check(db, source)
    assert source.config_loads == loads + 1
    check(db, source)
    assert source.config_loads == loads + 1

    # Another replica runs a cycle (and a recompute) with its own kept state.
    client.submit_workloads([wl("from-replica", queue="vision")])
    with GpufairClient(f"127.0.0.1:{replica.port}", timeout_s=20, attempts=1) as other:
        other.schedule("main")
    check(db, source)

    # Direct SQL writes, as by a replica of another version or an operator.
    with db.begin() as conn:
        conn.execute(text("UPDATE workloads SET state = 'cancelled' WHERE uid = 'late2'"))
        conn.execute(
            text(
                "UPDATE allocation_intervals SET pods = pods || pods "
                "WHERE workload_uid = :uid AND ended_at IS NULL"
            ),
            {"uid": started[1]},
        )
    assert check(db, source) >= 1
    with db.begin() as conn:
        conn.execute(
            text("DELETE FROM allocation_intervals WHERE workload_uid = :u"), {"u": started[1]}
        )
    check(db, source)
    assert check(db, source) == 0


def test_state_of_a_pool_the_config_no_longer_has_is_dropped(
    client: GpufairClient, db: Engine
) -> None:
    """Rows, run and carried records kept for a pool that is not in the config (deleted) are
    dropped when the next config is read; the pools that exist keep theirs."""
    source = SnapshotSource()
    client.apply_config(cluster())
    client.submit_workloads([wl(f"w{i}") for i in range(3)])
    assert check(db, source) == 3
    with db.connect() as conn:
        assert source.holding_and_pending(conn, "old") == ((), ())
        assert source.latest_run(conn, "old") is None
        conn.rollback()
    source.carried("old")
    assert source.kept_pools() == {"main", "old"}
    assert check(db, source) == 0  # the same config: nothing read, nothing dropped
    assert source.kept_pools() == {"main", "old"}
    client.set_nodes_ready(["a2"], ready=False)  # a new config version
    assert check(db, source) == 0  # main's rows kept: nothing read again
    assert source.kept_pools() == {"main"}
    assert source.rows.stats("old") == (0, 0, 0)


def test_binds_released_by_a_rolled_back_dry_run_are_read_back(
    client: GpufairClient, db: Engine
) -> None:
    """A dry run releases expired binds in its own transaction, reads them as pending, and rolls
    back: the kept rows must show them bound again next time (their group is read again)."""
    source = SnapshotSource()
    client.apply_config(cluster())
    client.submit_workloads([wl(f"w{i}") for i in range(3)])
    client.schedule("main")
    check(db, source)
    with db.begin() as conn:
        conn.execute(text("UPDATE workloads SET bind_expires_at = now() - interval '1 hour'"))
    check(db, source)
    with db.connect() as conn:
        decided = schedule.decide(conn, "main", time.time(), source)
        assert {w.uid for w in decided.snapshot.pending} == {"w0", "w1", "w2"}
        conn.rollback()
    with db.connect() as conn:
        running, pending = source.holding_and_pending(conn, "main")
        assert pending == () and len(running) == 3  # bound again, as the database says
        conn.rollback()
    check(db, source)
    # The same release committed: pending for good.
    with db.connect() as conn:
        schedule.decide(conn, "main", time.time(), source)
        conn.commit()
    check(db, source)
    with db.connect() as conn:
        assert len(source.holding_and_pending(conn, "main")[1]) == 3
        conn.rollback()


def test_a_truncate_and_new_rows_are_not_mistaken_for_the_old(
    client: GpufairClient, db: Engine
) -> None:
    source = SnapshotSource()
    client.apply_config(cluster())
    client.submit_workloads([wl(f"w{i}") for i in range(4)])
    assert check(db, source) == 4
    truncate_all(db)
    assert check(db, source, configured=False) == 0
    with db.connect() as conn:
        assert source.holding_and_pending(conn, "main") == ((), ())
        conn.rollback()
    client.apply_config(cluster())
    client.submit_workloads([wl(f"w{i}") for i in range(2)])
    assert check(db, source) == 2


def test_rows_the_reading_transaction_writes_after_its_read_are_read_again(
    client: GpufairClient, db: Engine
) -> None:
    """A transaction that wrote before the read and writes the same rows again after it (same
    xmin, same count): the kept rows cannot tell by count, so its groups are read again."""
    source = SnapshotSource()
    client.apply_config(cluster())
    client.submit_workloads([wl(f"w{i}") for i in range(3)])
    check(db, source)
    with db.connect() as conn:
        conn.execute(text("UPDATE workloads SET submit_time = submit_time - interval '1 s'"))
        source.holding_and_pending(conn, "main")
        conn.execute(text("UPDATE workloads SET submit_time = now() + interval '1 h'"))
        conn.commit()
    assert check(db, source) == 3


def test_a_group_naming_a_key_not_held_starts_the_pool_over(
    client: GpufairClient, db: Engine
) -> None:
    """The fallback (it takes transaction ids wrapping around to happen for real): a kept group
    that lost a key it should hold and looks changed is answered by a full read."""
    source = SnapshotSource()
    client.apply_config(cluster())
    client.submit_workloads([wl(f"w{i}") for i in range(5)])
    assert check(db, source) == 5
    kept = source.rows._pools["main"]
    group = next(iter(kept.groups.values()))
    group.keys.pop()
    group.n += 1  # looks changed: its keys are sent, one of them unknown here
    reads = source.rows.stats("main")[0]
    assert check(db, source) == 5  # read whole again, and equal to a fresh read
    # The keys, then the full read; then the check's second look (nothing changed).
    assert source.rows.stats("main")[0] == reads + 3


def test_cycles_of_another_serve_process_group_are_seen(
    client: GpufairClient, db: Engine, database_url: str, tmp_path: Path
) -> None:
    """`gpufair serve --processes 2` on the same database, each worker with kept state of its
    own: cycles, submissions and cancellations through it are what this process's kept rows
    show next, and no GPU is held twice."""
    source = SnapshotSource()
    client.apply_config(cluster())
    env = {k: v for k, v in os.environ.items() if k != "GPUFAIR_DATABASE_URL"}
    group = ServeProcess(
        ["--database-url", database_url, "--processes", "2", "--grace-s", "1", "--no-jobs"],
        env,
        tmp_path / "serve.log",
    )
    try:
        group.wait_serving()
        with GpufairClient(group.address, timeout_s=20, attempts=1) as other:
            for round_ in range(4):
                other.submit_workloads([wl(f"r{round_}-{i}", queue="vision") for i in range(3)])
                assert check(db, source) == 3
                for _ in range(3):  # new connections: both workers take calls
                    with GpufairClient(group.address, timeout_s=20, attempts=1) as fresh:
                        fresh.schedule("main")
                other.cancel_workload(f"r{round_}-0")
                check(db, source)
                assert check(db, source) == 0
    finally:
        assert group.terminate() == 0
    with db.connect() as conn:
        held = conn.execute(
            text(
                "SELECT p->>'node', g FROM workloads, jsonb_array_elements(binding->'pods') p, "
                "jsonb_array_elements_text(p->'gpu_indices') g WHERE state = 'bound'"
            )
        ).all()
        conn.rollback()
    assert held and len(held) == len(set(held))
