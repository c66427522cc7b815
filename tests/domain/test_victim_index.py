"""The victim index kept across searches (`VictimIndex`): its walk of full nodes stays the walk
a fresh index would make as victims leave, however many leave between two searches, and a
search leaves the capacity and the budget it was given as it found them."""

from __future__ import annotations

from typing import Any

import pytest

from gpufair.domain import victim_index
from gpufair.domain.capacity import Capacity, PodUse
from gpufair.domain.model import Node, PlacementStrategy, TopologyConstraint
from gpufair.domain.placement_ask import Ask, Exclusion, PodShape
from gpufair.domain.victim_node_sets import node_sets
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


def test_a_walk_with_a_quarter_of_its_nodes_changed_is_patched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 40 nodes, the victims of 10 of them leaving one each (their keys change): each walk is
    # patched node by node (one insort per changed key, both walks: 20), not filtered and
    # sorted again, and equals a fresh index's.
    capacity = _pool(40)
    victims = _fill(capacity, 40)
    index = VictimIndex(victims, capacity)
    for whole_gpus in (True, False):
        index.walk_order(whole_gpus)
    inserted: list[tuple[int, float, int, float, int]] = []
    insort = victim_index.bisect.insort

    def counted(order: list[tuple[int, float, int, float, int]], key: Any) -> None:
        inserted.append(key)
        insort(order, key)

    monkeypatch.setattr(victim_index.bisect, "insort", counted)
    # Each node's first victim in preference order: its key is the node's in both walks.
    leaving = [next(iter(index.on_node[node])) for node in range(0, 40, 4)]
    for victim in leaving:
        index.remove(victim)
    fresh = VictimIndex([v for v in victims if v not in leaving], capacity)
    for whole_gpus in (True, False):
        assert index.walk_order(whole_gpus) == fresh.walk_order(whole_gpus)
    assert len(index.walk_order(True)) == 40
    assert len(inserted) == 20
    assert {key[4] for key in inserted} == {victim.nodes[0] for victim in leaving}


def test_a_patch_takes_a_changed_key_at_the_walks_head_without_a_bisect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Node 33 heads both walks. Its first victim leaving (its key changes) and node 0's: each
    # walk finds node 33's old key at its head, and bisects for node 0's only (2 bisects; 4
    # before). Then every victim of the node heading the walk for whole GPUs leaves (the node
    # leaves the index): no bisect either. Each walk is a fresh index's.
    capacity = _pool(40)
    victims = _fill(capacity, 40)
    index = VictimIndex(victims, capacity)
    assert index.walk_order(True)[0][4] == index.walk_order(False)[0][4] == 33
    searched: list[Any] = []
    bisect_left = victim_index.bisect.bisect_left

    def counted(order: list[Any], key: Any, *args: Any, **kwargs: Any) -> int:
        searched.append(key[4])
        return bisect_left(order, key, *args, **kwargs)

    monkeypatch.setattr(victim_index.bisect, "bisect_left", counted)
    leaving = [next(iter(index.on_node[node])) for node in (33, 0)]
    for victim in leaving:
        index.remove(victim)
    left = [victim for victim in victims if victim not in leaving]
    fresh = VictimIndex(left, capacity)
    for whole_gpus in (True, False):
        assert index.walk_order(whole_gpus) == fresh.walk_order(whole_gpus)
    assert searched == [0, 0]
    head = index.walk_order(True)[0][4]
    leaving = list(index.on_node[head])
    for victim in leaving:
        index.remove(victim)
    left = [victim for victim in left if victim not in leaving]
    assert index.walk_order(True) == VictimIndex(left, capacity).walk_order(True)
    assert head not in index.on_node
    assert searched == [0, 0]


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
        for subset in node_sets(capacity, ask, Exclusion(), index)
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


def test_the_walk_for_pods_of_several_gpus_keys_each_node_by_the_tier_that_frees_them() -> None:
    """The walk for pods of k whole GPUs (`tier_walk_order(k)`): only the nodes that can free k GPUs,
    each keyed by the tier that frees them (`whole_tier`), and kept as a fresh index makes it
    as victims leave, a few at a time (patched) and many (sorted again)."""
    capacity = _pool(40)
    # Tiers that vary within a node: freeing one GPU takes a lower tier than freeing four.
    victims = [
        Victim(
            v.uid,
            v.queue,
            (v.uses[0].gpu_indices[0] * 2 + v.nodes[0]) % 5,
            v.priority_class,
            v.started_at_s,
            v.cu,
            v.gpus,
            v.gpu_type,
            v.uses,
            v.nodes,
        )
        for v in _fill(capacity, 40)
    ]
    index = VictimIndex(victims, capacity)
    walks = (0, 1, 2, 3, 4, 5)

    def walk(index: VictimIndex, gpus: int) -> list[tuple[int, float, int, float, int]]:
        return index.tier_walk_order(gpus) if gpus > 1 else index.walk_order(gpus > 0)

    for gpus in walks:
        walk(index, gpus)
    for round_, count in enumerate((1, 2, 5, 90)):
        # Victims of every fourth node leave first: those nodes keep fewer GPUs to free.
        leaving = [v for v in victims if v.nodes[0] % 4 == 0][:count]
        leaving += [v for v in victims if v not in leaving][: count - len(leaving)]
        for victim in leaving:
            index.remove(victim)
        victims = [v for v in victims if v not in leaving]
        fresh = VictimIndex(victims, capacity)
        # Some walks are read after each round, the others only after two: each is brought up
        # to date from where it was read last.
        for gpus in walks if round_ % 2 else walks[::2]:
            assert walk(index, gpus) == walk(fresh, gpus)
        if not round_ % 2:
            continue
        by_node = {key[4]: key for key in index.walk_order(1)}
        for gpus in (2, 3, 4, 5):
            keys = index.tier_walk_order(gpus)
            assert {key[4] for key in keys} == {
                node for node, freeable in index.freeable_on_node.items() if freeable >= gpus
            }
            for key in keys:
                assert key[0] == index.whole_tier(key[4], gpus)
                assert key[1:] == by_node[key[4]][1:]
    assert index.tier_walk_order(5) == []
    assert index.tier_walk_order(4)
