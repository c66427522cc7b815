"""Ledger.ReportEvents / StreamEvents over gRPC on PostgreSQL: idempotent, order-tolerant, and
every bad event refused with its reason while the good ones in the batch land."""

from __future__ import annotations

import time
from collections.abc import Iterable

import grpc
import pytest
from ledger_support import (
    DUPLICATE,
    HEARTBEAT,
    NODE_CAPACITY,
    PREEMPTED,
    REJECTED,
    STARTED,
    STOPPED,
    STORED,
    cluster,
    event,
    report,
    submit,
)
from sqlalchemy import Engine, text

from gpufair.client import GpufairClient, field_violations
from gpufair.v1 import ledger_pb2, scheduler_pb2

T0 = time.time() - 3 * 86400  # three days ago: well inside the accepted range


@pytest.fixture
def ready(client: GpufairClient) -> GpufairClient:
    client.apply_config(cluster())
    return client


def intervals(
    db: Engine, uid: str
) -> list[tuple[str, float, float, float, float | None, str | None]]:
    with db.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT gpu_type, gpus, cu, extract(epoch FROM started_at)::float8, "
                "extract(epoch FROM ended_at)::float8, end_kind FROM allocation_intervals "
                "WHERE workload_uid = :uid ORDER BY started_at, gpu_type"
            ),
            {"uid": uid},
        )
        return [tuple(r) for r in rows]  # type: ignore[misc]


def state(db: Engine, uid: str) -> str:
    with db.connect() as conn:
        return str(
            conn.execute(
                text("SELECT state FROM workloads WHERE uid = :u"), {"u": uid}
            ).scalar_one()
        )


def test_start_heartbeat_stop_makes_one_closed_interval(ready: GpufairClient, db: Engine) -> None:
    submit(ready, "job-1", pods=2, gpus=4)
    results = report(
        ready,
        event(STARTED, "job-1", T0, [("a1", [0, 1, 2, 3], 1.0), ("a2", [0, 1, 2, 3], 1.0)]),
        event(HEARTBEAT, "job-1", T0 + 600),
    )
    assert [r.status for r in results] == [STORED, STORED]
    assert state(db, "job-1") == "running"
    [row] = intervals(db, "job-1")
    assert row[:3] == ("a100", 8.0, 80.0)
    assert row[3] == pytest.approx(T0, abs=1e-5) and row[4] is None

    report(ready, event(STOPPED, "job-1", T0 + 3600))
    [row] = intervals(db, "job-1")
    assert row[4] == pytest.approx(T0 + 3600, abs=1e-5) and row[5] == "stopped"
    assert state(db, "job-1") == "finished"


def test_fractional_and_mixed_type_pods_are_weighed_per_type(
    ready: GpufairClient, db: Engine
) -> None:
    submit(ready, "mixed", pods=3, gpus=1)
    report(
        ready,
        event(STARTED, "mixed", T0, [("a1", [5], 0.5), ("r1", [0], 1.0), ("r1", [1], 0.25)]),
    )
    rows = intervals(db, "mixed")
    assert [(r[0], r[1], r[2]) for r in rows] == [("a100", 0.5, 5.0), ("rtx4090", 1.25, 2.5)]


def test_replay_is_duplicate_and_reused_id_is_rejected(ready: GpufairClient, db: Engine) -> None:
    submit(ready, "job-2")
    start = event(STARTED, "job-2", T0, [("a1", [0], 1.0)])
    assert [r.status for r in report(ready, start)] == [STORED]
    assert [r.status for r in report(ready, start, start)] == [DUPLICATE, DUPLICATE]
    forged = event(STARTED, "job-2", T0 + 5, [("a1", [1], 1.0)], event_id=start.event_id)
    [result] = report(ready, forged)
    assert result.status == REJECTED
    assert result.error == "event_id reused with a different payload"
    assert len(intervals(db, "job-2")) == 1
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM ledger_events")).scalar_one() == 1


def test_out_of_order_arrival_converges(ready: GpufairClient, db: Engine) -> None:
    submit(ready, "late")
    stop = event(STOPPED, "late", T0 + 1800)
    start = event(STARTED, "late", T0, [("a2", [7], 1.0)])
    assert [r.status for r in report(ready, stop)] == [STORED]
    assert intervals(db, "late") == []
    assert [r.status for r in report(ready, start)] == [STORED]
    [row] = intervals(db, "late")
    assert row[3] == pytest.approx(T0, abs=1e-5) and row[4] == pytest.approx(T0 + 1800, abs=1e-5)
    assert state(db, "late") == "finished"


def test_preempted_workload_goes_back_to_pending_and_runs_again(
    ready: GpufairClient, db: Engine
) -> None:
    submit(ready, "again")
    report(
        ready,
        event(STARTED, "again", T0, [("a1", [0], 1.0)]),
        event(PREEMPTED, "again", T0 + 100),
    )
    assert state(db, "again") == "pending"
    report(ready, event(STARTED, "again", T0 + 200, [("a1", [1], 1.0)]))
    assert state(db, "again") == "running"
    assert [(r[5]) for r in intervals(db, "again")] == ["preempted", None]


def test_bad_events_get_reasons_and_good_ones_land(ready: GpufairClient, db: Engine) -> None:
    submit(ready, "good")
    submit(ready, "other")
    report(ready, event(STARTED, "other", T0 + 1000, [("a1", [0], 1.0)]))
    nan_pod = event(STARTED, "good", T0, [("a1", [1], float("nan"))])
    unknown_kind = event(STARTED, "good", T0)
    unknown_kind.kind = 99  # type: ignore[assignment]
    batch = [
        event(STARTED, "ghost", T0, [("a1", [0], 1.0)]),
        event(STARTED, "good", T0, [("z9", [0], 1.0)]),
        event(STARTED, "good", T0, [("a1", [8], 1.0)]),
        event(STARTED, "good", time.time() + 3600, [("a1", [0], 1.0)]),
        event(STOPPED, "other", T0 + 10),
        nan_pod,
        unknown_kind,
        event(STARTED, "good", T0, []),
        ledger_pb2.LedgerEvent(event_id="not-a-uuid", workload_uid="good", kind=HEARTBEAT),
        event(STARTED, "good", T0, [("a1", [2, 3], 1.0)]),
    ]
    batch[-2].occurred_at.FromSeconds(int(T0))
    results = report(ready, *batch)
    errors = [r.error for r in results]
    assert [r.status for r in results] == [REJECTED] * 4 + [STORED] + [REJECTED] * 4 + [STORED]
    assert errors[0] == "unknown workload 'ghost'"
    assert errors[1] == "pods[0]: unknown node 'z9'"
    assert errors[2] == "pods[0]: GPU index 8 does not exist on a1 (8 GPUs)"
    assert "in the future" in errors[3]
    # Not bad, only early: a stop before every start stored so far may meet an earlier start
    # still on its way (out-of-order arrival). Until then it pairs with nothing.
    assert errors[4] == ""
    assert [(r[3], r[4]) for r in intervals(db, "other")] == [
        (pytest.approx(T0 + 1000, abs=1e-5), None)
    ]
    assert errors[5] == "pods[0]: gpu_fraction must be in (0, 1]"
    assert errors[6] == "unknown event kind 99"
    assert errors[7] == "a started event needs the pods it runs on"
    assert "is not a UUID" in errors[8]
    assert [r[:3] for r in intervals(db, "good")] == [("a100", 2.0, 20.0)]


def test_an_instant_with_nanos_out_of_range_is_rejected(ready: GpufairClient, db: Engine) -> None:
    """Read as it is, nanos of -1 or 2e9 would move the instant (by a nanosecond back, by two
    seconds on): the event is refused instead, and the one beside it lands."""
    submit(ready, "nanos")
    whole = int(T0)
    late = event(STARTED, "nanos", T0, [("a1", [0], 1.0)])
    late.occurred_at.seconds, late.occurred_at.nanos = whole, 2_000_000_000
    early = event(HEARTBEAT, "nanos", T0)
    early.occurred_at.seconds, early.occurred_at.nanos = whole + 60, -1
    edge = event(STARTED, "nanos", T0, [("a1", [1], 1.0)])
    edge.occurred_at.seconds, edge.occurred_at.nanos = whole, 999_999_999
    results = report(ready, late, early, edge)
    assert [r.status for r in results] == [REJECTED, REJECTED, STORED]
    assert results[0].error == "occurred_at.nanos must be in [0, 999999999], got 2000000000"
    assert results[1].error == "occurred_at.nanos must be in [0, 999999999], got -1"
    with db.connect() as conn:
        stored = conn.execute(
            text(
                "SELECT event_id::text, extract(epoch FROM occurred_at)::float8 "
                "FROM ledger_events WHERE workload_uid = 'nanos'"
            )
        ).all()
    # Stored to the microsecond, as every instant is.
    assert [(r[0], r[1]) for r in stored] == [(edge.event_id, whole + 1.0)]
    assert [r[:2] for r in intervals(db, "nanos")] == [("a100", 1.0)]


def test_stream_commits_each_message(ready: GpufairClient, db: Engine) -> None:
    for i in range(3):
        submit(ready, f"s-{i}")
    messages = [
        ledger_pb2.ReportEventsRequest(
            events=[event(STARTED, f"s-{i}", T0 + i, [("a2", [i], 1.0)])]
        )
        for i in range(3)
    ]
    reply = ready.ledger.StreamEvents(iter(messages), timeout=20)
    assert [r.status for r in reply.results] == [STORED] * 3
    assert all(len(intervals(db, f"s-{i}")) == 1 for i in range(3))


def test_node_capacity_event_lowers_pool_capacity(ready: GpufairClient, db: Engine) -> None:
    capacity_event = ledger_pb2.LedgerEvent(
        event_id="8d6c3c52-5a8f-4c3e-9b0a-3f1f2d8e7a11", kind=NODE_CAPACITY, node="a1", gpu_count=6
    )
    capacity_event.occurred_at.FromNanoseconds(round((time.time() + 1) * 1e9))
    [result] = report(ready, capacity_event)
    assert result.status == STORED
    with db.connect() as conn:
        rows = conn.execute(
            text("SELECT capacity_cu, source FROM pool_capacity_changes ORDER BY changed_at")
        ).all()
    assert [tuple(r) for r in rows] == [(168.0, "config"), (148.0, "node_capacity")]


def test_each_kind_carries_only_its_own_fields(ready: GpufairClient, db: Engine) -> None:
    """A node report naming a workload, and a workload event naming a node or a GPU count, are
    refused with the reason, the good events of the batch land, and no capacity moves. Before,
    all three were stored: the report with its uid and the heartbeat with its count in the
    payload, meaning nothing."""
    submit(ready, "w")
    node_report = ledger_pb2.LedgerEvent(
        event_id="8d6c3c52-5a8f-4c3e-9b0a-3f1f2d8e7a21",
        kind=NODE_CAPACITY,
        node="a1",
        gpu_count=6,
        workload_uid="w",
    )
    node_report.occurred_at.FromNanoseconds(round((time.time() + 1) * 1e9))
    beat_on_node = event(HEARTBEAT, "w", T0 + 10)
    beat_on_node.node = "a1"
    beat_with_count = event(HEARTBEAT, "w", T0 + 20)
    beat_with_count.gpu_count = 2
    results = report(
        ready,
        event(STARTED, "w", T0, [("a2", [0], 1.0)]),
        node_report,
        beat_on_node,
        beat_with_count,
        event(HEARTBEAT, "w", T0 + 30),
    )
    assert [r.status for r in results] == [STORED, REJECTED, REJECTED, REJECTED, STORED]
    assert results[1].error == (
        "a node_capacity event names its node and gpu_count, no workload_uid or pods"
    )
    assert (
        results[2].error
        == results[3].error
        == ("node and gpu_count belong on node_capacity events, not heartbeat")
    )
    with db.connect() as conn:
        sources = conn.execute(text("SELECT source FROM pool_capacity_changes")).scalars().all()
        stored = conn.execute(text("SELECT count(*) FROM ledger_events")).scalar_one()
    assert sources == ["config"]
    assert stored == 2


def test_submit_is_idempotent_by_uid(ready: GpufairClient) -> None:
    request = scheduler_pb2.SubmitWorkloadsRequest(
        workloads=[
            scheduler_pb2.Workload(uid="w", queue="llm", pool="main", pods=1, gpus_per_pod=1)
        ]
    )
    assert ready.scheduler.SubmitWorkloads(request, timeout=10).results[0].accepted
    assert ready.scheduler.SubmitWorkloads(request, timeout=10).results[0].accepted
    request.workloads[0].pods = 2
    [result] = ready.scheduler.SubmitWorkloads(request, timeout=10).results
    assert not result.accepted and result.error == "uid already submitted with a different spec"
    request.workloads[0].queue = "nobody"
    request.workloads[0].uid = "w2"
    [result] = ready.scheduler.SubmitWorkloads(request, timeout=10).results
    assert not result.accepted and result.error == "unknown queue 'nobody'"


def test_stream_messages_are_written_in_order(ready: GpufairClient, db: Engine) -> None:
    for uid in ("o-1", "o-2"):
        submit(ready, uid)
    messages = [
        [event(STARTED, "o-1", T0, [("a1", [0], 1.0)])],
        [event(STOPPED, "o-1", T0 + 100), event(STARTED, "o-2", T0 + 50, [("a1", [1], 1.0)])],
        # Earlier than o-2's start: stored, it pairs with nothing unless an earlier start comes.
        [event(STOPPED, "o-2", T0 + 10), event(HEARTBEAT, "o-2", T0 + 60)],
    ]
    reply = ready.ledger.StreamEvents(
        iter(ledger_pb2.ReportEventsRequest(events=m) for m in messages), timeout=20
    )
    assert [r.status for r in reply.results] == [STORED] * 5
    assert [(r[4], r[5]) for r in intervals(db, "o-1")] == [
        (pytest.approx(T0 + 100, abs=1e-5), "stopped")
    ]
    assert state(db, "o-1") == "finished" and state(db, "o-2") == "running"


def test_stream_error_keeps_what_earlier_messages_stored(
    ready: GpufairClient, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpufair.api.ingest.MAX_EVENTS_PER_BATCH", 2)
    submit(ready, "e-1")
    messages = [
        [event(STARTED, "e-1", T0, [("a1", [0], 1.0)])],
        [event(HEARTBEAT, "e-1", T0 + k) for k in range(1, 4)],
    ]
    with pytest.raises(grpc.RpcError) as failed:
        ready.ledger.StreamEvents(
            iter(ledger_pb2.ReportEventsRequest(events=m) for m in messages), timeout=20
        )
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "messages[1].events" in str(failed.value.details())
    assert len(intervals(db, "e-1")) == 1 and state(db, "e-1") == "running"


def test_a_stream_whose_reply_could_pass_the_message_limit_is_refused_before_the_message(
    ready: GpufairClient, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the limit at 900 bytes: the first message's two results can take at most 892 bytes
    and take 84 (42 each); the second's could take 892 more, so it is refused before any of its
    events is written, and the first one's stay stored."""
    monkeypatch.setattr("gpufair.api.event_results.MAX_MESSAGE_BYTES", 900)
    submit(ready, "b-1")
    messages = [
        [event(STARTED, "b-1", T0, [("a1", [0], 1.0)]), event(HEARTBEAT, "b-1", T0 + 1)],
        [event(HEARTBEAT, "b-1", T0 + 2), event(STOPPED, "b-1", T0 + 3)],
    ]
    with pytest.raises(grpc.RpcError) as failed:
        ready.ledger.StreamEvents(
            iter(ledger_pb2.ReportEventsRequest(events=m) for m in messages), timeout=20
        )
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    ((field, why),) = field_violations(failed.value)
    assert field == "messages[1]" and "900 bytes" in why and "(1 messages) is stored" in why
    assert state(db, "b-1") == "running"
    with db.connect() as conn:
        kinds = conn.execute(
            text("SELECT kind FROM ledger_events WHERE workload_uid = 'b-1' ORDER BY occurred_at")
        ).scalars()
        assert list(kinds) == ["started", "heartbeat"]
    # The first message alone fits, on a stream of its own: its events come back as duplicates.
    again = ready.ledger.StreamEvents(iter([ledger_pb2.ReportEventsRequest(events=messages[0])]))
    assert [r.status for r in again.results] == [DUPLICATE, DUPLICATE]


def test_a_report_whose_reply_could_pass_the_message_limit_is_refused_whole(
    ready: GpufairClient, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpufair.api.event_results.MAX_MESSAGE_BYTES", 800)
    submit(ready, "b-2")
    events = [event(STARTED, "b-2", T0, [("a1", [1], 1.0)]), event(HEARTBEAT, "b-2", T0 + 1)]
    with pytest.raises(grpc.RpcError) as failed:
        report(ready, *events)  # at most 892 bytes of results
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    ((field, why),) = field_violations(failed.value)
    assert field == "events" and "send fewer events" in why
    assert state(db, "b-2") == "pending"
    assert [r.status for r in report(ready, events[0])] == [STORED]  # 446 bytes at most


def test_resent_stream_is_all_duplicates_and_changes_nothing(
    ready: GpufairClient, db: Engine
) -> None:
    for i in range(3):
        submit(ready, f"r-{i}")
    messages = [
        ledger_pb2.ReportEventsRequest(
            events=[
                event(STARTED, f"r-{i}", T0 + i, [("a2", [i], 1.0)]),
                event(HEARTBEAT, f"r-{i}", T0 + i + 30),
                event(STOPPED, f"r-{i}", T0 + i + 60),
            ]
        )
        for i in range(3)
    ]
    first = ready.ledger.StreamEvents(iter(messages), timeout=20)
    assert [r.status for r in first.results] == [STORED] * 9
    before = [intervals(db, f"r-{i}") for i in range(3)]
    again = ready.ledger.StreamEvents(iter(messages), timeout=20)
    assert [r.status for r in again.results] == [DUPLICATE] * 9
    assert [intervals(db, f"r-{i}") for i in range(3)] == before


def test_stream_prepares_the_next_message_during_the_writes_and_keeps_order(
    ready: GpufairClient, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every next message is made to be there when asked for, so each message's conversion
    happens while the one before is in the database; outcomes still come in message order."""
    from gpufair.api.ingest import Ingest
    from gpufair.api.prefetch import Prefetch
    from gpufair.store import ingest_pipeline

    take = Prefetch.take
    monkeypatch.setattr(Prefetch, "take", lambda self, wait: take(self, wait=True))
    log: list[str] = []
    convert, write = Ingest.convert, ingest_pipeline.write

    def logged_convert(events: Iterable[ledger_pb2.LedgerEvent], *rest: object) -> None:
        events = list(events)
        log.extend(f"convert {e.workload_uid}" for e in events)
        convert(events, *rest)  # type: ignore[arg-type]

    def logged_write(*args: object, **kwargs: object) -> object:
        log.append("write")
        outcomes = write(*args, **kwargs)  # type: ignore[arg-type]
        log.append("written")
        return outcomes

    monkeypatch.setattr(Ingest, "convert", staticmethod(logged_convert))
    monkeypatch.setattr(ingest_pipeline, "write", logged_write)
    for i in range(4):
        submit(ready, f"p-{i}")
    replayed = event(HEARTBEAT, "p-1", T0 + 30)
    messages = [
        [event(STARTED, f"p-{i}", T0 + i, [("a1", [i], 1.0)]), event(STOPPED, f"p-{i}", T0 + 90)]
        for i in range(4)
    ]
    messages[1] += [replayed, replayed, event(STOPPED, "p-1", T0 - 10)]
    reply = ready.ledger.StreamEvents(
        iter(ledger_pb2.ReportEventsRequest(events=m) for m in messages), timeout=20
    )

    assert [r.status for r in reply.results] == [
        *[STORED, STORED],
        *[STORED, STORED, STORED, DUPLICATE, STORED],
        *[STORED, STORED] * 2,
    ]
    assert [r.event_id for r in reply.results] == [e.event_id for m in messages for e in m]
    assert log == [
        *["convert p-0"] * 2,
        *["write", *["convert p-1"] * 5, "written"],
        *["write", *["convert p-2"] * 2, "written"],
        *["write", *["convert p-3"] * 2, "written"],
        *["write", "written"],
    ]
    assert all(
        [(r[4], r[5]) for r in intervals(db, f"p-{i}")]
        == [(pytest.approx(T0 + 90, abs=1e-5), "stopped")]
        for i in range(4)
    )


def test_heartbeats_need_their_workload_and_a_missing_one_is_not_remembered(
    ready: GpufairClient, db: Engine
) -> None:
    submit(ready, "hb-1")
    assert [r.status for r in report(ready, event(STARTED, "hb-1", T0, [("a1", [0], 1.0)]))] == [
        STORED
    ]
    for _ in range(2):  # the second time, hb-1 is known to the server and not looked up
        results = report(ready, event(HEARTBEAT, "hb-1", T0 + 30), event(HEARTBEAT, "ghost", T0))
        assert [(r.status, r.error) for r in results] == [
            (STORED, ""),
            (REJECTED, "unknown workload 'ghost'"),
        ]
    submit(ready, "ghost")
    [result] = report(ready, event(HEARTBEAT, "ghost", T0 + 60))
    assert result.status == STORED
    with db.connect() as conn:
        beats = conn.execute(
            text(
                "SELECT workload_uid, count(*) FROM ledger_events WHERE kind = 'heartbeat' "
                "GROUP BY workload_uid ORDER BY workload_uid"
            )
        ).all()
    assert [tuple(b) for b in beats] == [("ghost", 1), ("hb-1", 2)]


def test_a_nul_character_refuses_its_event_only(ready: GpufairClient, db: Engine) -> None:
    """PostgreSQL stores no NUL in text: such an event is refused with its reason, the rest of
    its batch lands."""
    submit(ready, "nul-ok")
    results = report(
        ready,
        event(STARTED, "nul-ok", T0, [("a1", [0], 1.0)]),
        event(HEARTBEAT, "nul\x00", T0),
        event(STARTED, "nul-ok", T0 + 1, [("a1\x00", [0], 1.0)]),
        event(HEARTBEAT, "nul-ok", T0 + 30),
    )
    assert [(r.status, r.error) for r in results] == [
        (STORED, ""),
        (REJECTED, "workload_uid contains a NUL character (U+0000)"),
        (REJECTED, "pods[0].node contains a NUL character (U+0000)"),
        (STORED, ""),
    ]
    assert len(intervals(db, "nul-ok")) == 1
