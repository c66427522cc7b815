"""The walk of full nodes for pods of several whole GPUs (`VictimIndex.walk_order(k)`): a node
sorts by the tier it takes to have `k` GPUs free, so a search for a pod of four GPUs does not
score the nodes whose lowest tier frees one GPU but not four, and picks what the walk by one
GPU's tier picks."""

from __future__ import annotations

from gpufair.domain.capacity import Capacity, PodUse
from gpufair.domain.model import Node, PlacementStrategy
from gpufair.domain.placement import Ask, Exclusion, PodShape
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


def test_a_node_sorts_by_the_tier_it_takes_to_free_a_pods_gpus() -> None:
    capacity, victims = _pool()
    index = VictimIndex(victims, capacity)
    one, four = index.walk_order(1), index.walk_order(4)
    # By one GPU's tier every node is tier 0, `LOW` last (its first victim started earliest).
    assert [key[0] for key in one] == [0] * NODES and one[-1][4] == LOW
    # By four GPUs' tier only `LOW` is tier 0: it comes first.
    assert four[0][:1] == (0,) and four[0][4] == LOW
    assert [key[0] for key in four[1:]] == [1] * (NODES - 1)
    # A node that can no longer have four GPUs free leaves that walk, not the one-GPU walk.
    index.remove(victims[LOW * 4 + 3])
    assert LOW not in [key[4] for key in index.walk_order(4)]
    assert index.walk_order(1)[-1][4] == LOW


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
    # Walked by one GPU's tier, the 39 other nodes (tier-0 floors sorting before `LOW`'s) would
    # each have been scored (a tier-1 option) first: one option scored here.
    assert len(index.option_table(shape, None, True)) == 1
