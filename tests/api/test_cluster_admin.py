"""ClusterAdmin over a real gRPC channel against a real PostgreSQL."""

from __future__ import annotations

import math
from pathlib import Path

import grpc
import pytest
from sqlalchemy import Engine, text

from gpufair.api.server import build_server
from gpufair.client import GpufairClient, field_violations
from gpufair.config_file import load_config_file, parse_config
from gpufair.v1 import cluster_pb2 as pb

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "clusters"


def small_config() -> pb.ClusterConfig:
    return parse_config(
        {
            "gpu_types": [
                {"name": "a100-80gb", "memory_gib": 80, "compute_weight": 10},
                {"name": "rtx4090-24gb", "memory_gib": 24, "compute_weight": 2},
            ],
            "pools": [{"name": "main", "policy": {"window_s": "7d", "k": 1}}],
            "nodes": [
                {
                    "name": "n1",
                    "pool": "main",
                    "gpu_type": "a100-80gb",
                    "gpu_count": 8,
                    "cpu_millicores": 64000,
                    "memory_mib": 524288,
                    "labels": {"rack": "r1"},
                },
                {
                    "name": "n2",
                    "pool": "main",
                    "gpu_type": "rtx4090-24gb",
                    "gpu_count": 4,
                    "cpu_millicores": 32000,
                    "memory_mib": 131072,
                },
            ],
            "queues": [
                {"name": "dept"},
                {
                    "name": "team-a",
                    "parent": "dept",
                    "quotas": [{"pool": "main", "deserved_cu": 40, "over_quota_weight": 2}],
                },
                {
                    "name": "team-b",
                    "parent": "dept",
                    "quotas": [{"pool": "main", "deserved_cu": 20, "priority": 1}],
                },
            ],
        }
    )


def test_reference_example_round_trips(client: GpufairClient) -> None:
    config = load_config_file(EXAMPLES / "llm-vs-vision.yaml")
    reply = client.apply_config(config)
    assert reply.applied and reply.config_version == 1
    created = {(c.kind, c.name) for c in reply.changes}
    assert ("queue", "llm") in created and ("node", "gpu-25") in created
    assert len(reply.changes) == 1 + 1 + 25 + 2 + 2  # type, pool, nodes, queues, budgets

    stored = client.get_config()
    assert stored.config_version == 1
    assert sum(n.gpu_count for n in stored.config.nodes) == 100
    deserved = {q.name: q.quotas[0].deserved_cu for q in stored.config.queues}
    assert deserved == {"llm": 30.0, "vision": 20.0}
    policy = stored.config.pools[0].policy
    assert policy.window_s == 7 * 86400 and policy.k == 1.0
    assert policy.window_kind == pb.WINDOW_KIND_SLIDING
    assert not policy.HasField("half_life_s")
    labels = {n.name: dict(n.labels) for n in stored.config.nodes}
    assert labels["gpu-07"] == {"rack": "r2", "nvlink-domain": "gpu-07"}

    # What GetConfig returns, applied again, is the same state: no changes, same version.
    again = client.apply_config(stored.config)
    assert list(again.changes) == [] and again.config_version == 1


def test_applying_twice_changes_nothing(client: GpufairClient) -> None:
    first = client.apply_config(small_config())
    second = client.apply_config(small_config())
    assert len(first.changes) == 8  # 2 types, 1 pool, 2 nodes, 3 queues
    assert list(second.changes) == []
    assert second.config_version == first.config_version == 1


def test_dry_run_shows_the_diff_and_writes_nothing(client: GpufairClient) -> None:
    reply = client.apply_config(small_config(), dry_run=True)
    assert not reply.applied
    assert len(reply.changes) == 8
    stored = client.get_config()
    assert stored.config_version == 0
    assert len(stored.config.nodes) == 0


def test_update_reports_field_changes_and_keeps_the_rest(client: GpufairClient) -> None:
    client.apply_config(small_config())
    changed = small_config()
    changed.queues[1].quotas[0].deserved_cu = 50
    changed.nodes[0].labels["rack"] = "r9"
    del changed.nodes[1]  # declarative: a node left out is deleted
    reply = client.apply_config(changed)
    by_name = {(c.kind, c.name): c for c in reply.changes}
    assert set(by_name) == {("queue", "team-a"), ("node", "n1"), ("node", "n2")}
    quota_change = by_name[("queue", "team-a")].fields
    assert [(f.field, f.before, f.after) for f in quota_change] == [
        ("quotas[main].deserved_cu", "40", "50")
    ]
    assert by_name[("node", "n2")].action == pb.CHANGE_ACTION_DELETE
    assert reply.config_version == 2
    stored = client.get_config().config
    assert [n.name for n in stored.nodes] == ["n1"]
    assert stored.nodes[0].labels["rack"] == "r9"


def test_broken_config_lists_every_violation_and_stores_nothing(client: GpufairClient) -> None:
    config = small_config()
    config.gpu_types.add(name="a100-80gb", memory_gib=80, compute_weight=10)  # duplicate
    config.gpu_types[1].memory_gib = -24
    config.nodes[1].gpu_type = "h200"
    config.queues[1].quotas[0].over_quota_weight = math.nan
    config.queues.add(name="orphan", parent="nowhere")
    config.queues.add(name="loop-a", parent="loop-b")
    config.queues.add(name="loop-b", parent="loop-a")
    config.pools[0].policy.half_life_s = 30 * 86400  # longer than the 7-day window
    with pytest.raises(grpc.RpcError) as err:
        client.apply_config(config)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    violations = dict(field_violations(err.value))
    assert set(violations) == {
        "config.gpu_types[2].name",
        "config.gpu_types[1].memory_gib",
        "config.nodes[1].gpu_type",
        "config.queues[1].quotas[0].over_quota_weight",
        "config.queues[3].parent",
        "config.queues[4].parent",
        "config.queues[5].parent",
        "config.pools[0].policy.window_s",
    }
    assert "duplicate name 'a100-80gb'" in violations["config.gpu_types[2].name"]
    assert violations["config.queues[3].parent"] == "unknown parent queue 'nowhere'"
    assert "cycle: loop-a → loop-b → loop-a" in violations["config.queues[4].parent"]
    assert "cycle" in violations["config.queues[5].parent"]
    assert "unknown GPU type 'h200'" in violations["config.nodes[1].gpu_type"]
    assert client.get_config().config_version == 0


def test_unknown_enum_value_is_a_field_violation(client: GpufairClient) -> None:
    config = small_config()
    config.pools[0].policy.window_kind = 42  # type: ignore[assignment]
    with pytest.raises(grpc.RpcError) as err:
        client.apply_config(config)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(field_violations(err.value)) == {
        "config.pools[0].policy.window_kind": "unknown enum value 42"
    }


def test_quotas_above_capacity_are_accepted_with_a_warning(client: GpufairClient) -> None:
    config = small_config()  # 8 x 10 + 4 x 2 = 88 CU
    config.queues.add(name="greedy", quotas=[pb.QueueQuota(pool="main", deserved_cu=100)])
    reply = client.apply_config(config)
    assert reply.applied
    assert any("100 CU, more than its 88 CU" in w for w in reply.warnings), reply.warnings


def test_request_id_replay_returns_the_stored_reply(client: GpufairClient) -> None:
    first = client.apply_config(small_config(), request_id="apply-1")
    changed = small_config()
    changed.nodes[0].gpu_count = 4
    client.apply_config(changed)  # version 2 in between
    replay = client.apply_config(small_config(), request_id="apply-1")
    assert replay == first
    assert client.get_config().config_version == 2
    with pytest.raises(grpc.RpcError) as err:
        client.apply_config(changed, request_id="apply-1")
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS


def test_delete_objects(client: GpufairClient) -> None:
    client.apply_config(small_config())
    with pytest.raises(grpc.RpcError) as err:
        client.delete_objects("gpu_type", ["a100-80gb"])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "node n1" in (err.value.details() or "")

    with pytest.raises(grpc.RpcError) as err:
        client.delete_objects("node", ["n7"])
    assert err.value.code() == grpc.StatusCode.NOT_FOUND

    with pytest.raises(grpc.RpcError) as err:
        client.delete_objects("planet", ["x"])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    dry = client.delete_objects("node", ["n1"], dry_run=True)
    assert [(c.kind, c.name) for c in dry.changes] == [("node", "n1")]
    assert len(client.get_config().config.nodes) == 2

    reply = client.delete_objects("node", ["n1", "n2"])
    assert reply.applied and reply.config_version == 2
    reply = client.delete_objects("gpu_type", ["a100-80gb"])
    stored = client.get_config().config
    assert [g.name for g in stored.gpu_types] == ["rtx4090-24gb"]
    assert stored.nodes == []


def test_deleting_a_parent_queue_with_children_is_refused(client: GpufairClient) -> None:
    client.apply_config(small_config())
    with pytest.raises(grpc.RpcError) as err:
        client.delete_objects("queue", ["dept"])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    client.delete_objects("queue", ["dept", "team-a", "team-b"])
    assert client.get_config().config.queues == []


def test_config_changes_are_stamped_by_the_servers_clock(db: Engine) -> None:
    """ClusterAdmin reads the instant from the clock it is given, like the other services: the
    pool's capacity history starts when the (pinned) clock says the config was applied."""
    pinned_s = 1_767_225_600.0  # 2026-01-01 00:00 UTC
    running = build_server(db, "127.0.0.1:0", max_workers=2, clock=lambda: pinned_s)
    try:
        with GpufairClient(f"127.0.0.1:{running.port}", attempts=1) as c:
            c.apply_config(small_config())
            c.upsert_nodes([pb.Node(name="n3", pool="main", gpu_type="a100-80gb", gpu_count=8)])
    finally:
        running.stop(1.0)
    with db.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT extract(epoch FROM changed_at)::float8, capacity_cu "
                "FROM pool_capacity_changes WHERE pool = 'main'"
            )
        ).all()
    # Both changes at the pinned instant: the upsert's 80 CU more replaced the first row.
    assert [tuple(r) for r in rows] == [(pinned_s, 8 * 10 + 4 * 2 + 8 * 10)]


def test_every_policy_field_goes_through_the_api_and_the_store(client: GpufairClient) -> None:
    """Each FairSharePolicy field, set away from its default, comes back from GetConfig as sent:
    the conversions walk the policy's fields, so a new field cannot be dropped on the way."""
    config = small_config()
    policy = config.pools[0].policy
    policy.CopyFrom(
        pb.FairSharePolicy(
            window_kind=pb.WINDOW_KIND_TUMBLING,
            window_s=86400.0,
            window_anchor_unix_s=3600.0,
            half_life_s=7200.0,
            k=2.5,
            usage_basis=pb.USAGE_BASIS_TOTAL,
            recompute_interval_s=30.0,
            rounding=pb.ROUNDING_WHOLE_GPUS,
            dead_band=0.2,
            division=pb.DIVISION_KAI,
        )
    )
    set_fields = {f.name for f, _ in policy.ListFields()}
    assert set_fields == {f.name for f in pb.FairSharePolicy.DESCRIPTOR.fields}
    client.apply_config(config)
    stored = client.get_config().config.pools[0].policy
    assert stored == policy


def test_a_limit_below_deserved_is_accepted_with_a_warning_under_both_divisions(
    client: GpufairClient,
) -> None:
    """DESIGN §3.1: a queue is guaranteed min(deserved, demand, limit), so a limit below the
    deserved quota caps the guarantee, under gpufair's rules as under KAI-Scheduler's; the reply
    says so, as a typo would look the same."""
    data = {
        "gpu_types": [{"name": "a100-80gb", "memory_gib": 80, "compute_weight": 10}],
        "pools": [{"name": "main", "policy": {"division": "gpufair"}}],
        "queues": [
            {"name": "team", "quotas": [{"pool": "main", "deserved_cu": 40, "limit_cu": 20}]}
        ],
    }
    warning = (
        "pool 'main': queue 'team' has limit_cu 20 below its deserved 40 CU: "
        "it is guaranteed 20 CU at most"
    )
    for division, stored_division in (("gpufair", pb.DIVISION_GPUFAIR), ("kai", pb.DIVISION_KAI)):
        data["pools"][0]["policy"] = {"division": division}  # type: ignore[index]
        reply = client.apply_config(parse_config(data))
        assert reply.applied
        assert warning in reply.warnings, reply.warnings
        stored = client.get_config().config
        assert stored.pools[0].policy.division == stored_division
        quota = stored.queues[0].quotas[0]
        assert (quota.deserved_cu, quota.limit_cu) == (40, 20)


def test_every_pool_field_goes_through_the_api_and_the_store(client: GpufairClient) -> None:
    """Each NodePool field besides name and policy, set away from its default, comes back from
    GetConfig as sent, and a change of `gang_entitlement` in a config file shows in the diff."""
    config = small_config()
    pool = config.pools[0]
    pool.placement = pb.PLACEMENT_STRATEGY_SPREAD
    pool.gang_reservation_after_s = 1800.0
    pool.max_borrow_s = 7200.0
    pool.gang_entitlement = True
    pool.topology_levels[:] = ["rack", "zone"]
    pool.max_moved_share_per_hour = 0.1
    set_fields = {f.name for f, _ in pool.ListFields()} - {"name", "policy"}
    assert set_fields == {f.name for f in pb.NodePool.DESCRIPTOR.fields} - {"name", "policy"}
    client.apply_config(config)
    stored = client.get_config().config.pools[0]
    assert stored.placement == pb.PLACEMENT_STRATEGY_SPREAD
    assert stored.gang_reservation_after_s == 1800.0
    assert stored.max_borrow_s == 7200.0
    assert stored.HasField("gang_entitlement") and stored.gang_entitlement is True
    assert list(stored.topology_levels) == ["rack", "zone"]
    assert stored.max_moved_share_per_hour == 0.1

    data = {
        "gpu_types": [{"name": "a100-80gb", "memory_gib": 80, "compute_weight": 10}],
        "pools": [{"name": "main"}],
    }
    client.apply_config(parse_config(data))
    assert client.get_config().config.pools[0].gang_entitlement is False  # unset: off
    data["pools"] = [{"name": "main", "gang_entitlement": True}]
    reply = client.apply_config(parse_config(data))
    [change] = reply.changes
    assert [(f.field, f.before, f.after) for f in change.fields] == [
        ("gang_entitlement", "false", "true")
    ]
    assert client.get_config().config.pools[0].gang_entitlement is True


def test_max_borrow_s_is_stored_diffed_and_checked(client: GpufairClient) -> None:
    """Borrowing with a time limit: per pool and per queue quota, written as durations in a
    config file, stored, shown in the diff; anything but a finite number > 0 is refused."""
    data = {
        "gpu_types": [{"name": "a100-80gb", "memory_gib": 80, "compute_weight": 10}],
        "pools": [{"name": "main", "max_borrow_s": "2h"}],
        "queues": [{"name": "team", "quotas": [{"pool": "main", "max_borrow_s": "30m"}]}],
    }
    client.apply_config(parse_config(data))
    stored = client.get_config().config
    assert stored.pools[0].max_borrow_s == 7200
    assert stored.queues[0].quotas[0].max_borrow_s == 1800

    data["queues"][0]["quotas"][0]["max_borrow_s"] = "1h"  # type: ignore[index]
    reply = client.apply_config(parse_config(data))
    [change] = reply.changes
    assert [(f.field, f.before, f.after) for f in change.fields] == [
        ("quotas[main].max_borrow_s", "1800", "3600")
    ]

    broken = parse_config(data)
    broken.pools[0].max_borrow_s = 0
    broken.queues[0].quotas[0].max_borrow_s = -5
    with pytest.raises(grpc.RpcError) as err:
        client.apply_config(broken)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(field_violations(err.value)) == {
        "config.pools[0].max_borrow_s": "must be in [0.001, 3.16224e+08], got 0",
        "config.queues[0].quotas[0].max_borrow_s": "must be in [0.001, 3.16224e+08], got -5",
    }
    unset = parse_config({**data, "pools": [{"name": "main"}]})
    client.apply_config(unset)
    assert not client.get_config().config.pools[0].HasField("max_borrow_s")
