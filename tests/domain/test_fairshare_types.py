"""Per-GPU-type quotas and limits on top of the CU division (DESIGN §3.5)."""

from __future__ import annotations

import pytest
from fairshare_support import ALL_TYPES, POOL, divide, queue, wants

from gpufair.domain.fairshare import FairShareInput, QueueDemand, compute_fair_shares
from gpufair.domain.model import FairSharePolicy, Rounding
from gpufair.domain.usage import UsageInputs


def test_per_type_limit_caps_what_a_queue_may_hold_of_that_type() -> None:
    shares = divide(
        [queue("a", limit_gpus_by_type={"a100": 4}), queue("b")],
        {"a": wants(10), "b": wants(100)},
        capacity_gpus=20,
    )
    assert shares["a"].allowed_demand_cu == 40
    assert shares["a"].fair_share_cu == 40
    assert shares["b"].fair_share_cu == 160


def test_a_queue_cannot_be_given_more_of_a_type_than_the_pool_has() -> None:
    shares = divide(
        [queue("a"), queue("b")],
        {
            "a": wants(20, gpu_type="a100"),
            "b": wants(100, gpu_type="v100"),
        },
        capacity_gpus={"a100": 8, "v100": 30},
    )
    # a wants 20 A100s but the pool has 8: 80 CU at most; b takes the other 120 CU (30 V100s).
    assert shares["a"].allowed_demand_cu == 80
    assert shares["a"].fair_share_cu == pytest.approx(80)
    assert shares["b"].fair_share_cu == pytest.approx(120)
    assert shares["b"].fair_share_gpus_by_type == pytest.approx({"v100": 30})


def test_per_type_deserved_raises_the_cu_guarantee_to_its_worth() -> None:
    shares = divide(
        [queue("a", deserved_gpus_by_type={"a100": 4}), queue("b")],
        {"a": wants(10), "b": wants(100)},
        capacity_gpus=10,
        usage=UsageInputs(usage_cu_s={"a": 1e6}, group_capacity_cu_s={None: 1.0}),
    )
    assert shares["a"].deserved_cu == 40
    assert shares["a"].guaranteed_cu == 40
    assert shares["a"].fair_share_cu == 40  # heavy usage: nothing over quota, the guarantee kept


def test_per_type_guarantee_is_deserved_bounded_by_demand_and_limit() -> None:
    shares = divide(
        [
            queue("small", deserved_gpus_by_type={"a100": 4}),
            queue("capped", deserved_gpus_by_type={"a100": 4}, limit_gpus_by_type={"a100": 5}),
        ],
        {"small": wants(3), "capped": wants(2)},
        capacity_gpus=20,
    )
    assert shares["small"].guaranteed_gpus_by_type == {"a100": 3}
    assert shares["capped"].guaranteed_gpus_by_type == {"a100": 2}


def test_per_type_guarantees_shrink_together_when_the_pool_lacks_that_type() -> None:
    shares = divide(
        [
            queue("a", deserved_gpus_by_type={"a100": 4}),
            queue("b", deserved_gpus_by_type={"a100": 4}),
        ],
        {"a": wants(10), "b": wants(10)},
        capacity_gpus=6,
    )
    assert shares["a"].guaranteed_gpus_by_type == {"a100": 3}
    assert shares["b"].guaranteed_gpus_by_type == {"a100": 3}


def test_teams_per_type_guarantees_fit_inside_their_departments() -> None:
    queues = [
        queue("declares", deserved_gpus_by_type={"a100": 4}),
        queue("t1", parent="declares", deserved_gpus_by_type={"a100": 3}),
        queue("t2", parent="declares", deserved_gpus_by_type={"a100": 3}),
        queue("passes", deserved_cu=60),
        queue("t3", parent="passes", deserved_gpus_by_type={"a100": 2}),
        queue("t4", parent="passes"),
    ]
    shares = divide(
        queues,
        {"t1": wants(10), "t2": wants(10), "t3": wants(10), "t4": wants(10)},
        capacity_gpus=40,
    )
    assert shares["declares"].guaranteed_gpus_by_type == {"a100": 4}
    assert shares["t1"].guaranteed_gpus_by_type == {"a100": 2}
    assert shares["t2"].guaranteed_gpus_by_type == {"a100": 2}
    # A department that declares nothing for a type claims what its teams claim.
    assert shares["passes"].guaranteed_gpus_by_type == {"a100": 2}
    assert shares["t3"].guaranteed_gpus_by_type == {"a100": 2}
    assert shares["t4"].guaranteed_gpus_by_type == {}


def test_department_guarantee_is_not_passed_to_teams_that_declare_none() -> None:
    shares = divide(
        [
            queue("dept", deserved_gpus_by_type={"a100": 4}),
            queue("team", parent="dept"),
        ],
        {"team": wants(10)},
        capacity_gpus=10,
    )
    assert shares["dept"].guaranteed_gpus_by_type == {"a100": 4}
    assert shares["team"].guaranteed_gpus_by_type == {}


def test_fair_share_in_gpus_is_reported_only_where_one_type_is_involved() -> None:
    shares = divide(
        [queue("v100_only"), queue("mixed")],
        {
            "v100_only": wants(10, gpu_type="v100"),
            "mixed": QueueDemand(pending_gpus_by_type={"a100": 10, "v100": 10}),
        },
        capacity_gpus={"a100": 10, "v100": 10},
    )
    assert shares["v100_only"].fair_share_gpus_by_type == pytest.approx({"v100": 10})
    assert shares["mixed"].fair_share_gpus_by_type == {}
    assert shares["mixed"].demand_cu == 140


def test_whole_gpus_in_a_mixed_pool_round_to_the_smallest_card() -> None:
    result = compute_fair_shares(
        FairShareInput(
            pool=POOL,
            policy=FairSharePolicy(rounding=Rounding.WHOLE_GPUS),
            gpu_types=ALL_TYPES,
            capacity_gpus_by_type={"a100": 1, "rtx4090": 5},
            queues=[queue("a"), queue("b"), queue("c")],
            demands={
                "a": wants(5, gpu_type="rtx4090"),
                "b": wants(5, gpu_type="rtx4090"),
                "c": wants(1, gpu_type="a100"),
            },
        )
    )
    assert result.whole_gpu_unit_cu == 2
    shares = [result.shares[name].fair_share_cu for name in "abc"]
    assert sum(shares) == pytest.approx(20)
    assert all(share % 2 == 0 for share in shares)


def test_demand_on_a_type_the_pool_lacks_is_not_allowed_demand() -> None:
    shares = divide(
        [queue("a"), queue("b")],
        {"a": wants(10, gpu_type="v100"), "b": wants(100)},
        capacity_gpus={"a100": 10},
    )
    assert shares["a"].demand_cu == 40
    assert shares["a"].allowed_demand_cu == 0
    assert shares["b"].fair_share_cu == 100


def test_a_cu_limit_below_the_deserved_quota_caps_the_guarantee() -> None:
    # DESIGN §3.1: each queue first gets min(deserved, demand, limit). 10 A100 = 100 CU; q1
    # deserves 40 CU with a limit of 20 and wants all 10 GPUs, q2 has no quota and wants 10.
    # q1 is guaranteed 20 (its limit) and may hold no more; q2 gets the other 80.
    shares = divide(
        [queue("q1", deserved_cu=40, limit_cu=20), queue("q2")],
        {"q1": wants(10), "q2": wants(10)},
        capacity_gpus=10,
    )
    assert (shares["q1"].deserved_cu, shares["q1"].limit_cu) == (40, 20)
    assert shares["q1"].guaranteed_cu == 20
    assert shares["q1"].fair_share_cu == 20
    assert shares["q2"].fair_share_cu == 80


def test_a_cu_limit_below_the_per_type_quota_caps_the_per_type_guarantee() -> None:
    # q1 deserves 4 A100 (40 CU) with a CU limit of 20: its per-type guarantee is 2 A100, the
    # 20 CU it may hold, not the 4 it could never take. A per-type limit of 1 A100 below a
    # per-type quota of 3 caps that guarantee at 1 GPU, 10 CU.
    shares = divide(
        [
            queue("q1", deserved_gpus_by_type={"a100": 4}, limit_cu=20),
            queue("q2", deserved_gpus_by_type={"a100": 3}, limit_gpus_by_type={"a100": 1}),
            queue("q3"),
        ],
        {"q1": wants(10), "q2": wants(10), "q3": wants(10)},
        capacity_gpus=10,
    )
    assert shares["q1"].guaranteed_gpus_by_type == {"a100": 2}
    assert (shares["q1"].guaranteed_cu, shares["q1"].fair_share_cu) == (20, 20)
    assert shares["q2"].guaranteed_gpus_by_type == {"a100": 1}
    assert (shares["q2"].guaranteed_cu, shares["q2"].fair_share_cu) == (10, 10)
    assert shares["q3"].fair_share_cu == 70
