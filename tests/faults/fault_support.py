"""Builders shared by the fault tests: a small cluster, workloads and events as the API takes
them, and how a failed call is told apart."""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence

import grpc

from gpufair.config_file import parse_config
from gpufair.v1 import cluster_pb2, ledger_pb2, scheduler_pb2

# What a caller of gpufair must never see, whatever fails underneath.
FORBIDDEN = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}


def serve_env() -> dict[str, str]:
    """The environment for `gpufair serve` children: the database comes from --database-url."""
    return {k: v for k, v in os.environ.items() if k != "GPUFAIR_DATABASE_URL"}


def cluster(
    pools: Sequence[str], nodes_per_pool: int, *, recompute_s: float = 60
) -> cluster_pb2.ClusterConfig:
    """`nodes_per_pool` nodes of 8 A100 in each pool, and two queues deserving a share of each."""
    gpus = 8 * nodes_per_pool
    return parse_config(
        {
            "gpu_types": [{"name": "a100", "memory_gib": 80, "compute_weight": 1}],
            "pools": [{"name": p, "policy": {"recompute_interval_s": recompute_s}} for p in pools],
            "nodes": [
                {
                    "name": f"{p}-n{i:03d}",
                    "pool": p,
                    "gpu_type": "a100",
                    "gpu_count": 8,
                    "cpu_millicores": 128000,
                    "memory_mib": 1048576,
                }
                for p in pools
                for i in range(nodes_per_pool)
            ],
            "queues": [
                {"name": q, "quotas": [{"pool": p, "deserved_cu": gpus * s} for p in pools]}
                for q, s in (("llm", 0.6), ("vision", 0.4))
            ],
        }
    )


def workloads(pool: str, count: int, prefix: str = "w") -> list[scheduler_pb2.Workload]:
    sizes = (1, 1, 2, 4, 8)
    return [
        scheduler_pb2.Workload(
            uid=f"{prefix}{i}",
            queue=("llm", "vision")[i % 2],
            pool=pool,
            pods=1 + (i % 3 == 0),
            gpus_per_pod=sizes[i % len(sizes)],
            cpu_millicores_per_pod=4000,
            memory_mib_per_pod=16384,
        )
        for i in range(count)
    ]


def run_events(
    uid: str, node: str, gpu: int, started_at_s: float, *, stop: bool = True
) -> list[ledger_pb2.LedgerEvent]:
    """A run as a batch system reports it: started on one GPU, a heartbeat, and (with `stop`)
    stopped a minute later."""
    kinds = [ledger_pb2.EVENT_KIND_STARTED, ledger_pb2.EVENT_KIND_HEARTBEAT]
    if stop:
        kinds.append(ledger_pb2.EVENT_KIND_STOPPED)
    events = []
    for k, kind in enumerate(kinds):
        msg = ledger_pb2.LedgerEvent(event_id=str(uuid.uuid4()), workload_uid=uid, kind=kind)
        msg.occurred_at.FromNanoseconds(round((started_at_s + 30 * k) * 1e9))
        if kind == ledger_pb2.EVENT_KIND_STARTED:
            msg.pods.add(node=node, gpu_indices=[gpu], gpu_fraction=1.0)
        events.append(msg)
    return events


def status_of(exc: grpc.RpcError) -> grpc.StatusCode:
    assert isinstance(exc, grpc.Call)
    code = exc.code()
    assert isinstance(code, grpc.StatusCode)
    return code
