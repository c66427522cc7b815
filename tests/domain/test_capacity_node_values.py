"""What the capacity keeps per node for readers across many nodes: each node's value of a
topology label in one list by node index (`Capacity.domain_of`), and GPUs full or free holding
one float object each (`capacity._move`), not one per GPU."""

from __future__ import annotations

from cycle_builders import node

from gpufair.domain.capacity import Capacity, Journal, PodUse


def test_domain_of_lists_each_nodes_label_by_index() -> None:
    capacity = Capacity(
        [node("a", rack="r1"), node("b"), node("c", rack="r2"), node("d", rack="r1")]
    )
    values = capacity.domain_of("rack")
    assert values == ["r1", None, "r2", "r1"]
    assert capacity.domain_of("rack") is values  # built once
    assert capacity.domain_of("zone") == [None, None, None, None]
    assert capacity.domains("rack") == {"unit": {"r1": [0, 3], "r2": [2]}}
    copied = capacity.copy()
    assert copied.domain_of("rack") == values
    assert copied.domain_of("rack") is not values


def test_full_and_free_gpus_share_one_float_each() -> None:
    capacity = Capacity([node(f"n{index}") for index in range(3)])
    # Whole GPUs taken one pod at a time (loading's `take_one`), shares that fill GPUs, and a
    # gang of several pods (`_apply`).
    for index in range(3):
        capacity.take((PodUse(index, (0, 1), 1.0, 0, 0),))
    for _ in range(4):
        capacity.take((PodUse(0, (2,), 0.25, 0, 0),))
    capacity.take((PodUse(1, (2,), 0.5, 0, 0), PodUse(2, (2, 3, 4), 1.0, 0, 0)))
    capacity.take((PodUse(1, (2,), 0.5, 0, 0),))
    full = [used for state in capacity.nodes for used in state.gpu_used if used == 1.0]
    assert len(full) == 3 * 2 + 1 + 1 + 3
    assert len({id(used) for used in full}) == 1
    # Released whole, inside a trial and outside: back to one 0.0.
    trial = Journal()
    capacity.release((PodUse(0, (0, 1), 1.0, 0, 0),), trial)
    capacity.release((PodUse(2, (2, 3, 4), 1.0, 0, 0),))
    free = [used for state in capacity.nodes for used in state.gpu_used if used == 0.0]
    assert len(free) == 5 + 6 + 5 + 2
    assert len({id(used) for used in free}) == 1
    assert capacity.nodes[0].free_whole == 7
    capacity.restore(trial)
    assert capacity.nodes[0].gpu_used[:3] == [1.0, 1.0, 1.0]
    assert capacity.nodes[0].free_whole == 5
