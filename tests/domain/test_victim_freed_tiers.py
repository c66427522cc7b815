"""The bound of a full node for pods of several whole GPUs (`VictimIndex.freed_tiers`): the tier
it takes to have `k` GPUs free, so a search for a pod of four GPUs does not score the nodes
whose lowest tier frees one GPU but not four, and picks what the bound by one GPU's tier
picks."""

from __future__ import annotations

from gpufair.domain.capacity import Capacity, PodUse
from gpufair.domain.model import Node, PlacementStrategy
from gpufair.domain.placement import Ask, Exclusion, PodShape
from gpufair.domain.victim_index import NEVER
from gpufair.domain.victim_search import Victim, VictimBudget, VictimIndex, select_victims

NODES = 40
LOW = 39  # the one node whose four GPUs are all held by tier-0 victims


def _pool() -> tuple[Capacity, list[Victim]]:
    """40 full nodes of 4 GPUs, one-GPU victims: on every node but `LOW`, GPU 0 is held by a
    tier-0 victim and GPUs 1-3 by tier-1 victims; on `LOW`, all four by tier-0 victims, which
    started earliest (so its floor sorts last among the tier-0 floors)."""
    capacity = Capacity(Node(f"n{i}", "p", "a100", 4, 64_000, 512_000) for i in range(NODES))
    victims = []
    for node in range(NODES):
        for gpu in range(4):
            use = PodUse(node, (gpu,), 1.0, 1_000, 1_000)
            capacity.take((use,))
            tier = 0 if node == LOW or gpu == 0 else 1
            started_at_s = 1_000.0 + node * 10 + gpu if node != LOW else float(gpu)
            victims.append(
                Victim(
                    f"v{node}-{gpu}", "q", tier, 0, started_at_s, 10.0, 1.0, "a100", (use,), (node,)
                )
            )
    return capacity, victims


def test_a_node_is_bounded_by_the_tier_it_takes_to_free_a_pods_gpus() -> None:
    capacity, victims = _pool()
    index = VictimIndex(victims, capacity)
    # Kept where the tiers rise only (`LOW`'s are all 0).
    assert index.freed_tiers[0] == (0, 1, 1, 1) and LOW not in index.freed_tiers
    # One GPU's tier is 0 on every node; four GPUs' is 1 but on `LOW`.
    assert {index.floor(node, 1)[0] for node in range(NODES)} == {0}
    assert [index.floor(node, 4)[0] for node in range(NODES)] == [1] * LOW + [0]
    assert index.floor(0, 2)[0] == 1
    # A node that can no longer have four GPUs free has no tier for four.
    index.remove(victims[LOW * 4 + 3])
    assert index.freeable_on_node[LOW] == 3 and LOW not in index.freed_tiers
    assert index.floor(LOW, 4)[0] == NEVER and index.floor(LOW, 3)[0] == 0


def test_a_four_gpu_reclaim_scores_the_node_it_picks_only() -> None:
    capacity, victims = _pool()
    index = VictimIndex(victims, capacity)
    shape = PodShape(4.0, 0, 0)
    found = select_victims(
        capacity,
        Ask(shape, "a100", 1, 1),
        PlacementStrategy.BINPACK,
        Exclusion(),
        index=index,
        budget=VictimBudget({"q": 1_000.0}, {}),
    )
    assert found is not None
    # The only tier-0 option: all of `LOW`'s victims, the pod on `LOW`.
    assert sorted(victim.uid for victim in found.victims) == [f"v{LOW}-{gpu}" for gpu in range(4)]
    assert [use.node for use in found.plan] == [LOW]
    # Bounded by one GPU's tier, the 39 other nodes (tier-0 floors sorting before `LOW`'s)
    # would each have been scored (a tier-1 option) first: one option scored here.
    assert len(index.option_table(shape, None, True)) == 1
