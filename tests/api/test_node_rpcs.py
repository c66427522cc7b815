"""UpsertNodes and SetNodesReady over gRPC: a node controller owning nodes and nothing else."""

from __future__ import annotations

import time

import grpc
import pytest
from sqlalchemy import Engine, text

from gpufair.client import GpufairClient, field_violations
from gpufair.v1 import cluster_pb2 as pb
from tests.api.ledger_support import STARTED, STORED, cluster, event, report, submit


def node(name: str, gpus: int = 8, **kw: object) -> pb.Node:
    return pb.Node(
        name=name,
        pool="main",
        gpu_type="a100",
        gpu_count=gpus,
        cpu_millicores=64000,
        memory_mib=524288,
        **kw,  # type: ignore[arg-type]
    )


def changes(reply: pb.UpsertNodesResponse | pb.SetNodesReadyResponse) -> list[tuple[str, str]]:
    names = {pb.CHANGE_ACTION_CREATE: "create", pb.CHANGE_ACTION_UPDATE: "update"}
    return [(names.get(c.action, "delete"), c.name) for c in reply.changes]


def stored_nodes(client: GpufairClient) -> dict[str, pb.Node]:
    return {n.name: n for n in client.get_config().config.nodes}


def capacity_rows(db: Engine) -> list[float]:
    with db.connect() as conn:
        return [
            r[0]
            for r in conn.execute(
                text(
                    "SELECT capacity_cu FROM pool_capacity_changes WHERE pool = 'main' "
                    "ORDER BY changed_at"
                )
            )
        ]


def test_upsert_creates_updates_and_prunes_with_versions(client: GpufairClient, db: Engine) -> None:
    assert client.apply_config(cluster()).config_version == 1  # a1, a2 (8 A100), r1 (4 RTX)
    assert capacity_rows(db) == [168.0]

    created = client.upsert_nodes([node("a3", 8)])
    assert changes(created) == [("create", "a3")]
    assert created.applied and created.config_version == 2
    assert capacity_rows(db) == [168.0, 248.0]

    same = client.upsert_nodes([node("a3", 8)])
    assert list(same.changes) == [] and same.config_version == 2

    updated = client.upsert_nodes([node("a3", 4, labels={"rack": "r2"})])
    assert changes(updated) == [("update", "a3")]
    assert {(f.field, f.before, f.after) for f in updated.changes[0].fields} == {
        ("gpu_count", "8", "4"),
        ("labels", "", "rack=r2"),
    }
    assert updated.config_version == 3
    assert capacity_rows(db)[-1] == 208.0

    # Prune: the controller lists what it sees in pool main; r1 and a2 are gone from it.
    pruned = client.upsert_nodes(
        [node("a1"), node("a3", 4, labels={"rack": "r2"})], prune_pools=["main"]
    )
    assert changes(pruned) == [("delete", "a2"), ("delete", "r1")]
    assert pruned.config_version == 4
    assert sorted(stored_nodes(client)) == ["a1", "a3"]
    assert capacity_rows(db)[-1] == 120.0
    # Nothing but nodes changed: queues and pools are as applied.
    config = client.get_config().config
    assert [q.name for q in config.queues] == ["llm", "vision"]
    assert [p.name for p in config.pools] == ["main"]


def test_upsert_dry_run_reports_and_writes_nothing(client: GpufairClient, db: Engine) -> None:
    client.apply_config(cluster())
    reply = client.upsert_nodes([node("a3")], prune_pools=["main"], dry_run=True)
    assert not reply.applied and reply.config_version == 1
    assert changes(reply) == [
        ("create", "a3"),
        ("delete", "a1"),
        ("delete", "a2"),
        ("delete", "r1"),
    ]
    assert sorted(stored_nodes(client)) == ["a1", "a2", "r1"]
    assert capacity_rows(db) == [168.0]


def test_upsert_without_ready_keeps_a_drain(client: GpufairClient) -> None:
    client.apply_config(cluster())
    client.set_nodes_ready(["a1"], False)
    reply = client.upsert_nodes([node("a1", 8)])  # ready unset: the drain stays
    assert list(reply.changes) == []
    assert not stored_nodes(client)["a1"].ready
    client.upsert_nodes([node("a1", 8, ready=True)])  # ready sent: as given
    assert stored_nodes(client)["a1"].ready
    new = client.upsert_nodes([node("a9")])  # a new node without ready is ready
    assert changes(new) == [("create", "a9")] and stored_nodes(client)["a9"].ready


def test_upsert_checks_nodes_against_stored_pools_and_types(client: GpufairClient) -> None:
    client.apply_config(cluster())
    bad = node("a3")
    bad.gpu_type = "h200"
    with pytest.raises(grpc.RpcError) as err:
        client.upsert_nodes([node("ok"), bad, node("ok")], prune_pools=["nowhere"])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(field_violations(err.value)) == {
        "nodes[1].gpu_type": "unknown GPU type 'h200'",
        "nodes[2].name": "duplicate name 'ok'",
        "prune_pools[0]": "unknown pool 'nowhere'",
    }
    assert sorted(stored_nodes(client)) == ["a1", "a2", "r1"]


def test_prune_refuses_a_node_running_work(client: GpufairClient) -> None:
    client.apply_config(cluster())
    submit(client, "job-1")
    assert (
        report(client, event(STARTED, "job-1", time.time() - 60, [("a2", [0], 1.0)]))[0].status
        == STORED
    )
    with pytest.raises(grpc.RpcError) as err:
        client.upsert_nodes([node("a1")], prune_pools=["main"])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert err.value.details() == (
        "cannot delete node a2, r1. In use: running workload job-1 uses node a2. Nothing was changed."
    )
    assert sorted(stored_nodes(client)) == ["a1", "a2", "r1"]


def test_stale_expected_version_is_refused_on_both_node_rpcs(client: GpufairClient) -> None:
    client.apply_config(cluster())
    client.upsert_nodes([node("a3")], expected_version=1)  # now 2
    for call in (
        lambda: client.upsert_nodes([node("a4")], expected_version=1),
        lambda: client.set_nodes_ready(["a1"], False, expected_version=1),
    ):
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert err.value.details().startswith("config version is 2, not the expected 1")
    assert sorted(stored_nodes(client)) == ["a1", "a2", "a3", "r1"]
    assert stored_nodes(client)["a1"].ready
    assert client.get_config().config_version == 2


def test_set_nodes_ready_drains_and_the_next_schedule_binds_elsewhere(
    client: GpufairClient, db: Engine
) -> None:
    client.apply_config(cluster())
    drained = client.set_nodes_ready(["a1", "r1"], False)
    assert changes(drained) == [("update", "a1"), ("update", "r1")]
    assert [(f.field, f.before, f.after) for f in drained.changes[0].fields] == [
        ("ready", "true", "false")
    ]
    assert drained.config_version == 2
    assert capacity_rows(db) == [168.0, 80.0]  # only a2's 8 A100 remain ready
    again = client.set_nodes_ready(["a1"], False)
    assert list(again.changes) == [] and again.config_version == 2

    submit(client, "big", pods=2, gpus=8)  # 16 GPUs: a1 and a2, if a1 were ready
    submit(client, "small", pods=1, gpus=8)
    reply = client.schedule("main")
    assert {b.uid: [p.node for p in b.pods] for b in reply.binds} == {"small": ["a2"]}
    assert [p.uid for p in reply.pending] == ["big"]

    undrained = client.set_nodes_ready(["a1"], True)
    assert changes(undrained) == [("update", "a1")] and undrained.config_version == 3


def test_set_nodes_ready_names_an_unknown_node(client: GpufairClient) -> None:
    client.apply_config(cluster())
    with pytest.raises(grpc.RpcError) as err:
        client.set_nodes_ready(["a1", "ghost"], False)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert err.value.details() == "node 'ghost' not found"
    assert stored_nodes(client)["a1"].ready
    with pytest.raises(grpc.RpcError) as empty:
        client.set_nodes_ready([], False)
    assert field_violations(empty.value) == [("names", "name at least one node")]


def test_a_prune_that_empties_a_pool_needs_confirm_delete_all(
    client: GpufairClient, db: Engine
) -> None:
    config = cluster()  # pool main: a1, a2, r1
    config.pools.add(name="spare")
    config.nodes.add(name="s1", pool="spare", gpu_type="a100", gpu_count=8)
    client.apply_config(config)

    # A controller's bug: it lists no node of main; for the dry run as for the real call.
    for dry_run in (False, True):
        with pytest.raises(grpc.RpcError) as err:
            client.upsert_nodes([], prune_pools=["main"], dry_run=dry_run)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert err.value.details() == (
            "this upsert would delete every stored node of pool main (3 nodes) and keep none: "
            "set confirm_delete_all if that is meant. Nothing was changed."
        )
    s2 = node("s2")
    s2.pool = "spare"
    with pytest.raises(grpc.RpcError) as err:  # spare keeps a node, main none
        client.upsert_nodes([s2], prune_pools=["spare", "main"], request_id="sync-1")
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert err.value.details().startswith(
        "this upsert would delete every stored node of pool main (3 nodes) and keep none:"
    )
    assert sorted(stored_nodes(client)) == ["a1", "a2", "r1", "s1"]
    assert client.get_config().config_version == 1
    with db.connect() as conn:
        stored = text("SELECT count(*) FROM request_replies WHERE request_id = 'sync-1'")
        assert conn.execute(stored).scalar_one() == 0  # a refusal stores no reply

    # Replacing a pool's nodes by others is not emptying it; a node moved away is.
    replaced = client.upsert_nodes([node("m1")], prune_pools=["main"], dry_run=True)
    assert changes(replaced) == [
        ("create", "m1"),
        ("delete", "a1"),
        ("delete", "a2"),
        ("delete", "r1"),
    ]
    with pytest.raises(grpc.RpcError) as err:
        client.upsert_nodes([node("s1")], prune_pools=["spare"])  # s1 now in main
    assert err.value.details().startswith(
        "this upsert would delete every stored node of pool spare (1 node) and keep none:"
    )

    # Meant: confirmed, the pool is emptied (the other pool, not pruned, keeps its node).
    confirmed = client.upsert_nodes([], prune_pools=["main"], confirm_delete_all=True)
    assert changes(confirmed) == [("delete", "a1"), ("delete", "a2"), ("delete", "r1")]
    assert confirmed.applied and confirmed.config_version == 2
    assert sorted(stored_nodes(client)) == ["s1"]
    # An empty pool stays prunable without it: nothing stored there to lose.
    again = client.upsert_nodes([], prune_pools=["main"])
    assert list(again.changes) == [] and again.config_version == 2
