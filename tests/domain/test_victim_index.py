"""The victim index kept across searches (`VictimIndex`): its walk of full nodes stays the walk
a fresh index would make as victims leave, however many leave between two searches, and a
search leaves the capacity and the budget it was given as it found them."""

from __future__ import annotations

from gpufair.domain.capacity import Capacity, PodUse
from gpufair.domain.model import Node, PlacementStrategy, TopologyConstraint
from gpufair.domain.placement import Ask, Exclusion, PodShape
from gpufair.domain.victim_search import (
    Victim,
    VictimBudget,
    VictimIndex,
    _subsets,
    select_victims,
)


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


def test_domains_rank_most_free_first_then_those_with_victims_alone_by_name() -> None:
    capacity = _pool(48, labels=True)  # racks r0 .. r11 of four nodes each
    victims = _fill(capacity, 48)
    # Rack r7 gets 3 free GPUs (node 28), rack r5 two (node 20); every other GPU has a victim.
    for victim in victims:
        if victim.uid in ("v28-0", "v28-1", "v28-2", "v20-2", "v20-3"):
            capacity.release(victim.uses)
    index = VictimIndex(
        [v for v in victims if v.uid not in ("v28-0", "v28-1", "v28-2", "v20-2", "v20-3")], capacity
    )
    assert index.domain_gpus("rack")["r3"] == 16.0  # counted at the first ask, then kept
    # Rack r3's victims all leave: 0 GPUs of victims, no free GPU, it cannot hold the gang.
    for victim in [v for v in victims if 12 <= v.nodes[0] < 16]:
        index.remove(victim)
    assert index.domain_gpus("rack")["r3"] == 0.0
    assert index.domain_order("rack") == sorted(f"r{i}" for i in range(12))
    ask = Ask(PodShape(2.0, 0, 0), "a100", 2, 2, TopologyConstraint("rack", required=True))
    racks = [
        capacity.nodes[subset[0]].labels["rack"]
        for subset in _subsets(capacity, ask, Exclusion(), index)
        if subset is not None
    ]
    # Free GPUs first (r7: 3, r5: 2), then the rest by name ("r10" before "r2"), r3 left out.
    assert racks == ["r7", "r5", "r0", "r1", "r10", "r11", "r2", "r4", "r6", "r8", "r9"]


def test_prune_drops_what_its_budget_no_longer_covers_after_some_of_the_largest_left() -> None:
    capacity = _pool(1)
    cus = {"big1": 20.0, "big2": 20.0, "big3": 20.0, "small1": 10.0, "small2": 10.0}
    victims = []
    for gpu, (uid, cu) in enumerate(cus.items()):
        use = PodUse(0, (gpu % 4,), 0.25, 1_000, 1_000)
        capacity.take((use,))
        victims.append(Victim(uid, "q", 0, 0, 1_000.0 + gpu, cu, 0.25, "a100", (use,), (0,)))
    index = VictimIndex(victims, capacity)
    index.prune("q", 25.0)  # 20 CU at most: nothing goes
    assert len(index.by_queue["q"]) == 5
    index.remove(victims[0])  # one of the three 20-CU victims leaves
    index.prune("q", 15.0)  # the other two no longer fit the budget
    assert sorted(v.uid for v in index.by_queue["q"]) == ["small1", "small2"]
    index.prune("q", 12.0)  # 10 CU each: both stay
    assert len(index.by_queue["q"]) == 2
    index.prune("q", 9.0)
    assert "q" not in index.by_queue or not index.by_queue["q"]
    assert index.total_gpus == 0.0
