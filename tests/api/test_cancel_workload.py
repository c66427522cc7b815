"""CancelWorkload says what it found: `was_pending` only when the call cancelled the workload,
and `previous_state` the state it was in, so a workload that had already finished or was
cancelled before is not reported as running."""

from __future__ import annotations

import time

import grpc
import pytest
from sqlalchemy import Engine, text

from gpufair.client import GpufairClient
from gpufair.v1 import scheduler_pb2 as pb
from tests.api.ledger_support import STARTED, STOPPED, STORED, cluster, event, report, submit


def rows(db: Engine) -> dict[str, tuple[str, object]]:
    with db.connect() as conn:
        found = conn.execute(text("SELECT uid, state, state_changed_at FROM workloads"))
        return {r.uid: (r.state, r.state_changed_at) for r in found}


def test_each_state_is_answered_for_what_it_was(client: GpufairClient, db: Engine) -> None:
    client.apply_config(cluster())
    submit(client, "bound")
    [bind] = client.schedule("main").binds
    other = "a2" if bind.pods[0].node == "a1" else "a1"
    for uid in ("pending", "running", "finished", "cancelled"):
        submit(client, uid)
    client.cancel_workload("cancelled")
    now = time.time()
    starts = [
        event(STARTED, "running", now - 60, [(other, [0], 1.0)]),
        event(STARTED, "finished", now - 120, [(other, [1], 1.0)]),
        event(STOPPED, "finished", now - 30),
    ]
    assert [r.status for r in report(client, *starts)] == [STORED] * 3
    before = rows(db)
    assert {uid: state for uid, (state, _) in before.items()} == {
        "pending": "pending",
        "bound": "bound",
        "running": "running",
        "finished": "finished",
        "cancelled": "cancelled",
    }

    replies = {uid: client.cancel_workload(uid) for uid in before}
    assert replies == {
        "pending": pb.CancelWorkloadResponse(was_pending=True, previous_state="pending"),
        "bound": pb.CancelWorkloadResponse(was_pending=True, previous_state="bound"),
        "running": pb.CancelWorkloadResponse(was_pending=False, previous_state="running"),
        "finished": pb.CancelWorkloadResponse(was_pending=False, previous_state="finished"),
        "cancelled": pb.CancelWorkloadResponse(was_pending=False, previous_state="cancelled"),
    }
    after = rows(db)
    assert {uid: state for uid, (state, _) in after.items()} == {
        "pending": "cancelled",
        "bound": "cancelled",
        "running": "running",  # until the batch system reports it stopped
        "finished": "finished",
        "cancelled": "cancelled",
    }
    for uid in ("running", "finished", "cancelled"):  # untouched
        assert after[uid] == before[uid], uid


def test_an_unknown_uid_is_not_found_and_stores_no_reply(client: GpufairClient, db: Engine) -> None:
    client.apply_config(cluster())
    with pytest.raises(grpc.RpcError) as err:
        client.cancel_workload("ghost", request_id="cancel-ghost")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert err.value.details() == "workload 'ghost' not found"
    # A refusal stores nothing: once the workload exists, the same request id cancels it.
    submit(client, "ghost")
    replay = client.cancel_workload("ghost", request_id="cancel-ghost")
    assert replay == pb.CancelWorkloadResponse(was_pending=True, previous_state="pending")
    assert rows(db)["ghost"][0] == "cancelled"
