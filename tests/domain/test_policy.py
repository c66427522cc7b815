"""Validation of policies, GPU types and queue trees: one message per mistake, with its path."""

from __future__ import annotations

import math

import pytest
from fairshare_support import A100, ALL_TYPES, POOL, queue

from gpufair.domain.errors import InvalidInputError, Violation
from gpufair.domain.model import (
    FairSharePolicy,
    GpuType,
    Queue,
    QueueQuota,
    Rounding,
    UsageBasis,
    WindowKind,
)
from gpufair.domain.policy import (
    validate_gpu_types,
    validate_policy,
    validate_queue,
    validate_queues,
)
from gpufair.domain.tree import QueueTree


def _paths(violations: list[Violation]) -> list[str]:
    return [v.field_path for v in violations]


def test_default_policy_is_valid() -> None:
    assert validate_policy(FairSharePolicy()) == []


@pytest.mark.parametrize(
    ("changes", "path", "fragment"),
    [
        ({"k": -0.5}, "k", "≥ 0"),
        ({"k": math.nan}, "k", "finite"),
        ({"half_life_s": 0.0}, "half_life_s", "> 0"),
        ({"half_life_s": math.inf}, "half_life_s", "finite"),
        ({"half_life_s": 8 * 86400.0}, "window_s", "≥ half_life_s"),
        ({"window_s": -1.0}, "window_s", "> 0"),
        ({"window_kind": "rolling"}, "window_kind", "sliding, tumbling, none"),
        ({"usage_basis": "cluster"}, "usage_basis", "over_quota, total"),
        ({"rounding": "nearest"}, "rounding", "continuous, whole_gpus"),
        ({"recompute_interval_s": 0.0}, "recompute_interval_s", "> 0"),
        ({"dead_band": 1.0}, "dead_band", "< 1"),
        ({"dead_band": -0.1}, "dead_band", "≥ 0"),
        (
            {"window_kind": WindowKind.TUMBLING, "window_anchor_unix_s": math.nan},
            "window_anchor_unix_s",
            "finite",
        ),
    ],
)
def test_each_policy_mistake_is_named_by_its_field(
    changes: dict[str, object], path: str, fragment: str
) -> None:
    policy = FairSharePolicy(**changes)  # type: ignore[arg-type]
    violations = validate_policy(policy)
    assert _paths(violations) == [path]
    assert fragment in violations[0].message


def test_window_none_needs_no_length_against_the_half_life() -> None:
    policy = FairSharePolicy(window_kind=WindowKind.NONE, window_s=1.0, half_life_s=86400.0)
    assert validate_policy(policy) == []


def test_every_known_enum_value_is_accepted() -> None:
    for kind in WindowKind:
        for basis in UsageBasis:
            for rounding in Rounding:
                policy = FairSharePolicy(window_kind=kind, usage_basis=basis, rounding=rounding)
                assert validate_policy(policy) == []


def test_gpu_types_need_unique_names_and_positive_compute_weight() -> None:
    violations = validate_gpu_types(
        [A100, GpuType("a100", 80.0, 10.0), GpuType("bad", -1.0, 0.0), GpuType("", 1.0, 1.0)]
    )
    assert _paths(violations) == ["[1].name", "[2].memory_gib", "[2].compute_weight", "[3].name"]


def test_queue_quota_numbers_are_checked_with_map_keys_in_the_path() -> None:
    bad = Queue(
        name="team",
        quotas={
            POOL: QueueQuota(
                pool=POOL,
                deserved_cu=-1.0,
                over_quota_weight=math.nan,
                limit_gpus_by_type={"a100": 2.0},
                deserved_gpus_by_type={"a100": 4.0, "h200": 1.0},
            ),
            "elsewhere": QueueQuota(pool="other", deserved_cu=50.0, limit_cu=10.0),
        },
    )
    violations = validate_queue(bad, pools={POOL}, gpu_types=ALL_TYPES)
    assert _paths(violations) == [
        f'quotas["{POOL}"].deserved_cu',
        f'quotas["{POOL}"].over_quota_weight',
        f'quotas["{POOL}"].deserved_gpus_by_type["h200"]',
        'quotas["elsewhere"].pool',
        'quotas["elsewhere"]',
    ]


def test_limits_below_what_they_bound_are_accepted() -> None:
    # DESIGN §3.1: the guarantee is min(deserved, demand, limit), so the limit caps it: a CU
    # limit of 30 below the 40 CU of 4 A100s, a per-type limit of 2 A100s below 4.
    team = queue(
        "team",
        deserved_cu=10.0,
        limit_cu=30.0,
        deserved_gpus_by_type={"a100": 4.0},
        limit_gpus_by_type={"a100": 2.0},
    )
    assert validate_queue(team, gpu_types=ALL_TYPES) == []


def test_queue_cannot_be_its_own_parent() -> None:
    assert _paths(validate_queue(Queue(name="a", parent="a"))) == ["parent"]


def test_tree_mistakes_point_at_the_queue_that_makes_them() -> None:
    queues = [
        queue("a"),
        queue("a"),
        queue("orphan", parent="nowhere"),
        queue("x", parent="z"),
        queue("y", parent="x"),
        queue("z", parent="y"),
    ]
    violations = validate_queues(queues)
    assert _paths(violations) == [
        "[1].name",
        "[2].parent",
        "[3].parent",
        "[4].parent",
        "[5].parent",
    ]
    assert "x → z → y → x" in violations[2].message


def test_children_may_not_be_promised_more_than_their_department() -> None:
    queues = [
        queue("dept", deserved_cu=50.0),
        queue("t1", parent="dept", deserved_cu=30.0),
        queue("t2", parent="dept", deserved_gpus_by_type={"a100": 3.0}),
    ]
    violations = validate_queues(queues, gpu_types=ALL_TYPES)
    assert _paths(violations) == [f'[0].quotas["{POOL}"].deserved_cu']
    assert "60" in violations[0].message
    fitting = [queue("dept", deserved_cu=60.0), *queues[1:]]
    assert validate_queues(fitting, gpu_types=ALL_TYPES) == []


def test_a_valid_tree_has_no_violations() -> None:
    queues = [
        queue("ml", deserved_cu=40.0, limit_cu=100.0),
        queue("nlp", parent="ml", deserved_cu=20.0),
        queue("cv", parent="ml", deserved_cu=20.0, limit_gpus_by_type={"a100": 8.0}),
    ]
    assert validate_queues(queues, pools={POOL}, gpu_types=ALL_TYPES) == []


def test_queue_tree_refuses_to_build_from_a_broken_list() -> None:
    with pytest.raises(InvalidInputError) as raised:
        QueueTree.build([queue("a", parent="missing")])
    assert _paths(list(raised.value.violations)) == ["[0].parent"]
    assert "unknown parent" in str(raised.value)


def test_queue_tree_orders_parents_before_children() -> None:
    tree = QueueTree.build(
        [queue("b2", parent="b"), queue("a"), queue("b"), queue("b1", parent="b")]
    )
    assert tree.preorder == ("a", "b", "b1", "b2")
    assert tree.postorder() == ("b2", "b1", "b", "a")
    assert tree.inner_groups() == (None, "b")
    assert tree.is_leaf("a") and not tree.is_leaf("b")
