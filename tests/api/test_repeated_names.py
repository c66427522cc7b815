"""DeleteObjects, SetNodesReady and UpsertNodes' prune_pools name each object once: a name listed
twice is INVALID_ARGUMENT with a field violation at the repeat, naming where it was first listed,
and nothing is changed. Before, the repeat was merged silently (DeleteObjects of ["a1", "a1"]
deleted a1 once and said nothing)."""

from __future__ import annotations

import grpc
import pytest

from gpufair.client import GpufairClient, field_violations
from gpufair.v1 import cluster_pb2 as pb
from tests.api.ledger_support import cluster


def invalid(call: object) -> list[tuple[str, str]]:
    with pytest.raises(grpc.RpcError) as err:
        call()  # type: ignore[operator]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    return field_violations(err.value)


def test_delete_objects_refuses_a_name_listed_twice(client: GpufairClient) -> None:
    client.apply_config(cluster())
    version = client.get_config().config_version
    assert invalid(lambda: client.delete_objects("node", ["r1", "a2", "r1", "r1"])) == [
        ("names[2]", "'r1' is listed twice (also names[0])"),
        ("names[3]", "'r1' is listed twice (also names[0])"),
    ]
    assert client.get_config().config_version == version
    assert [n.name for n in client.get_config().config.nodes] == ["a1", "a2", "r1"]
    # Each once, it deletes both.
    reply = client.delete_objects("node", ["r1", "a2"])
    assert [(c.kind, c.name) for c in reply.changes] == [("node", "a2"), ("node", "r1")]


def test_set_nodes_ready_refuses_a_node_listed_twice(client: GpufairClient) -> None:
    client.apply_config(cluster())
    assert invalid(lambda: client.set_nodes_ready(["a1", "a1"], False)) == [
        ("names[1]", "'a1' is listed twice (also names[0])")
    ]
    assert all(n.ready for n in client.get_config().config.nodes)


def test_upsert_nodes_refuses_a_pool_to_prune_listed_twice(client: GpufairClient) -> None:
    client.apply_config(cluster())
    kept = pb.Node(
        name="a1",
        pool="main",
        gpu_type="a100",
        gpu_count=8,
        cpu_millicores=64000,
        memory_mib=524288,
    )
    assert invalid(lambda: client.upsert_nodes([kept], prune_pools=["main", "main"])) == [
        ("prune_pools[1]", "'main' is listed twice (also prune_pools[0])")
    ]
    assert [n.name for n in client.get_config().config.nodes] == ["a1", "a2", "r1"]
