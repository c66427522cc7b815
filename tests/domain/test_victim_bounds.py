"""The victim search's "what could a node free" bound (`VictimIndex.freeable_on_node`): a node
whose victims could not free one pod's whole GPUs is never scored for that pod, and the bound
follows the node's victims as they are evicted."""

from __future__ import annotations

from gpufair.domain.capacity import Capacity, PodUse
from gpufair.domain.model import Node, PlacementStrategy
from gpufair.domain.placement import Ask, Exclusion, PodShape
from gpufair.domain.victim_search import Victim, VictimBudget, VictimIndex, select_victims


def _victim(uid: str, use: PodUse, started_at_s: float) -> Victim:
    gpus = use.gpu_amount * len(use.gpu_indices)
    return Victim(uid, "q", 0, 0, started_at_s, 10.0 * gpus, gpus, "a100", (use,), (use.node,))


def test_a_node_is_a_candidate_only_for_pods_its_victims_could_make_room_for() -> None:
    nodes = [Node("n0", "p", "a100", 8, 64_000, 512_000)]
    capacity = Capacity(nodes)
    fixed = PodUse(0, (0, 1, 2, 3, 4, 5), 1.0, 8_000, 8_000)  # not a victim: 6 GPUs
    whole = PodUse(0, (6,), 1.0, 1_000, 1_000)
    half = PodUse(0, (7,), 0.5, 1_000, 1_000)  # half of GPU 7
    other_half = PodUse(0, (7,), 0.5, 1_000, 1_000)  # not a victim: the other half
    capacity.take((fixed, whole, half, other_half))
    first, second = _victim("v1", whole, 100.0), _victim("v2", half, 200.0)
    index = VictimIndex([first, second], capacity)
    # With both victims gone only GPU 6 is wholly free (GPU 7 keeps its other half).
    assert index.freeable_on_node == {0: 1}

    def search(gpus_per_pod: float) -> list[str] | None:
        found = select_victims(
            capacity,
            Ask(PodShape(gpus_per_pod, 0, 0), "a100", 1, 1),
            PlacementStrategy.BINPACK,
            Exclusion(),
            index=index,
            budget=VictimBudget({"q": 100.0}, {}),
        )
        return None if found is None else [victim.uid for victim in found.victims]

    assert search(1.0) == ["v1"]
    assert search(2.0) is None  # one GPU at most: never scored
    index.remove(first)
    assert index.freeable_on_node == {0: 0}
    assert search(1.0) is None
    index.remove(second)
    assert index.freeable_on_node == {} and index.floor_on_node == {}
