"""Config validation and diffs, as pure functions."""

from __future__ import annotations

import math

from gpufair.domain.config_diff import ChangeAction, diff_configs
from gpufair.domain.config_rules import config_warnings, policy_violations, validate_config
from gpufair.domain.model import (
    ClusterConfig,
    FairSharePolicy,
    GpuType,
    Node,
    NodePool,
    Queue,
    QueueQuota,
    WindowKind,
    frozen_map,
)


def config(**overrides: object) -> ClusterConfig:
    base: dict[str, object] = {
        "gpu_types": (GpuType("a100", 80, 10),),
        "pools": (NodePool("main"),),
        "nodes": (Node("n1", "main", "a100", 8, 64000, 512000),),
        "queues": (
            Queue("dept"),
            Queue("a", "dept", frozen_map({"main": QueueQuota("main", deserved_cu=40)})),
        ),
    }
    base.update(overrides)
    return ClusterConfig(**base)  # type: ignore[arg-type]


def fields(cfg: ClusterConfig) -> dict[str, str]:
    return {v.field: v.description for v in validate_config(cfg)}


def test_valid_config_has_no_violations() -> None:
    assert validate_config(config()) == []


def test_policy_rules() -> None:
    assert policy_violations(FairSharePolicy()) == []
    bad = FairSharePolicy(
        window_s=3600, half_life_s=7200, k=-1, recompute_interval_s=0, dead_band=math.inf
    )
    assert {v.field for v in policy_violations(bad)} == {
        "window_s",
        "k",
        "recompute_interval_s",
        "dead_band",
    }
    # Without a window a half-life longer than "the window" is fine: there is none.
    no_window = FairSharePolicy(window_kind=WindowKind.NONE, window_s=1, half_life_s=86400)
    assert policy_violations(no_window) == []
    assert {v.field for v in policy_violations(FairSharePolicy(half_life_s=0))} == {"half_life_s"}


def test_quota_rules() -> None:
    quota = QueueQuota(
        "main",
        deserved_cu=50,
        limit_cu=40,
        deserved_gpus_by_type=frozen_map({"a100": 4, "h200": 1}),
        limit_gpus_by_type=frozen_map({"a100": 2}),
        over_quota_weight=-1,
    )
    found = fields(config(queues=(Queue("a", None, frozen_map({"main": quota})),)))
    assert set(found) == {
        "queues[0].quotas[0].limit_cu",
        "queues[0].quotas[0].deserved_gpus_by_type[h200]",
        "queues[0].quotas[0].limit_gpus_by_type[a100]",
        "queues[0].quotas[0].over_quota_weight",
    }


def test_tree_rules() -> None:
    found = fields(
        config(
            queues=(
                Queue("self", "self"),
                Queue("x", "y"),
                Queue("y", "z"),
                Queue("z", "x"),
                Queue("bad name!"),
            )
        )
    )
    assert found["queues[0].parent"] == "a queue cannot be its own parent"
    assert found["queues[1].parent"].startswith("cycle in the queue tree: x -> y -> z -> x")
    assert "queues[2].parent" not in found  # one cycle, reported once
    assert "not a valid name" in found["queues[4].name"]


def test_deep_tree_is_refused() -> None:
    chain = tuple(Queue(f"q{i}", f"q{i - 1}" if i else None) for i in range(20))
    assert "deeper than 16 levels" in fields(config(queues=chain))["queues[17].parent"]


def test_warning_when_guarantees_exceed_capacity() -> None:
    queues = (Queue("a", None, frozen_map({"main": QueueQuota("main", deserved_cu=100)})),)
    warnings = config_warnings(config(queues=queues))
    assert warnings == [
        "pool 'main': top-level deserved quotas add up to 100 CU, more than its 80 CU: "
        "guarantees cannot all hold at once"
    ]


def test_diff_orders_creates_before_deletes_and_names_fields() -> None:
    old = config()
    new = config(
        nodes=(Node("n2", "main", "a100", 4, 64000, 512000),),
        queues=(
            Queue("dept"),
            Queue("a", "dept", frozen_map({"main": QueueQuota("main", deserved_cu=60)})),
        ),
    )
    changes = diff_configs(old, new)
    assert [(c.kind, c.name, c.action) for c in changes] == [
        ("node", "n2", ChangeAction.CREATE),
        ("queue", "a", ChangeAction.UPDATE),
        ("node", "n1", ChangeAction.DELETE),
    ]
    assert [(f.field, f.before, f.after) for f in changes[1].fields] == [
        ("quotas[main].deserved_cu", "40", "60")
    ]
    assert diff_configs(new, new) == []
