"""ReportEvents calls that wait for a write share the next one: each caller is answered after
its group's write with its own outcomes and errors, as if its message had been written alone."""

from __future__ import annotations

import threading
import time

from ledger_support import DUPLICATE, NODE_CAPACITY, REJECTED, STARTED, STORED, cluster, event
from ledger_support import submit as submit_workload
from sqlalchemy import Engine

from gpufair.api.group_commit import GroupCommit
from gpufair.api.ingest import Ingest, _compose, _report
from gpufair.client import GpufairClient
from gpufair.v1 import ledger_pb2


def test_calls_waiting_for_a_write_share_the_next_and_keep_their_own_errors() -> None:
    release = threading.Event()
    groups: list[list[str]] = []

    def write(items: list[str]) -> list[BaseException | None]:
        groups.append(list(items))
        if len(groups) == 1:
            release.wait(10)
        return [ValueError(i) if i == "bad" else None for i in items]

    commit: GroupCommit[str] = GroupCommit(write, writers=1)  # type: ignore[arg-type]
    results: dict[str, str] = {}

    def call(item: str) -> None:
        try:
            commit.submit(item)
            results[item] = "written"
        except ValueError as error:
            results[item] = f"refused: {error}"

    first = threading.Thread(target=call, args=("first",))
    first.start()
    while not groups:
        time.sleep(0.01)
    others = [threading.Thread(target=call, args=(i,)) for i in ("a", "b", "bad", "c")]
    for t in others:
        t.start()
    while len(commit._waiting) < 4:
        time.sleep(0.01)
    release.set()
    for t in [first, *others]:
        t.join(10)
    assert [sorted(g) for g in groups] == [["first"], ["a", "b", "bad", "c"]]
    assert (commit.groups, commit.items) == (2, 5)
    assert results == {
        "first": "written",
        "a": "written",
        "b": "written",
        "c": "written",
        "bad": "refused: bad",
    }


def test_messages_of_one_group_answer_as_if_written_one_after_the_other(
    client: GpufairClient, db: Engine
) -> None:
    client.apply_config(cluster())
    for uid in ("job-1", "job-2"):
        submit_workload(client, uid)
    at = time.time() - 3600
    begin = event(STARTED, "job-1", at, [("a1", [0], 1.0)])
    capacity = ledger_pb2.LedgerEvent(
        event_id="8d6c3c52-5a8f-4c3e-9b0a-3f1f2d8e7a12", kind=NODE_CAPACITY, node="a1", gpu_count=8
    )
    capacity.occurred_at.FromNanoseconds(round(time.time() * 1e9))
    ingest = Ingest(db)
    requests = [
        [begin],
        [begin, event(STARTED, "nope", at, [("a1", [1], 1.0)])],  # an id of the first: alone
        [capacity],  # a capacity change takes a transaction of its own
        [event(STARTED, "job-2", at, [("a1", [2], 1.0)])],
    ]
    messages = [
        ingest.prepare(ledger_pb2.ReportEventsRequest(events=r), "events") for r in requests
    ]
    assert _compose(messages) == ([0, 3], [1, 2])

    assert ingest.write_group(messages) == [None] * 4

    replies = []
    for m in messages:
        reply = ledger_pb2.ReportEventsResponse()
        _report(reply, m)
        replies.append([r.status for r in reply.results])
    assert replies == [[STORED], [DUPLICATE, REJECTED], [STORED], [STORED]]


def test_a_write_that_fails_fails_its_group_and_the_next_call_writes() -> None:
    calls: list[list[str]] = []

    def write(items: list[str]) -> list[BaseException | None]:
        calls.append(list(items))
        if len(calls) == 1:
            raise ConnectionError("the database went away")
        return [None] * len(items)

    commit: GroupCommit[str] = GroupCommit(write, writers=1)  # type: ignore[arg-type]
    try:
        commit.submit("lost")
    except ConnectionError as error:
        failure = str(error)
    assert failure == "the database went away"
    commit.submit("next")  # the writer that failed gave the writing up
    assert calls == [["lost"], ["next"]]
    assert (commit.groups, commit.items) == (2, 2)
