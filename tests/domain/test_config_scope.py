"""Scoped configs and the reference half of the deletion rules, without a database."""

from __future__ import annotations

from gpufair.domain.config_diff import diff_configs
from gpufair.domain.config_rules import validate_config
from gpufair.domain.config_scope import (
    capped,
    dangling_references,
    deletes_whole_scope,
    in_scope,
    out_of_scope_objects,
    scope_of,
    scoped,
)
from gpufair.domain.errors import Violation
from gpufair.domain.model import (
    Budget,
    BudgetPeriod,
    ClusterConfig,
    GpuType,
    Node,
    NodePool,
    Queue,
    QueueQuota,
    frozen_map,
)

STORED = ClusterConfig(
    gpu_types=(GpuType("a100", 80, 10),),
    pools=(NodePool("main"),),
    nodes=(Node("n1", "main", "a100", 8, 1000, 1000),),
    queues=(
        Queue("dept"),
        Queue(
            "team",
            parent="dept",
            quotas=frozen_map(
                {"main": QueueQuota("main", 40, deserved_gpus_by_type=frozen_map({"a100": 2}))}
            ),
        ),
    ),
    budgets=(Budget("team", BudgetPeriod.WEEK, 100, pool="main"),),
)


def test_a_scoped_config_takes_the_callers_kinds_and_the_stored_others() -> None:
    mine = ClusterConfig(
        queues=(Queue("solo", quotas=frozen_map({"main": QueueQuota("main", 5)})),)
    )
    final = scoped(STORED, mine, scope_of(["queue"]))
    assert [q.name for q in final.queues] == ["solo"]
    assert final.nodes == STORED.nodes and final.budgets == STORED.budgets
    # The quota names a stored pool: no violation in the caller's part; the stored budget now
    # names a queue that is gone, which is the deletion rules' to report, not a field's.
    assert in_scope(validate_config(final), {"queue"}) == []
    assert [v.field_path for v in validate_config(final)] == ["budgets[0].queue"]
    gone = {"queue": {"dept", "team"}}
    assert dangling_references(final, gone) == ["budget of team uses queue team"]


def test_dangling_references_of_every_kind() -> None:
    final = STORED
    gone = {"gpu_type": {"a100"}, "pool": {"main"}, "queue": {"dept"}}
    assert dangling_references(final, gone) == [
        "node n1 uses gpu_type a100",
        "node n1 uses pool main",
        "queue team uses queue dept",
        "queue team uses pool main",
        "queue team uses gpu_type a100",
        "budget of team uses pool main",
    ]


def test_only_an_apply_that_keeps_nothing_deletes_the_whole_scope() -> None:
    empty = ClusterConfig()
    assert deletes_whole_scope(STORED, empty, scope_of([]))
    assert deletes_whole_scope(STORED, scoped(STORED, empty, {"budget"}), {"budget"})
    renamed = ClusterConfig(queues=(Queue("other"),))
    assert not deletes_whole_scope(STORED, scoped(STORED, renamed, {"queue"}), {"queue"})
    assert not deletes_whole_scope(empty, empty, scope_of([]))  # nothing stored, nothing lost
    assert len(diff_configs(STORED, empty)) == 6


def test_objects_outside_the_scope_are_named_by_list() -> None:
    assert out_of_scope_objects(STORED, {"queue", "budget"}) == [
        Violation(
            "gpu_types",
            "1 gpu_type object(s) outside this apply's kinds (budget, queue): "
            "leave them out or add gpu_type to kinds",
        ),
        Violation(
            "pools",
            "1 pool object(s) outside this apply's kinds (budget, queue): "
            "leave them out or add pool to kinds",
        ),
        Violation(
            "nodes",
            "1 node object(s) outside this apply's kinds (budget, queue): "
            "leave them out or add node to kinds",
        ),
    ]


def test_capped_lists_say_how_many_more() -> None:
    assert capped([f"x{i}" for i in range(12)]) == "; ".join(f"x{i}" for i in range(10)) + (
        "; and 2 more"
    )
    assert capped(["a", "b"]) == "a; b"
