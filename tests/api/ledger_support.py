"""Builders for ledger tests: a small cluster, workloads and events as the API takes them."""

from __future__ import annotations

import uuid

from gpufair.client import GpufairClient
from gpufair.config_file import parse_config
from gpufair.v1 import cluster_pb2, ledger_pb2, scheduler_pb2

# 2 nodes x 8 A100 (10 CU each) and 1 node x 4 RTX 4090 (2 CU each): 168 CU.
CLUSTER = {
    "gpu_types": [
        {"name": "a100", "memory_gib": 80, "compute_weight": 10},
        {"name": "rtx4090", "memory_gib": 24, "compute_weight": 2},
    ],
    "pools": [{"name": "main", "policy": {"window_s": "7d", "k": 1}}],
    "nodes": [
        {
            "name": "a1",
            "pool": "main",
            "gpu_type": "a100",
            "gpu_count": 8,
            "cpu_millicores": 64000,
            "memory_mib": 524288,
        },
        {
            "name": "a2",
            "pool": "main",
            "gpu_type": "a100",
            "gpu_count": 8,
            "cpu_millicores": 64000,
            "memory_mib": 524288,
        },
        {
            "name": "r1",
            "pool": "main",
            "gpu_type": "rtx4090",
            "gpu_count": 4,
            "cpu_millicores": 32000,
            "memory_mib": 131072,
        },
    ],
    "queues": [
        {"name": "llm", "quotas": [{"pool": "main", "deserved_cu": 80}]},
        {"name": "vision", "quotas": [{"pool": "main", "deserved_cu": 40}]},
    ],
}


def cluster() -> cluster_pb2.ClusterConfig:
    return parse_config(CLUSTER)


def submit(
    client: GpufairClient, uid: str, queue: str = "llm", pods: int = 1, gpus: float = 1
) -> None:
    reply = client.call(
        client.scheduler.SubmitWorkloads,
        scheduler_pb2.SubmitWorkloadsRequest(
            workloads=[
                scheduler_pb2.Workload(
                    uid=uid, queue=queue, pool="main", pods=pods, gpus_per_pod=gpus
                )
            ]
        ),
    )
    assert reply.results[0].accepted, reply.results[0].error


def event(
    kind: int,
    uid: str,
    at_s: float,
    pods: list[tuple[str, list[int], float]] | None = None,
    event_id: str | None = None,
) -> ledger_pb2.LedgerEvent:
    msg = ledger_pb2.LedgerEvent(
        event_id=event_id or str(uuid.uuid4()),
        workload_uid=uid,
        kind=kind,  # type: ignore[arg-type]
    )
    msg.occurred_at.FromNanoseconds(round(at_s * 1e9))
    for node, indices, fraction in pods or []:
        msg.pods.add(node=node, gpu_indices=indices, gpu_fraction=fraction)
    return msg


def report(client: GpufairClient, *events: ledger_pb2.LedgerEvent) -> list[ledger_pb2.EventResult]:
    reply = client.call(client.ledger.ReportEvents, ledger_pb2.ReportEventsRequest(events=events))
    return list(reply.results)


STARTED = ledger_pb2.EVENT_KIND_STARTED
STOPPED = ledger_pb2.EVENT_KIND_STOPPED
HEARTBEAT = ledger_pb2.EVENT_KIND_HEARTBEAT
PREEMPTED = ledger_pb2.EVENT_KIND_PREEMPTED
NODE_CAPACITY = ledger_pb2.EVENT_KIND_NODE_CAPACITY
STORED = ledger_pb2.EVENT_STATUS_STORED
DUPLICATE = ledger_pb2.EVENT_STATUS_DUPLICATE
REJECTED = ledger_pb2.EVENT_STATUS_REJECTED
