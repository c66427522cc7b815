"""The division's inner loops written out (issue 17: stage weights and water-filling on lists,
KAI's rounds without a record per round) give the previous engine's numbers on the paths they
open: a kai tier left nothing by the tiers above it, a dead band in the first stage only, ties
and weight 0 in one fill, guarantees over capacity rounded to whole GPUs, and the largest
remainder of the whole-GPU rounding."""

from __future__ import annotations

import fairshare_previous
from fairshare_support import ALL_TYPES, POOL, queue, wants
from test_fairshare_plan import assert_same_result

from gpufair.domain.fairshare import FairShareInput, FairShareResult, compute_fair_shares
from gpufair.domain.model import Division, FairSharePolicy, Rounding
from gpufair.domain.usage import UsageInputs


def _divide_both(
    queues: list,
    demands: dict,
    capacity_gpus: float,
    policy: FairSharePolicy,
    usage: dict[str, float] | None = None,
    previous: dict[str, float] | None = None,
) -> FairShareResult:
    inp = FairShareInput(
        pool=POOL,
        policy=policy,
        gpu_types=ALL_TYPES,
        capacity_gpus_by_type={"a100": capacity_gpus},
        queues=queues,
        demands=demands,
        usage=UsageInputs(
            usage_cu_s=usage or {}, group_capacity_cu_s={None: capacity_gpus * 10.0 * 3600.0}
        ),
        previous_effective_weights=previous or {},
    )
    result = compute_fair_shares(inp)
    assert_same_result(result, fairshare_previous.compute_fair_shares(inp))
    return result


def test_a_kai_tier_left_nothing_competes_for_nothing() -> None:
    # The high tier wants 12 of the 10 GPUs: the low tier gets nothing and records no weights.
    queues = [
        queue("high-a", priority=2, weight=1.0),
        queue("high-b", priority=2, weight=3.0),
        queue("low-a", priority=0, weight=1.0),
        queue("low-b", priority=0, weight=0.0),
    ]
    demands = {"high-a": wants(6), "high-b": wants(6), "low-a": wants(4), "low-b": wants(4)}
    for rounding in (Rounding.CONTINUOUS, Rounding.WHOLE_GPUS):
        policy = FairSharePolicy(k=1.0, division=Division.KAI, rounding=rounding)
        result = _divide_both(queues, demands, 10.0, policy)
        gpus = {name: cu / 10.0 for name, cu in result.fair_share_cu.items()}
        assert gpus["high-a"] + gpus["high-b"] == 10.0
        assert gpus["high-b"] == 6.0  # three times the weight: its whole demand
        assert gpus["low-a"] == 0.0 and gpus["low-b"] == 0.0
        assert result.competing == frozenset({"high-a", "high-b"})
        assert result.shares["low-a"].effective_weight == 0.0


def test_the_dead_band_holds_only_the_first_stage() -> None:
    # b's P is 0 (it used far more than its share): a and c fill first with their previous
    # weights held by the band, then b takes what they leave in a second stage.
    queues = [queue("a", weight=1.0), queue("b", weight=1.0), queue("c", weight=2.0)]
    demands = {"a": wants(2), "b": wants(8), "c": wants(3)}
    usage = {"a": 0.0, "b": 10.0 * 10.0 * 3600.0, "c": 0.0}
    previous = {"a": 0.34, "b": 0.0, "c": 0.66}
    result = _divide_both(queues, demands, 10.0, FairSharePolicy(k=1.0), usage, previous)
    assert result.effective_weights == {"a": 0.34, "b": 0.0, "c": 0.66}
    assert {name: cu / 10.0 for name, cu in result.fair_share_cu.items()} == {
        "a": 2.0,
        "b": 5.0,
        "c": 3.0,
    }


def test_ties_and_weight_zero_in_one_fill() -> None:
    # Equal ratios cap/weight tie in name order; weight 0 gets only what the others leave.
    queues = [
        queue("a", weight=1.0),
        queue("b", weight=1.0),
        queue("c", weight=2.0),
        queue("idle", weight=0.0),
    ]
    demands = {"a": wants(2), "b": wants(2), "c": wants(4), "idle": wants(5)}
    result = _divide_both(queues, demands, 11.0, FairSharePolicy(k=0.0))
    assert {name: cu / 10.0 for name, cu in result.fair_share_cu.items()} == {
        "a": 2.0,
        "b": 2.0,
        "c": 4.0,
        "idle": 3.0,
    }


def test_guarantees_over_capacity_in_whole_gpus_and_the_largest_remainder() -> None:
    # Guarantees of 4 + 4 + 4 GPUs on 10: 3.33 each, floored to 3, and the freed GPU goes to
    # the oldest queue (equal remainders); then over quota, 2 GPUs less a whole GPU each.
    queues = [
        queue("x", deserved_cu=40.0, created_at_s=3.0),
        queue("y", deserved_cu=40.0, created_at_s=1.0),
        queue("z", deserved_cu=40.0, created_at_s=2.0),
    ]
    demands = {"x": wants(6), "y": wants(6), "z": wants(6)}
    policy = FairSharePolicy(k=1.0, rounding=Rounding.WHOLE_GPUS)
    result = _divide_both(queues, demands, 10.0, policy)
    assert {name: cu / 10.0 for name, cu in result.fair_share_cu.items()} == {
        "x": 3.0,
        "y": 4.0,
        "z": 3.0,
    }
    # Over quota: 7 GPUs over three equal queues with a100 limits of 5, 5 and 1.5 GPUs.
    queues = [queue("p"), queue("q"), queue("r")]
    demands = {"p": wants(5), "q": wants(5), "r": wants(1.5)}
    result = _divide_both(queues, demands, 7.0, policy)
    assert {name: cu / 10.0 for name, cu in result.fair_share_cu.items()} == {
        "p": 3.0,
        "q": 2.5,
        "r": 1.5,
    }
