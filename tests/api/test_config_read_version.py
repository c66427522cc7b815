"""GetConfig's version is never newer than the config it comes with: a client's read-modify-write
with `expected_version` then cannot undo a change it never saw."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import grpc
from sqlalchemy import Engine, text

from gpufair.client import GpufairClient
from gpufair.domain.config_diff import diff_configs
from gpufair.domain.model import QueueQuota, frozen_map
from gpufair.store import config_repo, locks
from gpufair.v1 import cluster_pb2 as pb
from tests.api.ledger_support import cluster
from tests.lock_waits import waiting_on_locks


def _deserved(config: pb.ClusterConfig) -> dict[str, float]:
    return {q.name: q.quotas[0].deserved_cu for q in config.queues}


def test_read_modify_write_never_undoes_a_config_committed_during_the_read(
    client: GpufairClient, db: Engine
) -> None:
    """Another writer raises llm's deserved CU from 80 to 100 (version 2) and commits while a
    GetConfig is between its reads (held here on the budgets table, the last it reads). The
    reply must be version 1 with llm at 80, or version 2 with llm at 100. A person raises vision
    from 40 to 50 on that reply, with its version as `expected_version`: llm must stay at 100
    (the apply refused, or made on top of version 2). At BASE the reply said version 2 beside
    llm at 80, the apply went through and llm went back to 80."""
    assert client.apply_config(cluster()).config_version == 1
    replies: list[pb.GetConfigResponse] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            replies.append(client.get_config())
        except BaseException as exc:
            errors.append(exc)

    with db.connect() as writer:
        locks.xact_lock(writer, locks.CONFIG)
        stored = config_repo.load_config(writer)
        raised = replace(
            stored,
            queues=tuple(
                replace(q, quotas=frozen_map({"main": QueueQuota("main", deserved_cu=100)}))
                if q.name == "llm"
                else q
                for q in stored.queues
            ),
        )
        changes = diff_configs(stored, raised)
        config_repo.apply_changes(writer, raised, changes)
        assert config_repo.record_version(writer, changes) == 2
        writer.execute(text("LOCK TABLE budgets IN ACCESS EXCLUSIVE MODE"))
        reading = threading.Thread(target=read)
        reading.start()
        deadline = time.monotonic() + 20
        while waiting_on_locks(db) != 1 and reading.is_alive():
            assert time.monotonic() < deadline, "GetConfig never waited for the budgets"
            time.sleep(0.02)
        assert reading.is_alive(), "GetConfig did not read the budgets after the queues"
        writer.commit()
    reading.join(timeout=30)
    assert errors == []
    reply = replies[0]
    assert (reply.config_version, _deserved(reply.config)["llm"]) in ((1, 80), (2, 100))

    edited = pb.ClusterConfig()
    edited.CopyFrom(reply.config)
    for queue in edited.queues:
        if queue.name == "vision":
            queue.quotas[0].deserved_cu = 50
    try:
        client.apply_config(edited, expected_version=reply.config_version)
    except grpc.RpcError as exc:
        assert isinstance(exc, grpc.Call)
        assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION, exc.details()
    assert _deserved(client.get_config().config)["llm"] == 100
