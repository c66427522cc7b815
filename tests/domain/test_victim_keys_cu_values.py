"""The victim index's keys hold each CU per GPU as one float object (`VictimIndex._cu_values`):
keys that tie on it compare that field by identity. The walks stay the walks of the keys'
values: the same as a fresh index's after evictions."""

from __future__ import annotations

from gpufair.domain.capacity import Capacity, PodUse
from gpufair.domain.model import Node
from gpufair.domain.victim_search import Victim, VictimIndex


def _pool_and_victims() -> tuple[Capacity, list[Victim]]:
    """Six nodes of four GPUs, each GPU held by a one-GPU victim; the CU per GPU is 10.0 on
    even nodes and 12.5 on odd ones (each value made afresh, per victim)."""
    capacity = Capacity(Node(f"n{i}", "p", "a100", 4, 64_000, 512_000, {}) for i in range(6))
    victims = []
    for node in range(6):
        for gpu in range(4):
            use = PodUse(node, (gpu,), 1.0, 1_000, 1_000)
            capacity.take((use,))
            cu = float(f"{10.0 + 2.5 * (node % 2)}")  # a float object of its own
            start = 1_000.0 + node * 13 + gpu
            victim = Victim(
                f"v{node}-{gpu}", "q", 0, gpu % 2, start, cu, 1.0, "a100", (use,), (node,)
            )
            victims.append(victim)
    return capacity, victims


def test_keys_hold_each_cu_per_gpu_once() -> None:
    capacity, victims = _pool_and_victims()
    index = VictimIndex(victims, capacity)
    for whole_gpus in (False, True):
        walk = index.walk_order(whole_gpus)
        assert [key[4] for key in walk] == [4, 2, 0, 5, 3, 1]  # cheapest, then latest
        assert sorted({key[1] for key in walk}) == [10.0, 12.5]
        assert len({id(key[1]) for key in walk}) == 2
    # Victims leave: the keys made again keep the same objects, and the walk is a fresh
    # index's.
    gone = [victim for victim in victims if victim.uid in {"v4-0", "v4-1", "v1-0", "v2-3"}]
    for victim in gone:
        index.remove(victim)
    fresh = VictimIndex([victim for victim in victims if victim not in gone], capacity)
    for whole_gpus in (False, True):
        walk = index.walk_order(whole_gpus)
        assert walk == fresh.walk_order(whole_gpus)
        assert len({id(key[1]) for key in walk}) == 2


def test_walks_share_one_key_object_a_node_where_their_keys_agree() -> None:
    # Every node's victims are of tier 0 and hold whole GPUs: the key for whole-GPU pods and
    # the keys of the walks for pods of two and four GPUs are the floor's own tuple, not
    # copies of it (one tuple a node, not four), before and after victims leave.
    capacity, victims = _pool_and_victims()
    index = VictimIndex(victims, capacity)

    def shared() -> None:
        floors = index.floor_on_node
        assert all(index._whole_key[node] is floors[node] for node in floors)
        for gpus in (2, 4):
            walk = index.tier_walk_order(gpus)
            assert walk == sorted(
                floors[node] for node in floors if index.freeable_on_node[node] >= gpus
            )
            assert all(key is floors[key[4]] for key in walk)

    shared()
    for victim in victims:
        if victim.uid in {"v4-0", "v1-0", "v1-1", "v2-3"}:
            index.remove(victim)
    shared()
    assert index.freeable_on_node == {0: 4, 1: 2, 2: 3, 3: 4, 4: 3, 5: 4}
