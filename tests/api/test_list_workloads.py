"""ListWorkloads over gRPC: states, places in queue order, reasons of the last cycle, bindings,
the pods of running work, evictions in flight, and paging."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import time

import grpc
import pytest
from sqlalchemy import Engine, text

from gpufair.client import GpufairClient, field_violations
from gpufair.config_file import parse_config
from gpufair.v1 import scheduler_pb2 as spb
from tests.api.ledger_support import CLUSTER, STARTED, STOPPED, STORED, cluster, event, report


def submit(
    client: GpufairClient,
    uid: str,
    queue: str,
    *,
    age_s: float,
    priority: int = 0,
    preemptible: bool = True,
) -> None:
    w = spb.Workload(
        uid=uid,
        queue=queue,
        pool="main",
        pods=1,
        gpus_per_pod=8,
        priority_class=priority,
        preemptible=preemptible,
    )
    w.submit_time.FromNanoseconds(round((time.time() - age_s) * 1e9))
    reply = client.submit_workloads([w])
    assert reply.results[0].accepted, reply.results[0].error


@pytest.fixture
def busy(client: GpufairClient) -> spb.ScheduleResponse:
    """llm runs run-1 on a1, vision has bound-1 placed on a2: only r1's 4 GPUs are free, so
    every 8-GPU workload waits. Returns the cycle that saw the waiting ones."""
    config = cluster()
    config.queues[1].quotas[0].deserved_cu = 80  # vision's bound-1 is within its guarantee
    client.apply_config(config)
    submit(client, "run-1", "llm", age_s=5000, preemptible=False)
    started = event(STARTED, "run-1", time.time() - 4000, [("a1", list(range(8)), 1.0)])
    assert report(client, started)[0].status == STORED
    submit(client, "bound-1", "vision", age_s=3000)
    first = client.schedule("main")
    assert [(b.uid, [p.node for p in b.pods]) for b in first.binds] == [("bound-1", ["a2"])]
    submit(client, "p-a", "llm", age_s=1000)
    submit(client, "p-b", "llm", age_s=990, priority=5)
    submit(client, "p-c", "llm", age_s=980)
    submit(client, "p-v", "vision", age_s=970)
    second = client.schedule("main")
    assert list(second.binds) == [] and list(second.evicts) == []
    submit(client, "p-late", "llm", age_s=10)  # after the last cycle
    return second


def test_default_listing_has_states_places_reasons_and_placements(
    client: GpufairClient, busy: spb.ScheduleResponse
) -> None:
    listed = client.list_workloads()
    assert [(w.workload.uid, w.state, w.queue_position) for w in listed] == [
        ("run-1", "running", 0),
        ("p-b", "pending", 1),  # priority class 5 goes first
        ("p-a", "pending", 2),
        ("p-c", "pending", 3),
        ("p-late", "pending", 4),
        ("bound-1", "bound", 0),
        ("p-v", "pending", 1),
    ]
    by_uid = {w.workload.uid: w for w in listed}
    cycle = {p.uid: (p.reason_code, p.message) for p in busy.pending}
    for uid in ("p-a", "p-b", "p-c", "p-v"):
        assert (by_uid[uid].reason_code, by_uid[uid].message) == cycle[uid]
        assert by_uid[uid].reason_code != ""
        assert list(by_uid[uid].pods) == [] and by_uid[uid].gpu_type == ""
    assert by_uid["p-late"].reason_code == ""
    assert by_uid["p-late"].message == "no Schedule cycle of its pool has considered it yet"

    run = by_uid["run-1"]
    assert (run.reason_code, run.gpu_type) == ("running", "a100")
    assert [(p.node, list(p.gpu_indices)) for p in run.pods] == [("a1", list(range(8)))]
    bound = by_uid["bound-1"]
    assert (bound.reason_code, bound.gpu_type) == ("bound", "a100")
    assert [(p.node, len(p.gpu_indices)) for p in bound.pods] == [("a2", 8)]
    assert by_uid["p-b"].workload.priority_class == 5
    assert by_uid["p-b"].workload.gpus_per_pod == 8
    assert all(not w.evicting for w in listed)
    assert all(w.state_changed_at.seconds > time.time() - 600 for w in listed)


def test_filters_by_pool_queue_and_state(client: GpufairClient, busy: spb.ScheduleResponse) -> None:
    vision = client.list_workloads(queue="vision")
    assert [w.workload.uid for w in vision] == ["bound-1", "p-v"]
    pending_llm = client.list_workloads(queue="llm", states=["pending"])
    # Places count the queue's pending work whatever the filter.
    assert [(w.workload.uid, w.queue_position) for w in pending_llm] == [
        ("p-b", 1),
        ("p-a", 2),
        ("p-c", 3),
        ("p-late", 4),
    ]
    assert client.list_workloads(pool="main", queue="vision", states=["finished"]) == []
    assert [w.workload.uid for w in client.list_workloads(states=["bound", "running"])] == [
        "run-1",
        "bound-1",
    ]
    stopped = event(STOPPED, "run-1", time.time() - 100)
    assert report(client, stopped)[0].status == STORED
    assert [w.workload.uid for w in client.list_workloads(states=["finished"])] == ["run-1"]
    client.cancel_workload("p-c")
    cancelled = client.list_workloads(states=["cancelled", "finished"])
    assert [(w.workload.uid, w.state, w.reason_code) for w in cancelled] == [
        ("p-c", "cancelled", ""),
        ("run-1", "finished", ""),
    ]
    # p-c left the queue: the others move up.
    assert [w.queue_position for w in client.list_workloads(queue="llm", states=["pending"])] == [
        1,
        2,
        3,
    ]


def test_a_pool_or_queue_that_names_nothing_is_not_found(
    client: GpufairClient, busy: spb.ScheduleResponse
) -> None:
    """A filter naming no pool (or queue) there is answers NOT_FOUND naming it, as GetUsage and
    GetFairShareHistory do, not an empty list a typo cannot be told from; a known pool or queue
    without matching work is an empty list."""
    for kwargs, message in (
        ({"pool": "mian"}, "pool 'mian' not found"),
        ({"pool": "mian", "queue": "llm"}, "pool 'mian' not found"),
        ({"queue": "lmm"}, "queue 'lmm' not found"),
        ({"pool": "main", "queue": "lmm", "states": ["finished"]}, "queue 'lmm' not found"),
    ):
        with pytest.raises(grpc.RpcError) as err:
            client.list_workloads(**kwargs)  # type: ignore[arg-type]
        assert isinstance(err.value, grpc.Call)
        assert (err.value.code(), err.value.details()) == (grpc.StatusCode.NOT_FOUND, message)
    assert client.list_workloads(pool="main", states=["finished"]) == []
    assert client.list_workloads(queue="llm", states=["cancelled"]) == []


def test_a_removed_pool_still_lists_its_work(client: GpufairClient) -> None:
    client.apply_config(cluster())
    submit(client, "w1", "llm", age_s=60)
    renamed = copy.deepcopy(CLUSTER)
    renamed["pools"][0]["name"] = "main2"
    for obj in (*renamed["nodes"], *(q["quotas"][0] for q in renamed["queues"])):
        obj["pool"] = "main2"
    client.apply_config(parse_config(renamed))
    assert [(w.workload.uid, w.state) for w in client.list_workloads(pool="main")] == [
        ("w1", "pending")
    ]
    assert client.list_workloads(pool="main", states=["finished"]) == []
    assert client.list_workloads(pool="main2") == []


def test_an_eviction_in_flight_is_shown(
    client: GpufairClient, busy: spb.ScheduleResponse, db: Engine
) -> None:
    # As a cycle records a reclaim (store/schedule_repo.record_cycle): bound-1 evicted for p-a.
    with db.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO evictions (victim_uid, beneficiary_uid, pool, reason, cycle_id) "
                "VALUES ('bound-1', 'p-a', 'main', 'reclaim', 1)"
            )
        )
    flags = {w.workload.uid: w.evicting for w in client.list_workloads()}
    assert [uid for uid, evicting in flags.items() if evicting] == ["bound-1"]


def test_pages_follow_each_other_to_the_same_listing(
    client: GpufairClient, busy: spb.ScheduleResponse
) -> None:
    everything = [w.workload.uid for w in client.list_workloads()]
    pages: list[list[str]] = []
    token = ""
    while True:
        reply = client.scheduler.ListWorkloads(
            spb.ListWorkloadsRequest(page_size=3, page_token=token), timeout=20
        )
        pages.append([w.workload.uid for w in reply.workloads])
        token = reply.next_page_token
        if not token:
            break
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [uid for page in pages for uid in page] == everything
    assert [w.workload.uid for w in client.list_workloads(page_size=2)] == everything
    exact = client.scheduler.ListWorkloads(spb.ListWorkloadsRequest(page_size=7), timeout=20)
    assert len(exact.workloads) == 7 and exact.next_page_token == ""


def forged_token(uid: str) -> str:
    """A token made up by a caller, in the server's format and with the right filter digest, but
    a key no listing could have served."""
    digest = hashlib.sha256(json.dumps(["", "", ["bound", "pending", "running"]]).encode())
    doc = {"k": ["main", "llm", 1, 0, 0, uid], "f": digest.hexdigest()[:16]}
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode()


def test_bad_requests_name_their_field(client: GpufairClient) -> None:
    first = client.scheduler.ListWorkloads(spb.ListWorkloadsRequest(page_size=1), timeout=20)
    assert first.next_page_token == ""  # nothing stored: one empty page
    forged = spb.ListWorkloadsRequest(page_token=forged_token("zzz"))
    assert list(client.scheduler.ListWorkloads(forged, timeout=20).workloads) == []
    cases = [
        (spb.ListWorkloadsRequest(page_size=-1), "page_size"),
        (spb.ListWorkloadsRequest(page_size=10_001), "page_size"),
        (spb.ListWorkloadsRequest(states=["pending", "waiting"]), "states[1]"),
        (spb.ListWorkloadsRequest(page_token="not-a-token"), "page_token"),
        (spb.ListWorkloadsRequest(page_token="e30"), "page_token"),  # "{}"
        (spb.ListWorkloadsRequest(pool="a\x00b"), "pool"),
        (spb.ListWorkloadsRequest(page_token=forged_token("a\x00b")), "page_token"),
    ]
    for request, field in cases:
        with pytest.raises(grpc.RpcError) as err:
            client.scheduler.ListWorkloads(request, timeout=20)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
        assert [f for f, _ in field_violations(err.value)] == [field]


def test_a_token_is_good_only_for_its_filters(
    client: GpufairClient, busy: spb.ScheduleResponse
) -> None:
    page = client.scheduler.ListWorkloads(
        spb.ListWorkloadsRequest(queue="llm", page_size=1), timeout=20
    )
    assert page.next_page_token
    with pytest.raises(grpc.RpcError) as err:
        client.scheduler.ListWorkloads(
            spb.ListWorkloadsRequest(queue="vision", page_token=page.next_page_token), timeout=20
        )
    assert [f for f, _ in field_violations(err.value)] == ["page_token"]
    rest = client.scheduler.ListWorkloads(
        spb.ListWorkloadsRequest(queue="llm", page_token=page.next_page_token), timeout=20
    )
    assert [w.workload.uid for w in rest.workloads] == ["p-b", "p-a", "p-c", "p-late"]
