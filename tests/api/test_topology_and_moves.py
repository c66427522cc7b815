"""Topology levels and defragmentation moves over gRPC on PostgreSQL (a real server, a real
channel): the pool's new fields go through ApplyConfig and are checked, a move comes back as an
eviction marked `move` with its new placement, the moved work binds there once it stopped, the
move budget counts what was moved, and ExplainWorkload names the topology when it is the
reason a gang waits."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from sqlalchemy import Engine, text
from test_schedule import Clock, event, report, schedule, submit

from gpufair.api.server import build_server
from gpufair.client import GpufairClient, field_violations
from gpufair.v1 import cluster_pb2, ledger_pb2, scheduler_pb2


@pytest.fixture
def clock() -> Clock:
    return Clock(time.time())


@pytest.fixture
def gpufair(db: Engine, clock: Clock) -> Iterator[GpufairClient]:
    running = build_server(db, "127.0.0.1:0", max_workers=4, clock=clock)
    try:
        with GpufairClient(f"127.0.0.1:{running.port}", attempts=1, timeout_s=60) as c:
            yield c
    finally:
        running.stop(0.5)


def config(share: float | None = 0.25) -> cluster_pb2.ClusterConfig:
    """4 nodes of 8 GPUs: n1, n2 in rack r1, n3, n4 in rack r2; two NVLink domains per rack."""
    msg = cluster_pb2.ClusterConfig()
    msg.gpu_types.add(name="a100", memory_gib=80, compute_weight=1)
    pool = msg.pools.add(name="default", topology_levels=["nvlink-domain", "rack"])
    if share is not None:
        pool.max_moved_share_per_hour = share
    for index in range(1, 5):
        msg.nodes.add(
            name=f"n{index}",
            pool="default",
            gpu_type="a100",
            gpu_count=8,
            cpu_millicores=64000,
            memory_mib=512000,
            labels={"nvlink-domain": f"nv{index}", "rack": "r1" if index <= 2 else "r2"},
        )
    msg.queues.add(name="team").quotas.add(pool="default", deserved_cu=24)
    msg.queues.add(name="big").quotas.add(pool="default", deserved_cu=8)
    return msg


def workload(uid: str, queue: str, pods: int, gpus_per_pod: float = 1) -> scheduler_pb2.Workload:
    return scheduler_pb2.Workload(
        uid=uid, queue=queue, pool="default", pods=pods, gpus_per_pod=gpus_per_pod
    )


def pods(node: str, first: int, count: int) -> list[scheduler_pb2.PodBinding]:
    return [scheduler_pb2.PodBinding(node=node, gpu_indices=list(range(first, first + count)))]


# Every node keeps 2 GPUs free: n1 a1 (4) + a2 (2); n2 b1 (4) + b2 (2); n3 c1, c2, c3 (2 each);
# n4 d1 (6). The batch system started them where it chose.
SMALL = {
    "a1": ("n1", 0, 4),
    "a2": ("n1", 4, 2),
    "b1": ("n2", 0, 4),
    "b2": ("n2", 4, 2),
    "c1": ("n3", 0, 2),
    "c2": ("n3", 2, 2),
    "c3": ("n3", 4, 2),
    "d1": ("n4", 0, 6),
}


def fragmented(c: GpufairClient, clock: Clock) -> None:
    submit(c, *(workload(uid, "team", 1, gpus_per_pod=g) for uid, (_, _, g) in SMALL.items()))
    report(
        c,
        *(
            event(ledger_pb2.EVENT_KIND_STARTED, uid, clock.now_s - 3600, pods(node, first, gpus))
            for uid, (node, first, gpus) in SMALL.items()
        ),
    )


def test_bad_topology_levels_and_move_share_are_field_violations(gpufair: GpufairClient) -> None:
    bad = config(share=1.5)
    bad.pools[0].topology_levels.append("rack")  # listed twice
    bad.pools[0].topology_levels.append("no spaces")
    with pytest.raises(grpc.RpcError) as err:
        gpufair.apply_config(bad)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    violations = dict(field_violations(err.value))
    assert set(violations) == {
        "config.pools[0].topology_levels[2]",
        "config.pools[0].topology_levels[3]",
        "config.pools[0].max_moved_share_per_hour",
    }
    assert violations["config.pools[0].topology_levels[2]"] == "level 'rack' listed twice"
    assert (
        "a share of the pool's GPUs in (0, 1]; got 1.5"
        in (violations["config.pools[0].max_moved_share_per_hour"])
    )
    gpufair.apply_config(config())
    stored = gpufair.get_config().config.pools[0]
    assert list(stored.topology_levels) == ["nvlink-domain", "rack"]
    assert stored.max_moved_share_per_hour == 0.25


def test_a_move_makes_room_for_a_gang_and_the_moved_work_binds_where_it_was_sent(
    gpufair: GpufairClient, db: Engine, clock: Clock
) -> None:
    gpufair.apply_config(config())
    fragmented(gpufair, clock)
    submit(gpufair, workload("gang", "big", 1, gpus_per_pod=8))
    first = schedule(gpufair)
    moves = {e.uid: e for e in first.evicts}
    assert set(moves) == {"c1", "c2", "c3"}
    for e in moves.values():
        assert e.move and e.reason == scheduler_pb2.EVICT_REASON_DEFRAGMENT
        assert e.in_favour_of == "gang" and e.move_gpu_type == "a100"
        assert len(e.move_to) == 1 and len(e.move_to[0].gpu_indices) == 2
    assert sorted(e.move_to[0].node for e in moves.values()) == ["n1", "n2", "n4"]
    [gang] = [p for p in first.pending if p.uid == "gang"]
    assert gang.reason_code == "waiting_for_evicted_capacity"
    with db.connect() as conn:
        assert conn.execute(text("SELECT sum(gpus) FROM moves")).scalar_one() == 6.0
        stored = conn.execute(
            text("SELECT victim_uid, move_to FROM evictions ORDER BY victim_uid")
        ).all()
    assert [row.victim_uid for row in stored] == ["c1", "c2", "c3"]
    assert stored[0].move_to["gpu_type"] == "a100"

    moved = gpufair.explain("c1")
    assert moved.state == "running"
    assert "being moved to make room for gang: once it stops it is bound on a100 " in moved.message
    assert f"{moves['c1'].move_to[0].node} GPUs " in moved.message
    # A cycle while they still stop decides nothing new: the new places stay held.
    clock.now_s += 30
    second = schedule(gpufair)
    assert not second.binds and not second.evicts

    clock.now_s += 30
    report(gpufair, *(event(ledger_pb2.EVENT_KIND_PREEMPTED, uid, clock.now_s) for uid in moves))
    clock.now_s += 1
    third = schedule(gpufair)
    binds = {b.uid: b for b in third.binds}
    assert set(binds) == {"gang", "c1", "c2", "c3"}
    for uid, e in moves.items():
        assert [(p.node, list(p.gpu_indices)) for p in binds[uid].pods] == [
            (p.node, list(p.gpu_indices)) for p in e.move_to
        ]
    assert [p.node for p in binds["gang"].pods] == ["n3"]


def test_the_hourly_budget_stops_moves_and_without_a_share_there_are_none(
    gpufair: GpufairClient, db: Engine, clock: Clock
) -> None:
    gpufair.apply_config(config(share=0.25))  # 8 of 32 GPUs an hour
    with db.begin() as conn:  # 4 GPUs were moved 10 minutes ago: 6 more would exceed 8
        conn.execute(
            text(
                "INSERT INTO moves (pool, victim_uid, gpus, decided_at) "
                "VALUES ('default', 'earlier', 4, to_timestamp(:at))"
            ),
            {"at": clock.now_s - 600},
        )
    fragmented(gpufair, clock)
    submit(gpufair, workload("gang", "big", 1, gpus_per_pod=8))
    assert not schedule(gpufair, dry_run=True).evicts
    clock.now_s += 3000  # the earlier move is now more than an hour old
    assert {e.uid for e in schedule(gpufair, dry_run=True).evicts} == {"c1", "c2", "c3"}
    gpufair.apply_config(config(share=None))
    assert not schedule(gpufair, dry_run=True).evicts


def test_explain_names_the_topology_when_it_keeps_a_gang_out(
    gpufair: GpufairClient, clock: Clock
) -> None:
    """6 GPUs required within one rack: each node has 2 free, so each rack 4 and the pool 8.
    The gang waits, and explain says the rack is why."""
    gpufair.apply_config(config(share=None))
    fragmented(gpufair, clock)
    gang = workload("gang", "big", 6)
    gang.topology.level = "rack"
    gang.topology.required = True
    submit(gpufair, gang)
    reply = schedule(gpufair)
    [pending] = [p for p in reply.pending if p.uid == "gang"]
    assert pending.reason_code == "no_capacity"
    explained = gpufair.explain("gang")
    assert explained.reason_code == "no_capacity"
    assert "no domain of nvlink-domain → rack holds them (required rack" in explained.message
    assert "the roomiest rack domain takes 4 now" in explained.message


def test_gangs_go_into_the_smallest_domain_over_grpc(gpufair: GpufairClient) -> None:
    """An empty pool. 4 GPUs: one node holds them, n1 (the first). 12 GPUs next: no NVLink
    domain (one node, 8 GPUs) holds them; rack r1 has 12 free (4 on n1, 8 on n2), r2 16: the
    tightest rack, r1."""
    gpufair.apply_config(config(share=None))
    submit(gpufair, workload("small", "team", 4))
    first = schedule(gpufair)
    [small] = first.binds
    assert {p.node for p in small.pods} == {"n1"}
    submit(gpufair, workload("gang", "team", 12))
    second = schedule(gpufair)
    [gang] = second.binds
    assert sorted(p.node for p in gang.pods) == ["n1"] * 4 + ["n2"] * 8
