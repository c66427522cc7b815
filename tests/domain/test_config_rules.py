"""Config validation and diffs, as pure functions."""

from __future__ import annotations

from gpufair.domain.config_diff import ChangeAction, diff_configs
from gpufair.domain.config_rules import config_warnings, validate_config
from gpufair.domain.model import (
    ClusterConfig,
    GpuType,
    Node,
    NodePool,
    Queue,
    QueueQuota,
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
    return {v.field_path: v.message for v in validate_config(cfg)}


def test_valid_config_has_no_violations() -> None:
    assert validate_config(config()) == []


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
    # Limits below the quotas they bound are allowed (they cap the guarantee, DESIGN §3.1).
    assert set(found) == {
        "queues[0].quotas[0].deserved_gpus_by_type[h200]",
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
                Queue("orphan", "nowhere"),
            )
        )
    )
    assert found["queues[0].parent"] == "queue tree has a cycle: self → self"
    # Every member of a cycle is named, so the whole loop shows.
    for i in (1, 2, 3):
        assert found[f"queues[{i}].parent"].startswith("queue tree has a cycle:")
    assert "x → y → z → x" in found["queues[1].parent"]
    assert "not a valid name" in found["queues[4].name"]
    assert found["queues[5].parent"] == "unknown parent queue 'nowhere'"


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


def test_warning_when_a_limit_is_below_the_quota_it_caps() -> None:
    # 4 A100 at 10 CU raise the 30 CU quota to 40 CU; a limit of 25 CU caps that guarantee, as
    # a limit of 1 A100 caps the 4 deserved of the type. Allowed, but said, as a typo would be.
    quota = QueueQuota(
        "main",
        deserved_cu=30,
        limit_cu=25,
        deserved_gpus_by_type=frozen_map({"a100": 4}),
        limit_gpus_by_type=frozen_map({"a100": 1}),
    )
    cfg = config(queues=(Queue("a", None, frozen_map({"main": quota})),))
    assert validate_config(cfg) == []
    assert config_warnings(cfg) == [
        "pool 'main': queue 'a' has limit_cu 25 below its deserved 40 CU: "
        "it is guaranteed 25 CU at most",
        "pool 'main': queue 'a' has limit_gpus_by_type[a100] 1 below its deserved 4 GPUs of "
        "that type: it is guaranteed 1 at most",
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
