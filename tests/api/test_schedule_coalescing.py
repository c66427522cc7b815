"""Concurrent `Schedule` calls of one pool share cycles instead of queueing for the pool's lock
(api/cycle_gate.py), within a replica and across replicas."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from sqlalchemy import Engine, text

from gpufair.api.scheduler import SchedulerServicer
from gpufair.api.server import RunningServer
from gpufair.client import GpufairClient
from gpufair.config_file import parse_config
from gpufair.store import locks
from gpufair.v1 import scheduler_pb2

CLUSTER = {
    "gpu_types": [{"name": "a100", "memory_gib": 80, "compute_weight": 1}],
    "pools": [{"name": "main"}],
    "nodes": [
        {
            "name": f"n{i}",
            "pool": "main",
            "gpu_type": "a100",
            "gpu_count": 8,
            "cpu_millicores": 64000,
            "memory_mib": 524288,
        }
        for i in range(8)
    ],
    "queues": [{"name": "q", "quotas": [{"pool": "main", "deserved_cu": 64}]}],
}
CALLERS = 200


def one_gpu(uid: str) -> scheduler_pb2.Workload:
    return scheduler_pb2.Workload(uid=uid, queue="q", pool="main", pods=1, gpus_per_pod=1)


def test_200_concurrent_callers_of_one_pool_share_cycles_and_all_answer(
    client: GpufairClient, db: Engine, server: RunningServer
) -> None:
    client.apply_config(parse_config(CLUSTER))
    client.submit_workloads([one_gpu(f"w{i:03}") for i in range(100)])
    address = f"127.0.0.1:{server.port}"
    start = threading.Barrier(CALLERS)

    def call(i: int) -> tuple[str, scheduler_pb2.ScheduleResponse]:
        with GpufairClient(address, timeout_s=60, attempts=1) as c:
            request_id = f"caller-{i}"
            start.wait()
            return request_id, c.schedule("main", request_id=request_id)

    with ThreadPoolExecutor(CALLERS) as pool:
        answers = list(pool.map(call, range(CALLERS)))

    by_cycle: dict[int, list[scheduler_pb2.ScheduleResponse]] = defaultdict(list)
    for _, reply in answers:
        by_cycle[reply.cycle_id].append(reply)
    with db.connect() as conn:
        stored = dict(conn.execute(text("SELECT id, binds FROM schedule_cycles")).all())
        bound = set(conn.execute(text("SELECT uid FROM workloads WHERE state = 'bound'")).scalars())
    # Every reply is a stored cycle, and the callers of one cycle got the same decisions.
    assert set(by_cycle) == set(stored)
    for cycle_id, replies in by_cycle.items():
        assert len({r.SerializeToString(deterministic=True) for r in replies}) == 1
        assert len(replies[0].binds) == stored[cycle_id]
    # Coalesced: far fewer cycles than callers. With 8 RPC threads at most 7 callers wait for
    # one cycle; on a loaded machine callers trickle in and fewer share each (4 seen): without
    # coalescing there would be a cycle per caller.
    assert len(stored) <= CALLERS // 2
    # 64 GPUs for 100 one-GPU workloads: each placed once, by one cycle.
    placed = [b.uid for replies in by_cycle.values() for b in replies[0].binds]
    assert len(placed) == len(set(placed)) == len(bound) == 64
    # A replay of any caller's request id returns its cycle's reply.
    request_id, reply = answers[CALLERS // 2]
    assert client.schedule("main", request_id=request_id) == reply


def test_a_caller_that_waited_for_another_replicas_cycle_gets_its_reply(
    client: GpufairClient, db: Engine
) -> None:
    client.apply_config(parse_config(CLUSTER))
    client.submit_workloads([one_gpu("a"), one_gpu("b")])
    other_replica = SchedulerServicer(db)
    got: dict[str, scheduler_pb2.ScheduleResponse] = {}
    with db.connect() as conn:
        # The other replica's cycle holds the pool's lock while the call arrives and waits.
        locks.xact_lock(conn, locks.pool_key("main"))
        caller = threading.Thread(target=lambda: got.setdefault("r", client.schedule("main")))
        caller.start()
        waiting = 0
        for _ in range(1000):  # until the call waits for the lock (20 s at most)
            with db.connect() as watcher:
                waiting = watcher.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND wait_event = 'advisory' AND datname = current_database()"
                    )
                ).scalar_one()
            if waiting:
                break
            time.sleep(0.02)
        assert waiting == 1
        theirs, _ = other_replica._decide_and_record(conn, "main", time.time())
        conn.commit()
    caller.join(30)

    assert sorted(b.uid for b in theirs.binds) == ["a", "b"]
    assert got["r"].cycle_id == theirs.cycle_id  # no second cycle on its heels
    assert got["r"].binds == theirs.binds
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM schedule_cycles")).scalar_one() == 1


def test_dry_runs_are_not_coalesced_and_store_nothing(client: GpufairClient, db: Engine) -> None:
    client.apply_config(parse_config(CLUSTER))
    client.submit_workloads([one_gpu("a")])
    dry = client.schedule("main", dry_run=True)
    assert [b.uid for b in dry.binds] == ["a"] and dry.cycle_id == 0
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM schedule_cycles")).scalar_one() == 0


def test_a_request_id_reused_for_another_request_is_refused_in_a_coalesced_cycle(
    client: GpufairClient, db: Engine
) -> None:
    client.apply_config(parse_config(CLUSTER))
    first = client.schedule("main", request_id="same-id")
    with pytest.raises(grpc.RpcError) as err:
        client.scheduler.Schedule(
            scheduler_pb2.ScheduleRequest(pool="other", request_id="same-id"), timeout=10
        )
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "same-id" in (err.value.details() or "")
    assert client.schedule("main", request_id="same-id") == first
