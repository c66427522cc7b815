"""Options kept between victim searches (`VictimIndex.option_table`) when a victim queue's
budget changed: kept when each budget test the option made answers as before, computed again
when one may not (a budget that rose), and the search decides as one on a fresh index does."""

from __future__ import annotations

from cycle_builders import victims_found

from gpufair.domain.capacity import Capacity, PodUse
from gpufair.domain.model import Node
from gpufair.domain.placement_ask import PodShape
from gpufair.domain.victim_search import Victim, VictimIndex

SHAPE = PodShape(2.0, 0, 0)


def _full_pool() -> tuple[Capacity, list[Victim]]:
    """Four nodes of 4 GPUs, each GPU held by a one-GPU victim of queue "lender"; on node n,
    GPU g's victim costs 10 + n + g CU and the later GPUs started later (evicted first)."""
    capacity = Capacity(Node(f"n{i}", "p", "a100", 4, 64_000, 512_000, {}) for i in range(4))
    victims = []
    for node in range(4):
        for gpu in range(4):
            use = PodUse(node, (gpu,), 1.0, 1_000, 1_000)
            capacity.take((use,))
            victims.append(
                Victim(
                    f"v{node}-{gpu}",
                    "lender",
                    0,
                    0,
                    1_000.0 + node * 13 + gpu,
                    10.0 + node + gpu,
                    1.0,
                    "a100",
                    (use,),
                    (node,),
                )
            )
    return capacity, victims


def _search(capacity: Capacity, index: VictimIndex, lender_cu: float) -> list[str] | None:
    return victims_found(capacity, index, SHAPE, {"lender": lender_cu})


def test_an_option_whose_budget_tests_answer_as_before_is_kept_when_the_budget_falls() -> None:
    capacity, victims = _full_pool()
    index = VictimIndex(victims, capacity)
    # 25 CU: one 2-GPU pod takes v1-3 and v1-0 (14 + 11 CU) on n1. On n2 only v2-3 (15 CU)
    # passes the budget test (15 + 14, 15 + 13, 15 + 12 are all above 25): no option.
    assert _search(capacity, index, 25.0) == ["v1-3", "v1-0"]
    table = index.option_table(SHAPE, None, True)
    version, read, option, passed = table[2]
    assert option is None and [v.uid for v in passed] == ["v2-3"]
    assert read == (("lender", 25.0, float("inf")),)
    # The lender lost 1 CU elsewhere (24 CU left): n0's v0-3 and v0-1 (13 + 11 CU) now win.
    # n2's tests answer as before (15 passes, the pairs still fail), so its option is kept:
    # the same list of passed victims, at the same version, with the budget it reads now.
    assert _search(capacity, index, 24.0) == ["v0-3", "v0-1"]
    assert table[2][0] == version and table[2][2] is None and table[2][3] is passed
    assert table[2][1] == (("lender", 24.0, float("inf")),)
    # The same choices as searches on a fresh index at each budget.
    assert _search(capacity, VictimIndex(victims, capacity), 25.0) == ["v1-3", "v1-0"]
    assert _search(capacity, VictimIndex(victims, capacity), 24.0) == ["v0-3", "v0-1"]


def test_an_option_is_computed_again_when_a_budget_rises_or_a_pass_would_fail() -> None:
    capacity, victims = _full_pool()
    index = VictimIndex(victims, capacity)
    assert _search(capacity, index, 25.0) == ["v1-3", "v1-0"]
    table = index.option_table(SHAPE, None, True)
    kept_n2 = table[2][3]
    # 30 CU: a test that failed at 25 may pass (n2's v2-3 + v2-2, 29 CU, now does), so n2's
    # option is computed again; n0's v0-3 + v0-2 (28 CU) is the cheapest pair.
    assert _search(capacity, index, 30.0) == ["v0-3", "v0-2"]
    assert table[2][3] is not kept_n2
    assert [v.uid for v in table[2][3]] == ["v2-3", "v2-2"]
    # 12 CU: no pair fits anywhere and n0's kept pass v0-3 (13 CU) now fails: recomputed.
    kept_n0 = table[0][3]
    assert _search(capacity, index, 12.0) is None
    assert table[0][3] is not kept_n0 and table[0][2] is None
    assert _search(capacity, VictimIndex(victims, capacity), 30.0) == ["v0-3", "v0-2"]
    assert _search(capacity, VictimIndex(victims, capacity), 12.0) is None
