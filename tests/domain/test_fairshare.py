"""The fair-share engine on worked examples: numbers a user would check by hand."""

from __future__ import annotations

import pytest
from fairshare_support import A100, POOL, divide, gpus, queue, wants

from gpufair.domain.errors import InvalidInputError
from gpufair.domain.fairshare import FairShareInput, QueueDemand, compute_fair_shares
from gpufair.domain.model import FairSharePolicy, Queue, Rounding, UsageBasis
from gpufair.domain.usage import Segment, UsageInputs, usage_inputs
from gpufair.domain.waterfill import water_fill

WEEK_S = 7 * 24 * 3600.0


def test_weights_three_to_one_give_70_and_30_of_100_gpus() -> None:
    shares = divide(
        [queue("a", deserved_cu=100, weight=3), queue("b", deserved_cu=100, weight=1)],
        {"a": wants(100), "b": wants(100)},
        capacity_gpus=100,
    )
    assert gpus(shares["a"]) == pytest.approx(70)
    assert gpus(shares["b"]) == pytest.approx(30)
    assert shares["a"].weight_share == pytest.approx(0.75)
    assert shares["a"].guaranteed_cu == 100


def test_whole_gpus_rounding_turns_12_8_and_3_2_into_13_and_3() -> None:
    shares = divide(
        [queue("a"), queue("b")],
        {"a": wants(16), "b": wants(16)},
        capacity_gpus=16,
        policy=FairSharePolicy(k=1.0, rounding=Rounding.WHOLE_GPUS),
        usage=UsageInputs(usage_cu_s={"a": 0.0, "b": 75.0}, group_capacity_cu_s={None: 100.0}),
    )
    assert (shares["a"].priority_weight, shares["b"].priority_weight) == pytest.approx((1, 0.25))
    assert (gpus(shares["a"]), gpus(shares["b"])) == (13, 3)


def test_continuous_rounding_keeps_12_8_and_3_2() -> None:
    shares = divide(
        [queue("a"), queue("b")],
        {"a": wants(16), "b": wants(16)},
        capacity_gpus=16,
        usage=UsageInputs(usage_cu_s={"b": 75.0}, group_capacity_cu_s={None: 100.0}),
    )
    assert (gpus(shares["a"]), gpus(shares["b"])) == pytest.approx((12.8, 3.2))


def test_whole_gpus_rounding_ties_go_to_the_older_queue_then_the_name() -> None:
    queues = [queue("b", created_at_s=5.0), queue("a", created_at_s=9.0), queue("c")]
    shares = divide(
        queues,
        {name: wants(10) for name in "abc"},
        capacity_gpus=10,
        policy=FairSharePolicy(rounding=Rounding.WHOLE_GPUS),
    )
    # 10 / 3 each: floors of 3, one GPU left, equal remainders; c (created at 0) is oldest.
    assert [gpus(shares[name]) for name in "abc"] == [3, 3, 4]


def _reference_case(
    k: float, llm_wants: float, basis: UsageBasis = UsageBasis.OVER_QUOTA
) -> dict[str, float]:
    """DESIGN §1: LLM deserved 30, vision 20, the vision team held the 50 shared GPUs all week."""
    policy = FairSharePolicy(k=k, usage_basis=basis)
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
        {"llm": wants(llm_wants, allocated=10), "vision": wants(100, allocated=70)},
        capacity_gpus=100,
        policy=policy,
        usage=usage,
    )
    return {name: gpus(share) for name, share in shares.items()}


def test_reference_case_history_lets_the_llm_team_reach_80_gpus() -> None:
    assert _reference_case(k=1.0, llm_wants=100) == pytest.approx({"llm": 80, "vision": 20})


def test_reference_case_without_memory_the_llm_team_stays_at_55() -> None:
    shares = _reference_case(k=0.0, llm_wants=100)
    assert shares == pytest.approx({"llm": 55, "vision": 45})
    assert shares["llm"] - 10 < 60  # the 60-GPU gang beside the 10 inference GPUs cannot fit


def test_reference_case_gang_fits_and_vision_keeps_what_llm_does_not_want() -> None:
    # 10 inference + the 60-GPU gang = 70: the gang fits, and the rest is not left idle.
    assert _reference_case(k=1.0, llm_wants=70) == pytest.approx({"llm": 70, "vision": 30})
    assert _reference_case(k=0.0, llm_wants=70) == pytest.approx({"llm": 55, "vision": 45})


def test_design_example_over_quota_basis_gives_usage_1_and_0_and_p_0_and_1() -> None:
    policy = FairSharePolicy(k=1.0)
    queues = [queue("llm", deserved_cu=300), queue("vision", deserved_cu=200)]
    usage = usage_inputs(
        pool=POOL,
        policy=policy,
        queues=queues,
        gpu_types={"a100": A100},
        leaf_allocations={
            "llm": [Segment(0, WEEK_S, 100.0)],
            "vision": [Segment(0, WEEK_S, 700.0)],
        },
        capacity=[Segment(0, WEEK_S, 1000.0)],
        now_s=WEEK_S,
    )
    shares = divide(
        queues,
        {"llm": wants(100, allocated=10), "vision": wants(100, allocated=70)},
        capacity_gpus=100,
        policy=policy,
        usage=usage,
    )
    assert shares["vision"].usage_share == pytest.approx(1.0)
    assert shares["llm"].usage_share == 0.0
    assert shares["llm"].priority_weight == pytest.approx(1.0)
    assert shares["vision"].priority_weight == 0.0


def test_design_example_whole_pool_basis_leaves_the_llm_team_37_5_over_quota() -> None:
    shares = _reference_case(k=1.0, llm_wants=100, basis=UsageBasis.TOTAL)
    # U' = 0.1 and 0.7 → P = 0.9 and 0.3 → 0.9 / 1.2 × 50 = 37.5 < 40: the gang still starves.
    assert shares["llm"] - 30 == pytest.approx(37.5)
    assert shares["vision"] == pytest.approx(32.5)


def test_heavy_usage_never_touches_the_deserved_quota() -> None:
    shares = divide(
        [queue("heavy", deserved_cu=200), queue("light", deserved_cu=100)],
        {"heavy": wants(100), "light": wants(100)},
        capacity_gpus=100,
        usage=UsageInputs(usage_cu_s={"heavy": 1e9}, group_capacity_cu_s={None: 1.0}),
    )
    assert gpus(shares["heavy"]) == pytest.approx(20)
    assert gpus(shares["light"]) == pytest.approx(80)


def test_lower_priority_tier_gets_only_what_the_higher_tier_cannot_use() -> None:
    queues = [
        queue("prod", priority=2),
        queue("research", priority=1, weight=100),
        queue("scratch", priority=0),
    ]
    shares = divide(
        queues, {"prod": wants(30), "research": wants(50), "scratch": wants(50)}, capacity_gpus=100
    )
    assert [gpus(shares[q]) for q in ("prod", "research", "scratch")] == pytest.approx([30, 50, 20])


def test_limit_caps_a_share_and_the_rest_goes_to_the_others() -> None:
    shares = divide(
        [queue("capped", weight=9, limit_cu=150), queue("other")],
        {"capped": wants(100), "other": wants(100)},
        capacity_gpus=100,
    )
    assert gpus(shares["capped"]) == pytest.approx(15)
    assert gpus(shares["other"]) == pytest.approx(85)
    assert shares["capped"].allowed_demand_cu == 150


def test_queue_with_zero_priority_weight_gets_the_leftover_nobody_else_wants() -> None:
    shares = divide(
        [queue("fresh"), queue("hog")],
        {"fresh": wants(10), "hog": wants(100)},
        capacity_gpus=100,
        usage=UsageInputs(usage_cu_s={"hog": 1000.0}, group_capacity_cu_s={None: 1000.0}),
    )
    assert shares["hog"].priority_weight == 0.0
    assert gpus(shares["fresh"]) == pytest.approx(10)
    assert gpus(shares["hog"]) == pytest.approx(90)


def test_every_priority_weight_zero_falls_back_to_configured_weights() -> None:
    shares = divide(
        [queue("a", weight=3), queue("b", weight=1)],
        {"a": wants(100), "b": wants(100)},
        capacity_gpus=100,
        policy=FairSharePolicy(k=2.0),
        usage=UsageInputs(
            usage_cu_s={"a": 5000.0, "b": 5000.0}, group_capacity_cu_s={None: 1000.0}
        ),
    )
    assert shares["a"].priority_weight == shares["b"].priority_weight == 0.0
    assert shares["a"].effective_weight == pytest.approx(0.75)
    assert (gpus(shares["a"]), gpus(shares["b"])) == pytest.approx((75, 25))


def test_best_effort_queue_without_terms_in_the_pool_gets_leftovers_last() -> None:
    shares = divide(
        [queue("team", weight=1), Queue(name="guest")],
        {"team": wants(60), "guest": wants(100)},
        capacity_gpus=100,
    )
    assert gpus(shares["team"]) == pytest.approx(60)
    assert gpus(shares["guest"]) == pytest.approx(40)
    assert shares["guest"].over_quota_weight == 0.0


def test_children_divide_what_their_department_received() -> None:
    queues = [
        queue("ml", deserved_cu=400, weight=1),
        queue("web", deserved_cu=200, weight=1),
        queue("nlp", parent="ml", deserved_cu=300, weight=1),
        queue("cv", parent="ml", deserved_cu=100, weight=3),
        queue("api", parent="web", deserved_cu=200),
    ]
    shares = divide(
        queues, {"nlp": wants(100), "cv": wants(100), "api": wants(100)}, capacity_gpus=100
    )
    # Top: ml 40 + 20, web 20 + 20. Inside ml's 60: nlp 30, cv 10, then 20 split 1 : 3.
    assert gpus(shares["ml"]) == pytest.approx(60)
    assert gpus(shares["web"]) == pytest.approx(40)
    assert gpus(shares["nlp"]) == pytest.approx(35)
    assert gpus(shares["cv"]) == pytest.approx(25)
    assert gpus(shares["api"]) == pytest.approx(40)
    assert shares["ml"].demand_cu == 2000
    assert not shares["ml"].is_leaf


def test_department_limit_caps_its_teams_together() -> None:
    queues = [
        queue("dept", limit_cu=300),
        queue("other"),
        queue("a", parent="dept"),
        queue("b", parent="dept"),
    ]
    shares = divide(
        queues, {"a": wants(100), "b": wants(100), "other": wants(100)}, capacity_gpus=100
    )
    assert gpus(shares["dept"]) == pytest.approx(30)
    assert gpus(shares["a"]) + gpus(shares["b"]) == pytest.approx(30)
    assert gpus(shares["other"]) == pytest.approx(70)


def test_scarce_capacity_shrinks_guarantees_in_proportion_to_deserved() -> None:
    shares = divide(
        [queue("a", deserved_cu=600), queue("b", deserved_cu=300), queue("small", deserved_cu=300)],
        {"a": wants(100), "b": wants(100), "small": wants(2)},
        capacity_gpus=50,
    )
    # 50 GPUs for 120 deserved: the small demand is met (2), a and b keep 2 : 1 of the other 48.
    assert [gpus(shares[q]) for q in ("a", "b", "small")] == pytest.approx([32, 16, 2])


def test_dead_band_keeps_the_previous_weight_through_a_small_change() -> None:
    queues = [queue("a"), queue("b")]
    demand = {"a": wants(100), "b": wants(100)}
    usage = UsageInputs(usage_cu_s={"a": 1.0}, group_capacity_cu_s={None: 100.0})
    shares = divide(
        queues,
        demand,
        capacity_gpus=100,
        policy=FairSharePolicy(dead_band=0.01),
        usage=usage,
        previous={"a": 0.5, "b": 0.5},
    )
    # Unbanded: P = (0.99, 1) → 0.4975 / 0.5025, both within 0.01 of the previous 0.5.
    assert shares["a"].effective_weight == 0.5
    assert gpus(shares["a"]) == pytest.approx(50)
    moved = divide(
        queues,
        demand,
        capacity_gpus=100,
        policy=FairSharePolicy(dead_band=0.001),
        usage=usage,
        previous={"a": 0.5, "b": 0.5},
    )
    assert moved["a"].effective_weight == pytest.approx(0.99 / 1.99)
    assert gpus(moved["a"]) == pytest.approx(100 * 0.99 / 1.99)


def test_dead_band_lets_a_weight_fall_to_zero_so_the_whole_pool_can_go_to_the_other() -> None:
    # b has held the whole pool for the whole window: U' = 1, P = 0. Its weight crept down in
    # banded steps to 0.005; the dead band must not keep that sliver, or a's whole-pool gang
    # (its fair share 159.2 of 160 CU) would wait for ever.
    usage = UsageInputs(usage_cu_s={"b": 16 * 86400.0}, group_capacity_cu_s={None: 16 * 86400.0})
    shares = divide(
        [queue("a"), queue("b")],
        {"a": wants(16), "b": wants(0, allocated=16)},
        capacity_gpus=16,
        policy=FairSharePolicy(dead_band=0.01),
        usage=usage,
        previous={"a": 0.995, "b": 0.005},
    )
    assert shares["b"].priority_weight == 0.0
    assert shares["b"].effective_weight == 0.0
    assert gpus(shares["a"]) == 16


def _next_previous(
    queues: list[Queue],
    demands: dict[str, QueueDemand],
    capacity_gpus: float,
    usage: UsageInputs | None = None,
) -> dict[str, float]:
    """The weights one computation hands the next (`FairShareResult.effective_weights`)."""
    result = compute_fair_shares(
        FairShareInput(
            pool=POOL,
            policy=FairSharePolicy(dead_band=0.01),
            gpu_types={"a100": A100},
            capacity_gpus_by_type={"a100": capacity_gpus},
            queues=queues,
            demands=demands,
            usage=usage or UsageInputs(),
        )
    )
    return dict(result.effective_weights)


def test_dead_band_does_not_hold_a_queue_that_did_not_compete_at_zero() -> None:
    # `small` (weight 1) had no demand at the last recompute: its record says weight 0, but it
    # did not compete, so the next computation gets no previous weight for it. Now it wants 10
    # GPUs with no usage: its weight 1/301 = 0.00332 is within the band of 0, and holding it at
    # 0 gave it nothing at every recompute while `big` (weight 300) wanted more.
    queues = [queue("small", weight=1), queue("big", weight=300)]
    previous = _next_previous(queues, {"big": wants(100)}, capacity_gpus=10)
    assert previous == {"big": 1.0}
    shares = divide(
        queues,
        {"small": wants(10), "big": wants(100)},
        capacity_gpus=10,
        policy=FairSharePolicy(dead_band=0.01),
        previous=previous,
    )
    assert shares["small"].effective_weight == pytest.approx(1 / 301)
    assert shares["big"].effective_weight == 1.0  # 300/301 is within the band of its 1.0: kept
    # 100 CU split 1/301 : 1, that is 1 : 301: 0.331 CU and 99.669 CU.
    assert shares["small"].fair_share_cu == pytest.approx(100 / 302)
    assert shares["big"].fair_share_cu == pytest.approx(100 * 301 / 302)


def test_dead_band_holds_a_queue_that_gave_way_entirely_at_zero() -> None:
    # b competed and gave way entirely: it held the whole pool for the window (U' = 1, P = 0).
    # Its 0 is remembered; when its usage slips to U' = 0.99 its weight 0.01 / 1.01 = 0.0099
    # is within the band of 0 and stays 0 (DESIGN §3.6), so a keeps the whole pool.
    queues = [queue("a"), queue("b")]
    demands = {"a": wants(16), "b": wants(16)}
    day_cu_s = 160 * 86400.0
    full = UsageInputs(usage_cu_s={"b": day_cu_s}, group_capacity_cu_s={None: day_cu_s})
    previous = _next_previous(queues, demands, capacity_gpus=16, usage=full)
    assert previous == {"a": 1.0, "b": 0.0}
    slipped = UsageInputs(usage_cu_s={"b": 0.99 * day_cu_s}, group_capacity_cu_s={None: day_cu_s})
    shares = divide(
        queues,
        demands,
        capacity_gpus=16,
        policy=FairSharePolicy(dead_band=0.01),
        usage=slipped,
        previous=previous,
    )
    assert shares["b"].priority_weight == pytest.approx(0.01)
    assert (shares["a"].effective_weight, shares["b"].effective_weight) == (1.0, 0.0)
    assert (gpus(shares["a"]), gpus(shares["b"])) == (16, 0)
    # The same usage for a b that did not compete last time (it wanted nothing): no 0 to hold,
    # so it gets its weight 1/101 at once, 160 / 102 = 1.569 CU.
    previous = _next_previous(queues, {"a": wants(16)}, capacity_gpus=16, usage=full)
    assert previous == {"a": 1.0}
    returning = divide(
        queues,
        demands,
        capacity_gpus=16,
        policy=FairSharePolicy(dead_band=0.01),
        usage=slipped,
        previous=previous,
    )
    assert returning["b"].effective_weight == pytest.approx(1 / 101)
    assert returning["b"].fair_share_cu == pytest.approx(160 / 102)
    assert returning["a"].fair_share_cu == pytest.approx(160 * 101 / 102)


def test_group_without_capacity_history_has_no_usage_share() -> None:
    shares = divide(
        [queue("a"), queue("b")],
        {"a": wants(100), "b": wants(100)},
        capacity_gpus=100,
        usage=UsageInputs(usage_cu_s={"a": 500.0}),
    )
    assert shares["a"].usage_share == 0.0
    assert gpus(shares["a"]) == pytest.approx(50)


def test_explain_record_carries_every_number_of_the_division() -> None:
    shares = divide(
        [queue("a", deserved_cu=100, weight=3, limit_cu=900), queue("b", deserved_cu=100)],
        {"a": wants(100, allocated=40), "b": wants(100)},
        capacity_gpus=100,
        usage=UsageInputs(usage_cu_s={"a": 200.0, "b": 0.0}, group_capacity_cu_s={None: 800.0}),
    )
    a = shares["a"]
    # W' = 0.75, U' = 0.25, P = 0.75 + (0.75 - 0.25) = 1.25; b: W' = 0.25, P = 0.5.
    assert (a.weight_share, a.usage_share, a.priority_weight) == pytest.approx((0.75, 0.25, 1.25))
    assert a.effective_weight == pytest.approx(1.25 / 1.75)
    assert (a.deserved_cu, a.limit_cu, a.demand_cu, a.allocated_cu) == (100, 900, 1000, 400)
    assert a.allowed_demand_cu == 900
    assert a.guaranteed_cu == 100
    assert a.fair_share_cu == pytest.approx(100 + 800 * 1.25 / 1.75)
    assert a.over_quota_share_cu == pytest.approx(800 * 1.25 / 1.75)
    assert (a.decayed_usage_cu_s, a.group_capacity_cu_s) == (200.0, 800.0)
    assert a.fair_share_gpus_by_type == pytest.approx({"a100": a.fair_share_cu / 10})
    assert a.allocated_gpus_by_type == {"a100": 40}
    assert a.demand_gpus_by_type == {"a100": 100}
    assert a.competes_over_quota


def test_result_reports_effective_weights_and_idle_capacity() -> None:
    inp = FairShareInput(
        pool=POOL,
        policy=FairSharePolicy(),
        gpu_types={"a100": A100},
        capacity_gpus_by_type={"a100": 10},
        queues=[queue("a"), queue("b")],
        demands={"a": wants(2), "b": wants(3)},
    )
    result = compute_fair_shares(inp)
    assert result.capacity_cu == 100
    assert result.idle_cu == pytest.approx(50)
    assert result.effective_weights == pytest.approx({"a": 0.5, "b": 0.5})
    assert list(result.shares) == ["a", "b"]


def test_demand_for_an_inner_or_unknown_queue_is_rejected_with_its_path() -> None:
    queues = [queue("dept"), queue("team", parent="dept")]
    with pytest.raises(InvalidInputError) as raised:
        divide(
            queues,
            {
                "dept": wants(1),
                "ghost": wants(1),
                "team": QueueDemand(pending_gpus_by_type={"h200": 1}),
            },
            capacity_gpus=10,
        )
    paths = [v.field_path for v in raised.value.violations]
    assert paths == [
        'demands["dept"]',
        'demands["ghost"]',
        'demands["team"].pending_gpus_by_type["h200"]',
    ]


def test_engine_refuses_an_invalid_policy() -> None:
    with pytest.raises(InvalidInputError) as raised:
        divide([queue("a")], {}, capacity_gpus=10, policy=FairSharePolicy(k=-1.0))
    assert [v.field_path for v in raised.value.violations] == ["policy.k"]


def test_engine_refuses_a_cyclic_tree() -> None:
    with pytest.raises(InvalidInputError, match="cycle"):
        divide([queue("a", parent="b"), queue("b", parent="a")], {}, capacity_gpus=10)


def test_dead_band_never_leaves_capacity_idle() -> None:
    # Both previous weights were 0 and both new ones (0.5) are within the band: keeping them
    # would give nobody anything, so the unbanded weights apply.
    shares = divide(
        [queue("a"), queue("b")],
        {"a": wants(100), "b": wants(100)},
        capacity_gpus=100,
        policy=FairSharePolicy(dead_band=0.6),
        previous={"a": 0.0, "b": 0.0},
    )
    assert (gpus(shares["a"]), gpus(shares["b"])) == pytest.approx((50, 50))


def test_water_fill_gives_caps_exactly_and_one_level_to_the_rest() -> None:
    fill = water_fill(10.0, [1.0, 1.0, 2.0, 0.0], [0.1, 100.0, 100.0, 5.0])
    assert fill.shares[0] == 0.1  # the cap itself, not a float near it
    assert fill.shares[1:] == pytest.approx([9.9 / 3, 2 * 9.9 / 3, 0.0])
    assert fill.capped == [True, False, False, False]
    assert fill.leftover == 0.0
    everything = water_fill(10.0, [1.0, 3.0], [2.0, 3.0])
    assert everything.shares == [2.0, 3.0]
    assert everything.leftover == 5.0
