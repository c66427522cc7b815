"""A node that holds bound or running work keeps its pool and GPU type until that work stops or
is cancelled, whichever RPC asks (ApplyConfig, UpsertNodes), as it could not be deleted. Moved
to another pool, the GPUs its work holds were free in that pool's next cycle and bound twice,
and the work's own started event was refused (its node no longer in its pool)."""

from __future__ import annotations

import time

import grpc
import pytest

from gpufair.client import GpufairClient
from gpufair.v1 import cluster_pb2 as pb
from gpufair.v1 import scheduler_pb2 as spb
from tests.api.ledger_support import STARTED, STOPPED, STORED, cluster, event, report, submit


def two_pools() -> pb.ClusterConfig:
    config = cluster()
    config.pools.add(name="other")
    config.queues[0].quotas.add(pool="other", deserved_cu=80)
    return config


def node(config: pb.ClusterConfig, name: str, **changed: object) -> pb.Node:
    [found] = [n for n in config.nodes if n.name == name]
    moved = pb.Node()
    moved.CopyFrom(found)
    for field, value in changed.items():
        setattr(moved, field, value)
    return moved


def refused(call: object) -> str:
    with pytest.raises(grpc.RpcError) as err:
        call()  # type: ignore[operator]
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, err.value.details()
    return err.value.details() or ""


def test_a_node_with_bound_work_keeps_its_pool_and_nothing_is_bound_twice(
    client: GpufairClient,
) -> None:
    config = two_pools()
    client.apply_config(config)
    submit(client, "held", pods=1, gpus=8)
    [bind] = client.schedule("main").binds
    name = bind.pods[0].node
    version = client.get_config().config_version

    moved = node(config, name, pool="other")
    for dry_run in (True, False):
        details = refused(lambda d=dry_run: client.upsert_nodes([moved], dry_run=d))
        assert f"bound workload held uses node {name}" in details
    applied = pb.ClusterConfig()
    applied.CopyFrom(config)
    applied.nodes.remove(node(config, name))
    applied.nodes.append(moved)
    assert "bound workload held" in refused(lambda: client.apply_config(applied))
    assert client.get_config().config_version == version

    # Nothing moved: pool other has no node, and held's start is recorded where it was bound.
    reply = client.submit_workloads(
        [spb.Workload(uid="other-1", queue="llm", pool="other", pods=1, gpus_per_pod=8)]
    )
    assert not reply.results[0].accepted
    start = event(STARTED, "held", time.time(), [(name, list(range(8)), 1.0)])
    assert report(client, start)[0].status == STORED


def test_a_node_with_running_work_keeps_its_gpu_type_until_the_work_stops(
    client: GpufairClient,
) -> None:
    config = two_pools()
    client.apply_config(config)
    submit(client, "run-1")
    assert report(client, event(STARTED, "run-1", time.time(), [("a1", [0], 1.0)]))[0].status == (
        STORED
    )
    retyped = node(config, "a1", gpu_type="rtx4090")
    assert "running workload run-1 uses node a1" in refused(lambda: client.upsert_nodes([retyped]))
    # Its other fields may change meanwhile (a controller syncs CPU, memory, labels).
    resized = node(config, "a1", cpu_millicores=32000)
    assert client.upsert_nodes([resized]).applied
    assert report(client, event(STOPPED, "run-1", time.time()))[0].status == STORED
    assert client.upsert_nodes([retyped]).applied


def test_a_node_shrunk_below_the_gpus_its_bound_work_holds_is_refused(
    client: GpufairClient,
) -> None:
    """8 GPUs bound on an 8-GPU node: at 4 GPUs, GPUs 4-7 of the work would be on GPUs the node
    no longer has."""
    config = cluster()
    client.apply_config(config)
    submit(client, "held", pods=1, gpus=8)
    [bind] = client.schedule("main").binds
    name = bind.pods[0].node
    assert list(bind.pods[0].gpu_indices) == [0, 1, 2, 3, 4, 5, 6, 7]
    version = client.get_config().config_version

    shrunk = node(config, name, gpu_count=4)
    for dry_run in (True, False):
        details = refused(lambda d=dry_run: client.upsert_nodes([shrunk], dry_run=d))
        assert f"cannot shrink node {name} to 4 GPUs" in details
        assert f"bound workload held uses GPU 7 of node {name}" in details
    applied = pb.ClusterConfig()
    applied.CopyFrom(config)
    applied.nodes.remove(node(config, name))
    applied.nodes.append(shrunk)
    assert f"bound workload held uses GPU 7 of node {name}" in refused(
        lambda: client.apply_config(applied)
    )
    assert client.get_config().config_version == version
    [stored] = [n for n in client.get_config().config.nodes if n.name == name]
    assert stored.gpu_count == 8


def test_a_shrink_that_keeps_every_gpu_of_the_running_work_is_made(
    client: GpufairClient,
) -> None:
    """run-1 runs on GPUs 0-1 of a1: a1 may go from 8 to 2 GPUs, not to 1 until run-1 stops."""
    config = cluster()
    client.apply_config(config)
    submit(client, "run-1", pods=1, gpus=2)
    started = event(STARTED, "run-1", time.time(), [("a1", [0, 1], 1.0)])
    assert report(client, started)[0].status == STORED

    details = refused(lambda: client.upsert_nodes([node(config, "a1", gpu_count=1)]))
    assert "cannot shrink node a1 to 1 GPU." in details
    assert "running workload run-1 uses GPU 1 of node a1" in details
    reply = client.upsert_nodes([node(config, "a1", gpu_count=2)])
    assert reply.applied
    assert [(f.field, f.before, f.after) for c in reply.changes for f in c.fields] == [
        ("gpu_count", "8", "2")
    ]
    # Growing back needs nothing; a shrink of a node without work neither.
    assert client.upsert_nodes([node(config, "a1", gpu_count=8)]).applied
    assert client.upsert_nodes([node(config, "a2", gpu_count=1)]).applied

    assert report(client, event(STOPPED, "run-1", time.time()))[0].status == STORED
    assert client.upsert_nodes([node(config, "a1", gpu_count=1)]).applied


def test_a_node_shrunk_under_running_work_on_its_last_gpus_is_refused(
    client: GpufairClient,
) -> None:
    """run-1 runs on GPUs 6-7 of a1 (the only ready node). Shrunk from 8 to 4, the cycle saw
    GPUs 0-3 free and bound a 4-GPU workload there: 6 GPUs of work on a node of 4. Now the shrink
    is refused, and the next bind takes GPUs 0-3 of a1 as it still has 8."""
    config = cluster()
    client.apply_config(config)
    client.set_nodes_ready(["a2", "r1"], False)
    submit(client, "run-1", pods=1, gpus=2)
    started = event(STARTED, "run-1", time.time(), [("a1", [6, 7], 1.0)])
    assert report(client, started)[0].status == STORED

    details = refused(lambda: client.upsert_nodes([node(config, "a1", gpu_count=4)]))
    assert details.startswith(
        "cannot shrink node a1 to 4 GPUs. In use: running workload run-1 uses GPU 7 of node a1."
    )
    submit(client, "next", pods=1, gpus=4)
    [bind] = client.schedule("main").binds
    assert (bind.uid, bind.pods[0].node, list(bind.pods[0].gpu_indices)) == (
        "next",
        "a1",
        [0, 1, 2, 3],
    )
    [stored] = [n for n in client.get_config().config.nodes if n.name == "a1"]
    assert stored.gpu_count == 8
