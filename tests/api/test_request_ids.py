"""The request-id rule as the proto comments state it to callers: one request id is one request
of one method (another body or another method is ALREADY_EXISTS), and dry runs neither read nor
store replies. (A refused call stores no reply, so its replay runs again: test_cancel_workload.py
and test_node_rpcs.py show it.)"""

from __future__ import annotations

import grpc
import pytest
from sqlalchemy import Engine, text

from gpufair.client import GpufairClient
from gpufair.v1 import cluster_pb2 as pb
from tests.api.ledger_support import cluster


def stored(db: Engine) -> dict[str, str]:
    with db.connect() as conn:
        return dict(conn.execute(text("SELECT request_id, method FROM request_replies")).all())


def test_a_request_id_belongs_to_one_method(client: GpufairClient, db: Engine) -> None:
    first = client.apply_config(cluster(), request_id="op-1")
    with pytest.raises(grpc.RpcError) as err:
        client.delete_objects("node", ["r1"], request_id="op-1")
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert err.value.details() == (
        "request_id 'op-1' was already used for a different request; "
        "use a new request_id for a new operation"
    )
    assert [n.name for n in client.get_config().config.nodes] == ["a1", "a2", "r1"]
    assert client.apply_config(cluster(), request_id="op-1") == first
    assert stored(db) == {"op-1": "ApplyConfig"}


def test_dry_runs_neither_read_nor_store_replies(client: GpufairClient, db: Engine) -> None:
    client.apply_config(cluster(), request_id="op-1")
    smaller = cluster()
    del smaller.nodes[2]  # r1
    # The id of another request: a dry run does not read it, so no ALREADY_EXISTS and no replay.
    dry = client.apply_config(smaller, dry_run=True, request_id="op-1")
    assert not dry.applied and [(c.name, c.action) for c in dry.changes] == [
        ("r1", pb.CHANGE_ACTION_DELETE)
    ]
    assert client.schedule("main", dry_run=True, request_id="op-1").cycle_id == 0
    # Nor does it store one: the real call with its id runs, rather than replaying the dry run.
    assert not client.apply_config(smaller, dry_run=True, request_id="op-2").applied
    assert stored(db) == {"op-1": "ApplyConfig"}
    real = client.apply_config(smaller, request_id="op-2")
    assert real.applied and real.config_version == 2
    assert stored(db) == {"op-1": "ApplyConfig", "op-2": "ApplyConfig"}
