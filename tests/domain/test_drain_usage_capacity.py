"""The usage window's capacity while nodes are drained under work: `held_timeline` (the rule of
`division_capacity` over time) and `with_held` (added to the pool's capacity rows), and what
they do to U' and the shares (`usage_inputs`, `compute_fair_shares`)."""

from __future__ import annotations

import math

import pytest

from gpufair.domain.capacity_history import NodeConfig, held_timeline, with_held
from gpufair.domain.fairshare import FairShareInput, QueueDemand, compute_fair_shares
from gpufair.domain.model import FairSharePolicy, GpuType, Queue, QueueQuota, frozen_map
from gpufair.domain.usage import Segment, usage_inputs

READY = NodeConfig("p", "unit", 8, 2.5)
DRAINED = NodeConfig(None, "unit", 8, 2.5)
REMOVED = NodeConfig(None, "unit", -1, 2.5)


def test_held_gpus_count_while_not_ready_at_most_what_the_node_counts_for() -> None:
    """x is drained over [100, 300) of [0, 400): runs hold 6 GPUs from 50 to 200, half a shared
    GPU from 150 on, 3 from 180 to 260; x reports 2 usable GPUs at 250. 2.5 CU per GPU."""
    configs = {"x": [(-10.0, READY), (100.0, DRAINED), (300.0, READY)]}
    runs = {"x": [(50.0, 200.0, 6.0), (150.0, math.inf, 0.5), (180.0, 260.0, 3.0)]}
    reports = {"x": [(250.0, 2)]}
    assert held_timeline(configs, reports, runs, 0.0, 400.0) == [
        Segment(100.0, 150.0, 15.0),  # 6 GPUs
        Segment(150.0, 180.0, 16.25),  # 6.5
        Segment(180.0, 200.0, 20.0),  # 9.5 held, the node counts for 8
        Segment(200.0, 250.0, 8.75),  # 3.5
        Segment(250.0, 260.0, 5.0),  # 3.5 held, 2 usable reported
        Segment(260.0, 300.0, 1.25),  # 0.5; from 300 x is ready: its rows count it
    ]
    # Only inside the span asked for; the state in force at its start is taken from before it.
    assert held_timeline(configs, reports, runs, 190.0, 255.0) == [
        Segment(190.0, 200.0, 20.0),
        Segment(200.0, 250.0, 8.75),
        Segment(250.0, 255.0, 5.0),
    ]
    # A node never drained, removed, or with no config entry counts nothing here.
    for entries in ([(-10.0, READY)], [(-10.0, READY), (100.0, REMOVED)], []):
        assert held_timeline({"x": entries}, {}, runs, 0.0, 400.0) == []


def test_with_held_adds_to_the_rows_and_joins_what_comes_out_equal() -> None:
    rows = [Segment(0.0, 100.0, 32.0), Segment(100.0, 300.0, 24.0), Segment(300.0, 400.0, 32.0)]
    assert with_held(rows, []) == rows
    # The drained node's 8 GPUs busy throughout its drain: the rows of no drain.
    assert with_held(rows, [Segment(100.0, 300.0, 8.0)]) == [Segment(0.0, 400.0, 32.0)]
    # Its work ends at 200: 24 CU from then on; two nodes held at once add up.
    assert with_held(rows, [Segment(100.0, 200.0, 8.0)]) == [
        Segment(0.0, 200.0, 32.0),
        Segment(200.0, 300.0, 24.0),
        Segment(300.0, 400.0, 32.0),
    ]
    assert with_held(rows, [Segment(150.0, 250.0, 0.1), Segment(120.0, 180.0, 0.2)]) == [
        Segment(0.0, 100.0, 32.0),
        Segment(100.0, 120.0, 24.0),
        Segment(120.0, 150.0, 24.2),
        Segment(150.0, 180.0, math.fsum([24.0, 0.1, 0.2])),
        Segment(180.0, 250.0, 24.1),
        Segment(250.0, 300.0, 24.0),
        Segment(300.0, 400.0, 32.0),
    ]
    # Held where the pool had no row (no capacity counted): the held CU alone.
    assert with_held([Segment(0.0, 100.0, 32.0)], [Segment(200.0, 300.0, 8.0)]) == [
        Segment(0.0, 100.0, 32.0),
        Segment(200.0, 300.0, 8.0),
    ]


HOUR = 3600.0
WEEK = 7 * 24 * HOUR
NOW = 10 * WEEK
UNIT = GpuType("unit", 40, 1)
QUEUES = tuple(
    Queue(name, None, frozen_map({"p": QueueQuota("p", deserved_cu=deserved)}))
    for name, deserved in (("a", 20.0), ("b", 0.0), ("d", 0.0))
)
# For the whole window a holds 20 (8 of them on x), b 8 and d 4: the pool's 32 GPUs, b 8 CU and
# d 4 CU over quota. b and d wait for 8 more each.
HELD = {"a": 20.0, "b": 8.0, "d": 4.0}
DEMANDS = {
    "a": QueueDemand({"unit": 20.0}, {}),
    "b": QueueDemand({"unit": 8.0}, {"unit": 8.0}),
    "d": QueueDemand({"unit": 4.0}, {"unit": 8.0}),
}


def _standing(capacity: list[Segment]) -> tuple[float, float, float]:
    """b's U', b's and d's fair shares (CU) at NOW over a 7-day window, division of 32 CU."""
    policy = FairSharePolicy(window_s=WEEK)
    usage = usage_inputs(
        pool="p",
        policy=policy,
        queues=QUEUES,
        gpu_types={"unit": UNIT},
        leaf_allocations={q: [Segment(NOW - 2 * WEEK, math.inf, cu)] for q, cu in HELD.items()},
        capacity=capacity,
        now_s=NOW,
    )
    result = compute_fair_shares(
        FairShareInput("p", policy, {"unit": UNIT}, {"unit": 32.0}, QUEUES, DEMANDS, usage)
    )
    shares = result.fair_share_cu
    return result.standing["b"].usage_share, shares["b"], shares["d"]


@pytest.mark.parametrize(
    ("hours", "inflated"),
    [(4.0, (0.677, 3.93, 8.07)), (24.0, (0.737, 3.53, 8.47)), (72.0, (0.933, 1.33, 10.67))],
)
def test_a_drain_under_work_leaves_u_prime_and_the_shares_as_they_were(
    hours: float, inflated: tuple[float, float, float]
) -> None:
    drain_s = NOW - hours * HOUR
    rows = [Segment(NOW - 2 * WEEK, drain_s, 32.0), Segment(drain_s, NOW, 24.0)]
    undrained = _standing([Segment(NOW - 2 * WEEK, NOW, 32.0)])
    assert undrained == pytest.approx((2 / 3, 4.0, 8.0), rel=1e-12)
    # The rows alone (ready nodes), as the window read them before: U' inflated.
    assert _standing(rows) == pytest.approx(inflated, abs=0.005)
    # x's 8 GPUs (1 CU each) held by a's work through the drain: as undrained, to the bit.
    configs = {
        "x": [(0.0, NodeConfig("p", "unit", 8, 1.0)), (drain_s, NodeConfig(None, "unit", 8, 1.0))]
    }
    held = held_timeline(configs, {}, {"x": [(0.0, math.inf, 8.0)]}, NOW - WEEK, NOW)
    assert held == [Segment(drain_s, NOW, 8.0)]
    assert _standing(with_held(rows, held)) == undrained
