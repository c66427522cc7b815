"""The cheaper building blocks of loading a cycle give what the plain ones give: a binding built
through its slots, a one-pod take, and the empty pool's room counted per class of hardware."""

from __future__ import annotations

import dataclasses

import pytest

from gpufair.domain.capacity import Capacity, PodUse
from gpufair.domain.model import Node, PodBinding, Workload, pod_binding
from gpufair.domain.placement_ask import PodShape
from gpufair.domain.placement_domain import PoolRoom
from gpufair.domain.placement_fit import pods_fit_empty


def _node(name: str, gpus: int, cpu: int = 64_000, memory: int = 512_000, rack: str = "") -> Node:
    labels = {"rack": rack} if rack else {}
    return Node(name, "p", "a100", gpus, cpu, memory, labels=labels)


def test_pod_binding_is_the_same_value_as_the_dataclass_built_one() -> None:
    built = pod_binding(2, "n7", (3, 4), 1.0, None)
    plain = PodBinding(pod_index=2, node="n7", gpu_indices=(3, 4))
    assert built == plain
    assert hash(built) == hash(plain)
    assert repr(built) == "PodBinding(pod_index=2, node='n7', gpu_indices=(3, 4), " + (
        "gpu_fraction=1.0, partition_start=None)"
    )
    shared = pod_binding(0, "n1", (5,), 0.25, 3)
    assert shared == PodBinding(0, "n1", (5,), 0.25, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.node = "n8"  # type: ignore[misc]


def _state(capacity: Capacity) -> list[object]:
    return [
        [
            (
                state.gpu_used,
                state.free_whole,
                state.partial_gpus,
                state.cpu_free,
                state.memory_free,
            )
            for state in capacity.nodes
        ],
        [list(capacity.bucket("a100", free)) for free in range(9)],
        list(capacity.partial_nodes("a100")),
        dict(capacity.free_whole_by_type),
    ]


def test_take_one_changes_the_capacity_and_its_bucket_order_as_take_does() -> None:
    nodes = [_node(f"n{i}", 8) for i in range(4)]
    uses = [
        PodUse(1, (0, 1), 1.0, 1_000, 2_000),  # n1 8 → 6 free GPUs
        PodUse(2, (0,), 0.5, 500, 1_000),  # a share: n2 part-used, 7 free
        PodUse(0, (0, 1), 1.0, 0, 0),  # n0 8 → 6, after n1 in bucket 6
        PodUse(2, (0,), 0.5, 0, 0),  # n2's shared GPU now full: no longer part-used
        PodUse(1, (2,), 1.0, 0, 0),  # n1 6 → 5
        PodUse(3, (), 0.0, 100, 100),  # CPU and memory only
    ]
    one, plain = Capacity(nodes), Capacity(nodes)
    for use in uses:
        before = [state.version for state in one.nodes]
        one.take_one(use)
        plain.take((use,))
        assert _state(one) == _state(plain)
        # The node's state is a new one (the victim search keeps options per node version).
        after = [state.version for state in one.nodes]
        changed = [i for i in range(len(nodes)) if after[i] != before[i]]
        assert changed == [use.node] and after[use.node] == one.version
    assert [list(one.bucket("a100", free)) for free in (5, 6, 7, 8)] == [[1], [0], [2], [3]]
    assert one.free_whole_by_type["a100"] == 5 + 6 + 7 + 8
    assert one.nodes[1].cpu_free == 63_000


def test_pool_room_counts_each_class_of_hardware_as_its_nodes_one_by_one() -> None:
    nodes = [
        _node("a", 8, rack="r1"),
        _node("b", 8, rack="r1"),
        _node("c", 4, rack="r2"),
        _node("d", 8, cpu=8_000, rack="r2"),  # CPU-bound: 2 pods of 4,000 millicores
        _node("e", 8, rack="r2"),
        _node("f", 8),  # no rack: in no domain
    ]
    capacity = Capacity(nodes)
    room = PoolRoom(capacity)
    for gpus, cpu in ((1.0, 4_000), (2.0, 0), (0.5, 0), (8.0, 0)):
        workload = Workload("w", "q", "p", 1, gpus, 0.0, cpu_millicores_per_pod=cpu)
        shape = PodShape.of(workload)
        one_by_one = sum(pods_fit_empty(state, shape) for state in capacity.nodes)
        assert room.room("a100", shape, None) == one_by_one
        racks = {
            rack: sum(pods_fit_empty(capacity.nodes[i], shape) for i in members)
            for rack, members in capacity.domains("rack")["a100"].items()
        }
        assert room.room("a100", shape, "rack") == max(racks.values())
    one_gpu = PodShape.of(Workload("w", "q", "p", 1, 1.0, 0.0, cpu_millicores_per_pod=4_000))
    # a, b, e: 8 each; c: 4; d: 2 (CPU); f: 8; rack r1 holds 16, r2 holds 4 + 2 + 8 = 14
    assert room.room("a100", one_gpu, None) == 38
    assert room.room("a100", one_gpu, "rack") == 16
