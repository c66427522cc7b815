"""Whole-GPU rounding ties, shrunk guarantees in whole GPUs, and weight 0 as best effort across
tiers (DESIGN §3.3–§3.4; issue 14)."""

from __future__ import annotations

import pytest
from fairshare_support import A100, POOL, divide, gpus, queue, wants
from test_fairshare import WEEK_S

from gpufair.domain.model import FairSharePolicy, Rounding, UsageBasis
from gpufair.domain.usage import Segment, usage_inputs

WHOLE = FairSharePolicy(rounding=Rounding.WHOLE_GPUS)


def test_reference_case_on_the_total_basis_breaks_the_exact_tie_by_name_68_32() -> None:
    policy = FairSharePolicy(k=1.0, usage_basis=UsageBasis.TOTAL, rounding=Rounding.WHOLE_GPUS)
    queues = [queue("llm", deserved_cu=300), queue("vision", deserved_cu=200)]
    usage = usage_inputs(
        pool=POOL,
        policy=policy,
        queues=queues,
        gpu_types={"a100": A100},
        leaf_allocations={
            "llm": [Segment(0.0, WEEK_S, 10 * 10.0)],
            "vision": [Segment(0.0, WEEK_S, 70 * 10.0)],
        },
        capacity=[Segment(0.0, WEEK_S, 100 * 10.0)],
        now_s=WEEK_S,
    )
    shares = divide(
        queues,
        {"llm": wants(100, allocated=10), "vision": wants(100, allocated=70)},
        capacity_gpus=100,
        policy=policy,
        usage=usage,
    )
    # Continuous: 67.5 / 32.5. Both remainders are half a GPU; equal age, so the name decides:
    # llm (float noise used to give it to vision: 67 / 33).
    assert (gpus(shares["llm"]), gpus(shares["vision"])) == (68, 32)


def test_ties_up_to_float_noise_follow_the_tie_rule() -> None:
    # Weights 0.1 and 0.3 split 34 GPUs 8.5 / 25.5: equal remainders in exact arithmetic, not
    # in floats (0.1 / 0.4 is not 0.25). Equal age, so the name decides: a gets the GPU.
    for capacity, expected in [(34, (9, 25)), (38, (10, 28)), (10, (3, 7))]:
        shares = divide(
            [queue("a", weight=0.1), queue("b", weight=0.3)],
            {"a": wants(100), "b": wants(100)},
            capacity_gpus=capacity,
            policy=WHOLE,
        )
        assert (gpus(shares["a"]), gpus(shares["b"])) == expected


def test_guarantees_beyond_capacity_are_shrunk_to_whole_gpus() -> None:
    queues = [queue("a", deserved_cu=80), queue("b", deserved_cu=70)]
    demands = {"a": wants(10), "b": wants(10)}
    continuous = divide(queues, demands, capacity_gpus=10)
    # 150 CU promised on 100: each keeps 2/3 of its quota, 53.3 and 46.7 CU.
    assert (continuous["a"].guaranteed_cu, continuous["b"].guaranteed_cu) == pytest.approx(
        (160 / 3, 140 / 3)
    )
    whole = divide(queues, demands, capacity_gpus=10, policy=WHOLE)
    # Floors 5 and 4 GPUs; the freed GPU goes to the larger remainder (b's 0.67 over a's 0.33).
    assert (gpus(whole["a"]), gpus(whole["b"])) == (5, 5)
    assert (whole["a"].guaranteed_cu, whole["b"].guaranteed_cu) == (50, 50)


def test_weight_zero_in_a_higher_tier_waits_for_a_weighted_lower_tier() -> None:
    queues = [
        queue("scavenger", weight=0.0, priority=2, deserved_cu=200),
        queue("team", weight=1.0, priority=0),
    ]
    shares = divide(queues, {"scavenger": wants(100), "team": wants(70)}, capacity_gpus=100)
    # The scavenger keeps its 20 GPUs deserved; over quota the weighted team comes first
    # (before: the scavenger's tier took all 80 and the team got nothing).
    assert (gpus(shares["scavenger"]), gpus(shares["team"])) == pytest.approx((30, 70))
    assert shares["scavenger"].guaranteed_cu == 200


def test_best_effort_queues_share_what_is_left_highest_tier_first() -> None:
    queues = [
        queue("be-high", weight=0.0, priority=1),
        queue("be-low", weight=0.0, priority=0),
        queue("team", weight=1.0, priority=0),
    ]
    demands = {"be-high": wants(30), "be-low": wants(100), "team": wants(50)}
    shares = divide(queues, demands, capacity_gpus=100)
    assert [gpus(shares[n]) for n in ("team", "be-high", "be-low")] == pytest.approx([50, 30, 20])
