"""What the capacity keeps per node for readers across many nodes: each node's value of a
topology label in one list by node index (`Capacity.domain_of`)."""

from __future__ import annotations

from cycle_builders import node

from gpufair.domain.capacity import Capacity


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
