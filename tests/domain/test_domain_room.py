"""A topology domain's room for whole-GPU pods (`placement_domain._choose_domain`, which counts
them without `fit_on`'s call): CPU, memory and one pod per node bound a node's pods as the free
GPUs do, so binpack's tightest domain is the one those bounds leave tightest."""

from __future__ import annotations

from gpufair.domain.capacity import Capacity
from gpufair.domain.model import Node, PlacementStrategy, TopologyConstraint
from gpufair.domain.placement import place
from gpufair.domain.placement_ask import Ask, Exclusion, PodShape

RACK = TopologyConstraint("rack", required=True)


def _racks(cpu_r1: int, memory_r1: int) -> Capacity:
    """Rack r1: nodes a1, a2 of 8 GPUs with `cpu_r1` millicores and `memory_r1` MiB each;
    rack r2: node b1 of 8 GPUs with 64,000 millicores and 512,000 MiB."""
    nodes = [
        Node("a1", "p", "a100", 8, cpu_r1, memory_r1, {"rack": "r1"}),
        Node("a2", "p", "a100", 8, cpu_r1, memory_r1, {"rack": "r1"}),
        Node("b1", "p", "a100", 8, 64_000, 512_000, {"rack": "r2"}),
    ]
    return Capacity(nodes)


def _racked(capacity: Capacity, shape: PodShape, pods: int) -> list[str]:
    plan = place(
        capacity,
        Ask(shape, "a100", pods, pods, RACK),
        PlacementStrategy.BINPACK,
        Exclusion(),
    )
    assert plan is not None
    return sorted(capacity.nodes[use.node].name for use in plan)


def test_gpus_alone_make_the_single_node_rack_the_tightest() -> None:
    # 2 pods of 2 GPUs: r1 holds 8 (4 a node), r2 holds 4: r2 is tightest.
    capacity = _racks(64_000, 512_000)
    assert _racked(capacity, PodShape(2.0, 8_000, 64_000), 2) == ["b1", "b1"]


def test_cpu_bounds_a_node_to_one_pod_and_makes_its_rack_the_tightest() -> None:
    # 12,000 millicores hold one pod of 8,000: r1 holds 2 (1 a node), r2 holds 4: r1.
    capacity = _racks(12_000, 512_000)
    assert _racked(capacity, PodShape(2.0, 8_000, 64_000), 2) == ["a1", "a2"]


def test_memory_bounds_a_node_as_cpu_does() -> None:
    # 100,000 MiB hold one pod of 64,000 MiB: r1 holds 2, r2 holds 4 (by GPUs): r1.
    capacity = _racks(64_000, 100_000)
    assert _racked(capacity, PodShape(2.0, 8_000, 64_000), 2) == ["a1", "a2"]


def test_one_pod_per_node_leaves_a_single_node_rack_too_small() -> None:
    # Distinct nodes: r2 holds 1 pod, short of 2; r1 holds 2: r1, one pod on each node.
    capacity = _racks(64_000, 512_000)
    shape = PodShape(2.0, 8_000, 64_000, one_per_node=True)
    assert _racked(capacity, shape, 2) == ["a1", "a2"]
