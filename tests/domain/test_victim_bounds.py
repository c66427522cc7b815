"""The victim search's bounds of what a node could free: a node whose victims could not free one
pod's whole GPUs is never scored for that pod (`VictimIndex.freeable_on_node`), and the bound
follows the node's victims as they are evicted; a node whose tier to free a pod's GPUs is above
the answer is not scored either (`VictimIndex.whole_tier`)."""

from __future__ import annotations

from cycle_builders import victims_found

from gpufair.domain.capacity import Capacity, PodUse
from gpufair.domain.model import Node
from gpufair.domain.placement_ask import PodShape
from gpufair.domain.victim_index import NEVER
from gpufair.domain.victim_search import Victim, VictimIndex


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
        return victims_found(capacity, index, PodShape(gpus_per_pod, 0, 0), {"q": 100.0})

    assert search(1.0) == ["v1"]
    assert search(2.0) is None  # one GPU at most: never scored
    index.remove(first)
    assert index.freeable_on_node == {0: 0}
    assert search(1.0) is None
    index.remove(second)
    assert index.freeable_on_node == {} and index.floor_on_node == {}


def test_a_pod_of_several_gpus_reads_no_node_whose_tier_to_free_them_is_above_the_answer() -> None:
    """Two full nodes, a pod of 4 GPUs. Node a frees one GPU at tier 0 but four only at tier 2;
    node b frees four at tier 1. The walk meets a first (its key has the one-GPU tier, 0); the
    search takes b, and a's option is never computed: its bound of tier 2 stays below b's."""
    nodes = [Node(name, "p", "a100", 8, 64_000, 512_000) for name in ("a", "b")]
    capacity = Capacity(nodes)
    cheap = PodUse(0, (0,), 1.0, 1_000, 1_000)
    dear = PodUse(0, (1, 2, 3), 1.0, 1_000, 1_000)
    middle = PodUse(1, (0, 1, 2, 3), 1.0, 1_000, 1_000)
    fixed = [PodUse(n, (4, 5, 6, 7), 1.0, 1_000, 1_000) for n in (0, 1)]  # not victims
    capacity.take((cheap, dear, middle, *fixed))

    def victim(uid: str, use: PodUse, tier: int) -> Victim:
        gpus = float(len(use.gpu_indices))
        return Victim(uid, "q", tier, 0, 100.0, 10.0 * gpus, gpus, "a100", (use,), (use.node,))

    index = VictimIndex(
        [victim("a0", cheap, 0), victim("a1", dear, 2), victim("b", middle, 1)], capacity
    )
    assert [index.whole_tier(0, n) for n in (1, 2, 3, 4, 5)] == [0, 2, 2, 2, NEVER]
    assert [index.whole_tier(1, n) for n in (1, 4, 5)] == [1, 1, NEVER]
    shape = PodShape(4.0, 0, 0)
    assert victims_found(capacity, index, shape, {"q": 1_000.0}) == ["b"]
    assert set(index.option_table(shape, None, True)) == {1}  # node b's option alone was read
