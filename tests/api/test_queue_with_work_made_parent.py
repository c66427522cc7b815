"""A leaf queue holding bound or running work cannot be made a parent by an apply.

Only leaf queues hold work (a fair share counts a queue's allocation only at its leaves): a
queue given children while its workloads run would hide their GPUs from every share, so its
department could take them a second time. Refused as a deletion still in use is
(FAILED_PRECONDITION naming the work), until the work stops or is cancelled.
"""

from __future__ import annotations

import grpc
import pytest

from gpufair.client import GpufairClient, started, stopped
from gpufair.v1 import cluster_pb2 as pb
from tests.api.ledger_support import cluster, submit


def with_child(parent: str) -> pb.ClusterConfig:
    config = cluster()
    config.queues.add(name="llm-chat", parent=parent, quotas=[pb.QueueQuota(pool="main")])
    return config


def allocated(client: GpufairClient) -> dict[str, float]:
    client.schedule("main")
    return {q.queue: q.allocated_cu for q in client.get_fair_share("main").queues}


def test_a_queue_with_running_work_is_not_made_a_parent(client: GpufairClient) -> None:
    client.apply_config(cluster())
    submit(client, "w1", queue="llm")
    (bind,) = client.schedule("main").binds
    client.report_events([started("w1", bind.pods)])
    assert allocated(client)["llm"] == 2.0  # one RTX 4090, the cheapest card that serves it

    for dry_run in (True, False):
        with pytest.raises(grpc.RpcError) as caught:
            client.apply_config(with_child("llm"), dry_run=dry_run)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "cannot make queue llm a parent. In use: running workload w1 uses queue llm" in (
            caught.value.details() or ""
        )
    assert client.get_config().config_version == 1
    assert allocated(client)["llm"] == 2.0

    # A sibling's child is fine: vision holds no work.
    assert client.apply_config(with_child("vision")).config_version == 2

    client.report_events([stopped("w1")])
    reply = client.apply_config(with_child("llm"))
    assert reply.config_version == 3
    (change,) = reply.changes
    assert (change.kind, change.name, change.action) == (
        "queue",
        "llm-chat",
        pb.CHANGE_ACTION_UPDATE,
    )
    assert [(f.field, f.before, f.after) for f in change.fields] == [("parent", "vision", "llm")]
