"""ApplyConfig cannot wreck the cluster: deletions follow the rules of DeleteObjects, an empty
config needs confirm_delete_all, scoped applies leave other kinds alone, expected_version guards
against lost updates, and a dry run refuses exactly what the real apply refuses."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import pytest
from sqlalchemy import Engine, text

from gpufair.client import GpufairClient, field_violations
from gpufair.config_file import parse_config
from gpufair.v1 import cluster_pb2 as pb
from tests.api.ledger_support import CLUSTER, STARTED, STOPPED, STORED, event, report, submit

EVERYTHING = "gpu_type a100, rtx4090; node a1, a2, r1; pool main; queue llm, vision"


def with_budget() -> pb.ClusterConfig:
    return parse_config(
        {**CLUSTER, "budgets": [{"queue": "llm", "period": "month", "cu_hours": 5000}]}
    )


def refusal(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert isinstance(err.value, grpc.Call)
    return err.value.code(), err.value.details() or ""


def snapshot(client: GpufairClient) -> tuple[int, bytes]:
    stored = client.get_config()
    return stored.config_version, stored.config.SerializeToString(deterministic=True)


def start(client: GpufairClient, uid: str, node: str) -> None:
    submit(client, uid)
    started = event(STARTED, uid, time.time() - 600, [(node, [0, 1], 1.0)])
    assert report(client, started)[0].status == STORED


def test_empty_apply_while_work_runs_is_refused_and_its_stop_still_counts(
    client: GpufairClient,
) -> None:
    client.apply_config(with_budget())
    start(client, "job-1", "a1")
    before = snapshot(client)

    code, details = refusal(lambda: client.apply_config(pb.ClusterConfig()))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert details == (
        "this apply would delete all 9 stored objects of the config (gpu_type, pool, node, "
        "queue, budget) and keep none: set confirm_delete_all if that is meant. "
        "Nothing was changed."
    )
    # Even when the caller means it, what runs keeps what it uses.
    code, details = refusal(
        lambda: client.apply_config(pb.ClusterConfig(), confirm_delete_all=True)
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert details == (
        f"cannot delete budget llm/month/*; {EVERYTHING}. In use: running workload job-1 uses "
        "pool main; running workload job-1 uses node a1. Nothing was changed."
    )
    assert snapshot(client) == before

    stopped = event(STOPPED, "job-1", time.time() - 60)
    assert report(client, stopped)[0].status == STORED
    listed = client.list_workloads(states=["finished"])
    assert [(w.workload.uid, w.state) for w in listed] == [("job-1", "finished")]


def test_confirm_delete_all_on_an_idle_cluster_deletes_everything(client: GpufairClient) -> None:
    client.apply_config(with_budget())
    code, _ = refusal(lambda: client.apply_config(pb.ClusterConfig()))
    assert code == grpc.StatusCode.FAILED_PRECONDITION

    dry = client.apply_config(pb.ClusterConfig(), confirm_delete_all=True, dry_run=True)
    assert not dry.applied and dry.config_version == 1
    assert len(dry.changes) == 9
    assert all(c.action == pb.CHANGE_ACTION_DELETE for c in dry.changes)
    assert client.get_config().config_version == 1

    reply = client.apply_config(pb.ClusterConfig(), confirm_delete_all=True)
    assert reply.applied and reply.config_version == 2
    assert [(c.kind, c.name) for c in reply.changes] == [
        ("budget", "llm/month/*"),
        ("queue", "llm"),
        ("queue", "vision"),
        ("node", "a1"),
        ("node", "a2"),
        ("node", "r1"),
        ("pool", "main"),
        ("gpu_type", "a100"),
        ("gpu_type", "rtx4090"),
    ]
    stored = client.get_config()
    assert stored.config_version == 2
    assert stored.config == pb.ClusterConfig()


def test_a_pending_workload_does_not_block_deleting_its_queue(client: GpufairClient) -> None:
    client.apply_config(with_budget())
    submit(client, "waiting", queue="vision")
    config = with_budget()
    del config.queues[1]
    reply = client.apply_config(config)
    assert [(c.kind, c.name) for c in reply.changes] == [("queue", "vision")]


def test_apply_and_delete_objects_refuse_the_same_deletions(client: GpufairClient) -> None:
    client.apply_config(with_budget())
    start(client, "job-1", "a2")
    config = with_budget()
    del config.nodes[1]  # a2
    code, apply_details = refusal(lambda: client.apply_config(config))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    code, delete_details = refusal(lambda: client.delete_objects("node", ["a2"]))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert (
        apply_details
        == delete_details
        == (
            "cannot delete node a2. In use: running workload job-1 uses node a2. Nothing was changed."
        )
    )
    # What other objects refer to, and the work of the queue.
    code, details = refusal(lambda: client.delete_objects("queue", ["llm"]))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "budget of llm uses queue llm" in details
    assert "running workload job-1 uses queue llm" in details


def test_queues_only_apply_keeps_nodes_and_names_stored_pools(client: GpufairClient) -> None:
    client.apply_config(with_budget())
    gitops = parse_config(
        {
            "queues": [
                {"name": "llm", "quotas": [{"pool": "main", "deserved_cu": 100}]},
                {"name": "research", "quotas": [{"pool": "main", "deserved_cu": 20}]},
            ],
            "budgets": [{"queue": "research", "period": "week", "cu_hours": 100}],
        }
    )
    reply = client.apply_config(gitops, kinds=["queue", "budget"])
    assert [(c.kind, c.name, c.action) for c in reply.changes] == [
        ("queue", "llm", pb.CHANGE_ACTION_UPDATE),
        ("queue", "research", pb.CHANGE_ACTION_CREATE),
        ("budget", "research/week/*", pb.CHANGE_ACTION_CREATE),
        ("budget", "llm/month/*", pb.CHANGE_ACTION_DELETE),
        ("queue", "vision", pb.CHANGE_ACTION_DELETE),
    ]
    assert reply.config_version == 2
    stored = client.get_config().config
    assert [n.name for n in stored.nodes] == ["a1", "a2", "r1"]
    assert [p.name for p in stored.pools] == ["main"]
    assert [t.name for t in stored.gpu_types] == ["a100", "rtx4090"]
    assert [q.name for q in stored.queues] == ["llm", "research"]


def test_scoped_apply_checks_references_and_its_own_kinds(client: GpufairClient) -> None:
    client.apply_config(with_budget())
    before = snapshot(client)
    queues = parse_config({"queues": [{"name": "x", "quotas": [{"pool": "gpu-farm"}]}]})
    code, _ = refusal(lambda: client.apply_config(queues, kinds=["queue"]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as err:
        client.apply_config(queues, kinds=["queue"])
    assert field_violations(err.value) == [
        ("config.queues[0].quotas[0].pool", "unknown pool 'gpu-farm'")
    ]
    with pytest.raises(grpc.RpcError) as err:
        client.apply_config(with_budget(), kinds=["queue", "planet", "queue"])
    assert field_violations(err.value) == [
        ("kinds[1]", "must be one of gpu_type, pool, node, queue, budget"),
        ("kinds[2]", "queue listed twice"),
    ]
    with pytest.raises(grpc.RpcError) as err:
        client.apply_config(with_budget(), kinds=["queue"])
    assert [f for f, _ in field_violations(err.value)] == [
        "config.gpu_types",
        "config.pools",
        "config.nodes",
        "config.budgets",
    ]
    # A pools-only apply may not pull the pool from under the stored nodes and queues.
    code, details = refusal(lambda: client.apply_config(pb.ClusterConfig(), kinds=["pool"]))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "would delete all 1 stored objects of its kinds (pool)" in details
    code, details = refusal(
        lambda: client.apply_config(pb.ClusterConfig(), kinds=["pool"], confirm_delete_all=True)
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert details.startswith("cannot delete pool main. In use: node a1 uses pool main; ")
    assert snapshot(client) == before


def test_stale_expected_version_is_refused_and_nothing_written(client: GpufairClient) -> None:
    assert client.apply_config(with_budget(), expected_version=0).config_version == 1
    mine = with_budget()
    mine.queues[0].quotas[0].deserved_cu = 90
    assert client.apply_config(mine, expected_version=1).config_version == 2
    before = snapshot(client)

    theirs = with_budget()
    theirs.queues[1].quotas[0].deserved_cu = 10
    stale_calls: list[Callable[[], object]] = [
        lambda: client.apply_config(theirs, expected_version=1),
        lambda: client.apply_config(theirs, expected_version=1, dry_run=True),
        lambda: client.delete_objects("budget", ["llm/month/*"], expected_version=1),
    ]
    for call in stale_calls:
        code, details = refusal(call)
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert details == (
            "config version is 2, not the expected 1: the config changed since it was read. "
            "Nothing was changed: read it again and retry."
        )
    assert snapshot(client) == before
    assert client.get_config().config.queues[0].quotas[0].deserved_cu == 90

    with pytest.raises(grpc.RpcError) as err:
        client.apply_config(theirs, expected_version=-1)
    assert field_violations(err.value) == [("expected_version", "must be >= 0, got -1")]
    assert client.delete_objects("budget", ["llm/month/*"], expected_version=2).config_version == 3


def test_dry_run_and_real_apply_refuse_the_same_things(client: GpufairClient) -> None:
    client.apply_config(with_budget())
    start(client, "job-1", "r1")
    without_r1 = with_budget()
    del without_r1.nodes[2]
    bad_reference = with_budget()
    bad_reference.nodes[0].gpu_type = "h200"
    requests: list[dict[str, object]] = [
        {"config": pb.ClusterConfig()},
        {"config": pb.ClusterConfig(), "confirm_delete_all": True},
        {"config": without_r1},
        {"config": with_budget(), "expected_version": 7},
        {"config": bad_reference},
        {"config": with_budget(), "kinds": ["node"]},
    ]
    before = snapshot(client)
    for kw in requests:
        config = kw.pop("config")
        assert isinstance(config, pb.ClusterConfig)
        dry = refusal(lambda: client.apply_config(config, dry_run=True, **kw))  # noqa: B023
        real = refusal(lambda: client.apply_config(config, **kw))  # noqa: B023
        assert dry == real and dry[0] != grpc.StatusCode.OK
    assert snapshot(client) == before


def test_bound_work_and_evictions_in_flight_block_deletion(
    client: GpufairClient, db: Engine
) -> None:
    client.apply_config(with_budget())
    start(client, "job-1", "a1")
    submit(client, "placed", queue="vision", pods=1, gpus=8)
    reply = client.schedule("main")
    assert [(b.uid, [p.node for p in b.pods]) for b in reply.binds] == [("placed", ["a2"])]
    code, details = refusal(lambda: client.delete_objects("node", ["a2"]))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert details == (
        "cannot delete node a2. In use: bound workload placed uses node a2. Nothing was changed."
    )
    code, details = refusal(lambda: client.delete_objects("gpu_type", ["a100"], dry_run=True))
    assert "bound workload placed uses gpu_type a100" in details
    assert "running workload job-1 uses gpu_type a100" in details
    assert "node a1 uses gpu_type a100" in details

    # A cycle evicted job-1 (llm) for `claimant` (a new queue): the claimant's queue must stay.
    config = with_budget()
    config.queues.add(name="claims")
    client.apply_config(config)
    submit(client, "claimant", queue="claims")
    with db.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO evictions (victim_uid, beneficiary_uid, pool, reason, cycle_id) "
                "VALUES ('job-1', 'claimant', 'main', 'reclaim', 1)"
            )
        )
    code, details = refusal(lambda: client.apply_config(with_budget()))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert details == (
        "cannot delete queue claims. In use: workload claimant, awaiting the eviction of job-1, "
        "uses queue claims. Nothing was changed."
    )
    # Once the victim has stopped, nothing awaits it: the queue may go.
    assert report(client, event(STOPPED, "job-1", time.time() - 30))[0].status == STORED
    removed = client.apply_config(with_budget())
    assert [(c.kind, c.name) for c in removed.changes] == [("queue", "claims")]
