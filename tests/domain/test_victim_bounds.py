"""The victim search's "what could a node free" bound (`VictimIndex.gain_test`): a node where
one pod would not fit even with every victim on it gone is never scored, and the bound follows
the node's victims as they are evicted."""

from __future__ import annotations

from gpufair.domain.capacity import Capacity, PodUse
from gpufair.domain.model import Node
from gpufair.domain.placement import PodShape
from gpufair.domain.victim_search import Victim, VictimIndex


def _victim(uid: str, use: PodUse, started_at_s: float) -> Victim:
    gpus = use.gpu_amount * len(use.gpu_indices)
    return Victim(uid, "q", 0, 0, started_at_s, 10.0 * gpus, gpus, "a100", (use,), (use.node,))


def test_a_node_is_a_candidate_only_for_pods_its_victims_could_make_room_for() -> None:
    nodes = [Node("n0", "p", "a100", 8, 64_000, 512_000)]
    capacity = Capacity(nodes)
    fixed = PodUse(0, (0, 1, 2, 3, 4, 5), 1.0, 8_000, 8_000)  # not a victim: 6 GPUs
    two = PodUse(0, (6,), 1.0, 1_000, 1_000)
    three = PodUse(0, (7,), 0.5, 1_000, 1_000)  # half of GPU 7
    other_half = PodUse(0, (7,), 0.5, 1_000, 1_000)  # not a victim: the other half
    capacity.take((fixed, two, three, other_half))
    first, second = _victim("v1", two, 100.0), _victim("v2", three, 200.0)
    index = VictimIndex([first, second], capacity)

    # With both victims gone: GPU 6 is free, GPU 7 half used; 55 of 64 cores free.
    used, free_whole, cpu, memory = index.gone_on_node[0]
    assert (used, free_whole, cpu, memory) == ([1.0] * 6 + [0.0, 0.5], 1, 55_000, 503_000)
    assert index.gain_test(PodShape(1.0, 0, 0))(0) is True
    assert index.gain_test(PodShape(2.0, 0, 0))(0) is False  # one GPU at most
    assert index.gain_test(PodShape(0.5, 0, 0))(0) is True
    assert index.gain_test(PodShape(0.5, 60_000, 0))(0) is False  # CPU: 55,000 at most

    # The whole-GPU victim evicted: nothing frees a whole GPU any more; half a GPU still.
    index.remove(first)
    assert index.gain_test(PodShape(1.0, 0, 0))(0) is False
    assert index.gain_test(PodShape(0.5, 0, 0))(0) is True
    index.remove(second)
    assert 0 not in index.floor_on_node and 0 not in index.gone_on_node
