"""The serving type of waiting work (`domain.demand.serving_types`): what the fair share counts
as a queue's demand, and what it leaves out because the pool could never run it."""

from __future__ import annotations

from gpufair.domain.demand import queue_demands, serving_types
from gpufair.domain.model import GpuType, Node, TopologyConstraint, Workload

A100 = GpuType("a100-80gb", 80, 10)
L4 = GpuType("l4-24gb", 24, 3)
TYPES = {t.name: t for t in (A100, L4)}


def _node(name: str, gpu_type: GpuType, gpus: int, rack: str, ready: bool = True) -> Node:
    return Node(name, "p", gpu_type.name, gpus, 64000, 512000, {"rack": rack}, ready)


# Two racks of two 8-GPU A100 nodes, one 4-GPU L4 node, one 8-GPU A100 node not ready.
NODES = (
    _node("a0", A100, 8, "r1"),
    _node("a1", A100, 8, "r1"),
    _node("a2", A100, 8, "r2"),
    _node("a3", A100, 8, "r2"),
    _node("l0", L4, 4, "r1"),
    _node("a4", A100, 8, "r3", ready=False),
)


def _work(uid: str, queue: str, pods: int, gpus: float, **extra: object) -> Workload:
    return Workload(uid, queue, "p", pods=pods, gpus_per_pod=gpus, submit_time_s=0.0, **extra)  # type: ignore[arg-type]


def test_the_cheapest_ready_type_that_serves_the_work() -> None:
    serving = serving_types(TYPES, NODES)
    assert serving(_work("w1", "q", 1, 1)) == "l4-24gb"  # 3 CU against 10
    assert serving(_work("w2", "q", 1, 1, min_gpu_memory_gib=40)) == "a100-80gb"
    assert serving(_work("w3", "q", 1, 8)) == "a100-80gb"  # no L4 node has 8 GPUs


def test_work_the_pool_could_never_hold_serves_on_no_type() -> None:
    serving = serving_types(TYPES, NODES)
    # A pod of 16 GPUs: no node has 16.
    assert serving(_work("wide", "q", 1, 16)) is None
    # 6 nodes' worth of A100 pods as one gang: the pool has 5 A100 nodes, ready or not.
    assert serving(_work("big-gang", "q", 6, 8)) is None
    # 5 such pods fit the hardware (a4 counts, as the cycle's never-fits check counts it).
    assert serving(_work("five", "q", 5, 8)) == "a100-80gb"
    # 3 nodes' worth in one rack, which has 2 ready A100 nodes (r3's one node is not enough).
    rack = TopologyConstraint("rack", required=True)
    assert serving(_work("rack-gang", "q", 3, 8, topology=rack)) is None
    assert serving(_work("rack-pair", "q", 2, 8, topology=rack)) == "a100-80gb"


def test_a_type_with_no_ready_node_serves_nothing() -> None:
    only_down = serving_types(TYPES, (_node("a4", A100, 8, "r3", ready=False),))
    assert only_down(_work("w", "q", 1, 1)) is None


def test_never_fitting_work_is_no_demand() -> None:
    """Queue q1 waits for one 8-GPU pod (80 CU) and a 16-GPU pod no node holds; q2 for two
    L4 GPUs. Only the first and the last are demand."""
    waiting = [
        _work("fits", "q1", 1, 8),
        _work("wide", "q1", 1, 16),
        _work("small", "q2", 2, 1),
    ]
    held = [("q2", "l4-24gb", 1.0)]
    demands = queue_demands(["q1", "q2"], held, waiting, serving_types(TYPES, NODES))
    assert demands["q1"].pending_gpus_by_type == {"a100-80gb": 8.0}
    assert demands["q2"].pending_gpus_by_type == {"l4-24gb": 2.0}
    assert demands["q2"].allocated_gpus_by_type == {"l4-24gb": 1.0}
