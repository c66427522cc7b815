"""Two writers share the config over gRPC at once, as in production: a node controller owns the
nodes (UpsertNodes with prune, SetNodesReady) while a person applies queues and budgets from a
repository (ApplyConfig with `kinds`, read-modify-write with `expected_version`). Neither may
lose the other's objects, however their calls interleave."""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc

from gpufair.api.server import RunningServer
from gpufair.client import GpufairClient
from gpufair.config_file import parse_config
from gpufair.v1 import cluster_pb2 as pb
from tests.api.ledger_support import CLUSTER

ROUNDS = 25


def controller_nodes(round_no: int) -> list[pb.Node]:
    """What the controller sees in round `round_no`: two fixed nodes and one that comes and goes."""
    names = ["a1", "a2", f"burst-{round_no}"]
    return [
        pb.Node(
            name=name,
            pool="main",
            gpu_type="a100",
            gpu_count=8,
            cpu_millicores=64000,
            memory_mib=524288,
            labels={"seen-in-round": str(round_no)},
        )
        for name in names
    ]


def person_config(round_no: int) -> pb.ClusterConfig:
    return parse_config(
        {
            "queues": [
                {"name": "llm", "quotas": [{"pool": "main", "deserved_cu": 10 + round_no}]},
                {"name": f"project-{round_no}", "quotas": [{"pool": "main", "deserved_cu": 5}]},
            ],
            "budgets": [{"queue": "llm", "period": "week", "cu_hours": 100 + round_no}],
        }
    )


def test_node_controller_and_gitops_apply_never_lose_each_others_objects(
    server: RunningServer, client: GpufairClient
) -> None:
    first = client.apply_config(parse_config(CLUSTER))
    address = f"127.0.0.1:{server.port}"
    errors: list[BaseException] = []
    conflicts = {"person": 0}
    observed_node_counts: list[int] = []
    observed_queue_counts: list[int] = []

    def controller() -> None:
        with GpufairClient(address, timeout_s=30, attempts=1) as c:
            for r in range(ROUNDS):
                c.upsert_nodes(controller_nodes(r), prune_pools=["main"])
                c.set_nodes_ready(["a2"], ready=r % 2 == 0)
                observed_queue_counts.append(len(c.get_config().config.queues))

    def person() -> None:
        with GpufairClient(address, timeout_s=30, attempts=1) as c:
            r = 0
            while r < ROUNDS:
                version = c.get_config().config_version
                try:
                    c.apply_config(
                        person_config(r), kinds=["queue", "budget"], expected_version=version
                    )
                except grpc.RpcError as exc:
                    assert isinstance(exc, grpc.Call)
                    assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION, exc.details()
                    conflicts["person"] += 1
                    continue  # someone wrote in between: read again, apply again
                observed_node_counts.append(len(c.get_config().config.nodes))
                r += 1

    def run(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(f,)) for f in (controller, person)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)

    final = client.get_config()
    nodes = {n.name: n for n in final.config.nodes}
    assert sorted(nodes) == ["a1", "a2", f"burst-{ROUNDS - 1}"]
    assert nodes["a1"].labels["seen-in-round"] == str(ROUNDS - 1)
    assert nodes["a2"].ready is ((ROUNDS - 1) % 2 == 0)
    assert [q.name for q in final.config.queues] == ["llm", f"project-{ROUNDS - 1}"]
    assert final.config.queues[0].quotas[0].deserved_cu == 10 + ROUNDS - 1
    assert [(b.queue, b.cu_hours) for b in final.config.budgets] == [("llm", 100 + ROUNDS - 1)]
    assert [p.name for p in final.config.pools] == ["main"]
    # Every read in between saw the other writer's objects: 3 nodes, 2 queues, never fewer.
    assert set(observed_node_counts) == {3}
    assert set(observed_queue_counts) == {2}
    # Each call that changed the config added one version, however the calls interleaved (a
    # refused apply adds none): every upsert (a new burst node, new labels), every successful
    # apply (a new project queue), and every drain but round 0's, which asks a2 to be ready as
    # it already is. An upsert leaves a node's readiness as it was, so each later round's drain
    # flips it.
    # From an empty database: 1 + 25 + 25 + 24 = 75.
    assert final.config_version == first.config_version + ROUNDS + ROUNDS + (ROUNDS - 1)
