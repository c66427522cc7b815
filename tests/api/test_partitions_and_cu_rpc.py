"""Partition requests and compute-unit requests through a real server and channel: the config
carries the slice geometry, Submit checks the new fields (field violations), Schedule says where
each instance and how many GPUs of which type, the next cycle keeps the slices held, Explain says
what the request asks."""

from __future__ import annotations

import grpc
import pytest
from sqlalchemy import Engine

from gpufair.client import GpufairClient, field_violations, started
from gpufair.config_file import parse_config
from gpufair.v1 import ledger_pb2
from gpufair.v1 import scheduler_pb2 as pb

MIG = [
    {"name": "1g.10gb", "gpu_fraction": 1 / 7, "memory_gib": 10, "memory_slices": 1,
     "starts": [0, 1, 2, 3, 4, 5, 6]},
    {"name": "3g.40gb", "gpu_fraction": 3 / 7, "memory_gib": 40, "memory_slices": 4,
     "starts": [0, 4]},
    {"name": "4g.40gb", "gpu_fraction": 4 / 7, "memory_gib": 40, "memory_slices": 4,
     "starts": [0]},
]  # fmt: skip


def node(name: str, gpu_type: str, gpus: int) -> dict[str, object]:
    return {
        "name": name,
        "pool": "main",
        "gpu_type": gpu_type,
        "gpu_count": gpus,
        "cpu_millicores": 64000,
        "memory_mib": 512000,
    }


CONFIG = {
    "gpu_types": [
        {"name": "a100-80gb", "memory_gib": 80, "compute_weight": 10, "partition_profiles": MIG},
        {"name": "v100-16gb", "memory_gib": 16, "compute_weight": 4},
        {"name": "rtx4090-24gb", "memory_gib": 24, "compute_weight": 2},
    ],
    "pools": [{"name": "main"}],
    "queues": [{"name": "team", "quotas": [{"pool": "main", "deserved_cu": 200}]}],
    "nodes": [
        node("a1", "a100-80gb", 2),
        node("r1", "rtx4090-24gb", 8),
        node("r2", "rtx4090-24gb", 8),
        node("v1", "v100-16gb", 4),
    ],
}


def submit(client: GpufairClient, *workloads: pb.Workload) -> pb.SubmitWorkloadsResponse:
    return client.scheduler.SubmitWorkloads(
        pb.SubmitWorkloadsRequest(workloads=workloads), timeout=30
    )


def schedule(client: GpufairClient) -> dict[str, pb.BindDecision]:
    reply = client.scheduler.Schedule(pb.ScheduleRequest(pool="main"), timeout=60)
    return {b.uid: b for b in reply.binds}


def instances(bind: pb.BindDecision) -> list[tuple[str, int, int, float]]:
    return [
        (p.node, p.gpu_indices[0], p.partition_start, round(p.gpu_fraction, 6)) for p in bind.pods
    ]


def test_partitions_and_cu_requests_are_placed_and_explained(
    client: GpufairClient, db: Engine
) -> None:
    client.apply_config(parse_config(CONFIG))
    reply = submit(
        client,
        pb.Workload(uid="small", queue="team", pool="main", pods=3, partition_profile="1g.10gb"),
        pb.Workload(uid="four", queue="team", pool="main", pods=1, partition_profile="4g.40gb"),
        pb.Workload(uid="cu-20", queue="team", pool="main", compute_units=20),
        pb.Workload(uid="odd", queue="team", pool="main", pods=1, partition_profile="5g.50gb"),
    )
    accepted = {r.uid: (r.accepted, r.error) for r in reply.results}
    assert accepted["small"] == (True, "") and accepted["cu-20"] == (True, "")
    assert accepted["odd"][0] is False
    assert "no GPU type declares partition profile '5g.50gb'" in accepted["odd"][1]

    # Before the cycle, explain says what each request asks and what it would cost.
    explained = client.explain("cu-20")
    assert "It asks for 20 CU; placement tries, in order: 10 × rtx4090-24gb = 20 CU; " in (
        explained.message
    )
    assert "fits now" in explained.message and explained.needs_cu == 20.0
    explained = client.explain("four")
    assert "Each pod asks for one 4g.40gb partition (0.571 of a GPU)" in explained.message
    assert "offered here by a100-80gb (5.714 CU each)" in explained.message

    binds = schedule(client)
    # Three 1g instances take the top slices of GPU 0 (6, 5, 4); the 4g fits beside them at 0.
    assert instances(binds["small"]) == [("a1", 0, s, round(1 / 7, 6)) for s in (6, 5, 4)]
    assert binds["small"].cu == pytest.approx(30 / 7)
    assert instances(binds["four"]) == [("a1", 0, 0, round(4 / 7, 6))]
    # 20 CU: ten RTX 4090s (2 CU each) before five V100s or two A100s, all 20 CU.
    cu = binds["cu-20"]
    assert (cu.gpu_type, len(cu.pods), cu.gpus, cu.cu) == ("rtx4090-24gb", 10, 10.0, 20.0)

    # The bound instances hold their slices in the next cycle: a 3g (slices 0-3 or 4-7) no
    # longer fits GPU 0 (slice 7 is the only free one), so it opens GPU 1 at slice 4.
    assert (
        submit(
            client,
            pb.Workload(
                uid="three", queue="team", pool="main", pods=1, partition_profile="3g.40gb"
            ),
        )
        .results[0]
        .accepted
    )
    binds = schedule(client)
    assert instances(binds["three"]) == [("a1", 1, 4, round(3 / 7, 6))]


def test_malformed_partition_and_cu_fields_are_invalid_argument(client: GpufairClient) -> None:
    client.apply_config(parse_config(CONFIG))
    with pytest.raises(grpc.RpcError) as caught:
        submit(
            client,
            pb.Workload(uid="a", queue="team", pool="main", pods=2, compute_units=20),
            pb.Workload(
                uid="b", queue="team", pool="main", compute_units=20, partition_profile="1g.10gb"
            ),
            pb.Workload(uid="c", queue="team", pool="main", compute_units=-1),
            pb.Workload(uid="d", queue="team", pool="main", compute_units=8, gpus_per_pod=0.5),
        )
    error = caught.value
    assert isinstance(error, grpc.Call)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    fields = dict(field_violations(error))
    assert fields["workloads[0].pods"] == "leave it 0 with compute_units: placement sets it"
    assert "cannot ask for a partition profile" in fields["workloads[1].compute_units"]
    assert fields["workloads[2].compute_units"] == "must be in [0.001, 1e+06], got -1"
    assert "0 (one GPU) or whole GPUs per pod" in fields["workloads[3].gpus_per_pod"]


def test_profile_geometry_is_checked_with_the_config(client: GpufairClient) -> None:
    profiles = [
        {"name": "1g.10gb", "gpu_fraction": 0.14, "memory_gib": 10, "memory_slices": 1},
        {"name": "3g.40gb", "gpu_fraction": 0.43, "memory_gib": 40, "memory_slices": 4,
         "starts": [0, 40]},
    ]  # fmt: skip
    a100 = {"name": "a100-80gb", "memory_gib": 80, "compute_weight": 10}
    bad = {**CONFIG, "gpu_types": [{**a100, "partition_profiles": profiles}]}
    with pytest.raises(grpc.RpcError) as caught:
        client.apply_config(parse_config(bad))
    fields = dict(field_violations(caught.value))
    assert fields["config.gpu_types[0].partition_profiles[0].starts"] == (
        "at least one start with memory_slices"
    )
    assert (
        fields["config.gpu_types[0].partition_profiles[1].starts[1]"]
        == "must be in [0, 28], got 40"
    )
    # The geometry is stored and read back.
    client.apply_config(parse_config(CONFIG))
    stored = client.get_config().config.gpu_types[0].partition_profiles
    assert [(p.name, p.memory_slices, list(p.starts)) for p in stored] == [
        ("1g.10gb", 1, [0, 1, 2, 3, 4, 5, 6]),
        ("3g.40gb", 4, [0, 4]),
        ("4g.40gb", 4, [0]),
    ]


def test_a_started_event_says_where_the_instances_really_are(client: GpufairClient) -> None:
    """The batch system put the three 1g instances at slices 0-2 instead of the bound 6-4: the
    ledger keeps the starts it reported, so a 4g (only at slice 0) must open GPU 1."""
    client.apply_config(parse_config(CONFIG))
    submit(
        client,
        pb.Workload(uid="small", queue="team", pool="main", pods=3, partition_profile="1g.10gb"),
    )
    binds = schedule(client)
    assert [p.partition_start for p in binds["small"].pods] == [6, 5, 4]
    moved = [
        ledger_pb2.EventPod(node="a1", gpu_indices=[0], gpu_fraction=1 / 7, partition_start=s)
        for s in (0, 1, 2)
    ]
    reply = client.report_events([started("small", moved)])
    assert [r.status for r in reply.results] == [ledger_pb2.EVENT_STATUS_STORED]
    submit(
        client,
        pb.Workload(uid="four", queue="team", pool="main", pods=1, partition_profile="4g.40gb"),
    )
    binds = schedule(client)
    assert instances(binds["four"]) == [("a1", 1, 0, round(4 / 7, 6))]
    # A start outside the GPU's slices is refused with the reason.
    bad = ledger_pb2.EventPod(node="a1", gpu_indices=[1], gpu_fraction=4 / 7, partition_start=40)
    reply = client.report_events([started("four", [bad])])
    assert "partition_start must be in [0, 31]" in reply.results[0].error
    # A partition without its share would be booked as a whole GPU (10 CU for a 4g.40gb's
    # 40/7): refused, naming what is missing.
    unshared = ledger_pb2.EventPod(node="a1", gpu_indices=[1], partition_start=0)
    reply = client.report_events([started("four", [unshared])])
    assert reply.results[0].status == ledger_pb2.EVENT_STATUS_REJECTED
    assert reply.results[0].error == (
        "pods[0]: a partition's gpu_fraction is required (its share of the GPU)"
    )


def test_a_mixed_cu_request_is_bound_across_types_in_one_rack(client: GpufairClient) -> None:
    a1 = {**node("a1", "a100-80gb", 1), "labels": {"rack": "r1"}}
    r1 = {**node("r1", "rtx4090-24gb", 8), "labels": {"rack": "r1"}}
    client.apply_config(parse_config({**CONFIG, "nodes": [a1, r1]}))
    rack = pb.TopologyConstraint(level="rack", required=True)
    with pytest.raises(grpc.RpcError) as caught:
        submit(
            client,
            pb.Workload(uid="m", queue="team", pool="main", compute_units=20, mixed_gpu_types=True),
        )
    assert dict(field_violations(caught.value)) == {
        "workloads[0].mixed_gpu_types": (
            "needs compute_units and a topology level (the mix stays in one domain)"
        )
    }
    reply = submit(
        client,
        pb.Workload(
            uid="m",
            queue="team",
            pool="main",
            compute_units=20,
            mixed_gpu_types=True,
            topology=rack,
        ),
    )
    assert reply.results[0].accepted, reply.results[0].error
    # Neither ten RTX 4090s nor two A100s are in the rack: one A100 and five RTX 4090s are.
    bind = schedule(client)["m"]
    assert dict(bind.gpus_by_type) == {"a100-80gb": 1.0, "rtx4090-24gb": 5.0}
    assert (bind.gpu_type, bind.gpus, bind.cu) == ("a100-80gb", 6.0, 20.0)
    assert sorted(p.node for p in bind.pods) == ["a1", "r1", "r1", "r1", "r1", "r1"]


def test_pods_on_distinct_nodes_travel_and_are_placed_one_per_node(client: GpufairClient) -> None:
    """A multi-node job asks for distinct nodes: ListWorkloads returns the field as sent, and
    Schedule puts its two pods on r1 and r2 where binpack alone would put both on r1."""
    client.apply_config(parse_config(CONFIG))
    job = pb.Workload(
        uid="two-nodes",
        queue="team",
        pool="main",
        pods=2,
        gpus_per_pod=4,
        allowed_gpu_types=["rtx4090-24gb"],
        pods_on_distinct_nodes=True,
    )
    assert submit(client, job).results[0].accepted
    [listed] = client.list_workloads(pool="main")
    assert listed.workload.pods_on_distinct_nodes is True
    bind = schedule(client)["two-nodes"]
    assert sorted(p.node for p in bind.pods) == ["r1", "r2"]
    assert [len(p.gpu_indices) for p in bind.pods] == [4, 4]


def test_list_workloads_says_which_slice_a_partition_is_bound_to_and_runs_on(
    client: GpufairClient,
) -> None:
    """ListWorkloads gives a partition's first memory slice as Schedule's bind gave it, and as
    the batch system reported it once it runs: without it a controller cannot tell the MIG
    instances of one GPU apart."""
    client.apply_config(parse_config(CONFIG))
    submit(
        client,
        pb.Workload(uid="small", queue="team", pool="main", pods=3, partition_profile="1g.10gb"),
    )
    binds = schedule(client)

    def listed() -> list[tuple[str, int, int | None]]:
        [status] = client.list_workloads()
        return [
            (p.node, p.gpu_indices[0], p.partition_start if p.HasField("partition_start") else None)
            for p in status.pods
        ]

    assert listed() == [(p.node, p.gpu_indices[0], p.partition_start) for p in binds["small"].pods]
    moved = [
        ledger_pb2.EventPod(node="a1", gpu_indices=[0], gpu_fraction=1 / 7, partition_start=s)
        for s in (0, 1, 2)
    ]
    reply = client.report_events([started("small", moved)])
    assert [r.status for r in reply.results] == [ledger_pb2.EVENT_STATUS_STORED]
    assert listed() == [("a1", 0, 0), ("a1", 0, 1), ("a1", 0, 2)]
