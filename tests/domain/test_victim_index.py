"""The victim index kept across searches (`VictimIndex`): its walk of full nodes stays the walk
a fresh index would make as victims leave, however many leave between two searches, and a
search leaves the capacity and the budget it was given as it found them."""

from __future__ import annotations

from gpufair.domain.capacity import Capacity, PodUse
from gpufair.domain.model import Node, PlacementStrategy, TopologyConstraint
from gpufair.domain.placement import Ask, Exclusion, PodShape
from gpufair.domain.victim_search import Victim, VictimBudget, VictimIndex, select_victims


def _pool(nodes: int, labels: bool = False) -> Capacity:
    return Capacity(
        Node(
            f"n{i}",
            "p",
            "a100",
            4,
            64_000,
            512_000,
            {"rack": f"r{i // 4}"} if labels else {},
        )
        for i in range(nodes)
    )


def _fill(capacity: Capacity, nodes: int, queue: str = "q") -> list[Victim]:
    """Every GPU of every node held by a one-GPU victim; CU per GPU and start vary by node."""
    victims = []
    for node in range(nodes):
        for gpu in range(4):
            use = PodUse(node, (gpu,), 1.0, 1_000, 1_000)
            capacity.take((use,))
            cu = 10.0 + (node * 7 + gpu * 3) % 11
            victims.append(
                Victim(
                    f"v{node}-{gpu}",
                    queue,
                    node % 3,
                    gpu % 2,
                    1_000.0 + node * 13 + gpu,
                    cu,
                    1.0,
                    "a100",
                    (use,),
                    (node,),
                )
            )
    return victims


def test_the_walk_after_evictions_is_the_walk_of_an_index_made_afresh() -> None:
    capacity = _pool(40)
    victims = _fill(capacity, 40)
    index = VictimIndex(victims, capacity)
    assert len(index.walk_order(True)) == len(index.walk_order(False)) == 40
    # A few leave (each walk patched), then many at once (each walk sorted again).
    gone = 0
    for count in (6, 114):
        for victim in victims[gone : gone + count]:
            index.remove(victim)
        gone += count
        fresh = VictimIndex(victims[gone:], capacity)
        for whole_gpus in (True, False):
            assert index.walk_order(whole_gpus) == fresh.walk_order(whole_gpus)
    # 120 of 160 victims gone: nodes 0-29 have none left, 10 nodes remain in each walk.
    assert len(index.walk_order(True)) == 10
    assert index.walk_order(True)[0][-1] >= 30


def test_a_search_leaves_the_capacity_and_the_budget_as_it_found_them() -> None:
    capacity = _pool(8)
    victims = _fill(capacity, 8, queue="lender")
    index = VictimIndex(victims, capacity)
    budget = VictimBudget({"lender": 25.0}, {})
    before = [list(state.gpu_used) for state in capacity.nodes]
    found = select_victims(
        capacity,
        Ask(PodShape(2.0, 0, 0), "a100", 1, 1),
        PlacementStrategy.BINPACK,
        Exclusion(),
        index=index,
        budget=budget,
    )
    assert found is not None
    # Two GPUs of one node, within the lender's 25 CU.
    assert len(found.victims) == 2 and len({v.nodes for v in found.victims}) == 1
    assert found.cu <= 25.0
    assert budget.cu_left == {"lender": 25.0}
    assert [list(state.gpu_used) for state in capacity.nodes] == before
    # A budget that allows less than two victims anywhere finds nothing.
    assert (
        select_victims(
            capacity,
            Ask(PodShape(2.0, 0, 0), "a100", 1, 1),
            PlacementStrategy.BINPACK,
            Exclusion(),
            index=index,
            budget=VictimBudget({"lender": 15.0}, {}),
        )
        is None
    )


def test_a_required_domain_is_searched_only_where_victims_or_free_gpus_are() -> None:
    capacity = _pool(12, labels=True)  # racks r0, r1, r2 of four nodes each
    victims = _fill(capacity, 12)
    # Only rack r2's victims are offered: a gang of four 4-GPU pods can go only there.
    index = VictimIndex([v for v in victims if v.nodes[0] >= 8], capacity)
    found = select_victims(
        capacity,
        Ask(PodShape(4.0, 0, 0), "a100", 4, 4, TopologyConstraint("rack", required=True)),
        PlacementStrategy.BINPACK,
        Exclusion(),
        index=index,
        budget=VictimBudget({"q": 1_000.0}, {}),
    )
    assert found is not None
    assert sorted({use.node for use in found.plan}) == [8, 9, 10, 11]
    assert len(found.victims) == 16
