"""Scheduler.Schedule and ExplainWorkload over gRPC on PostgreSQL: the reference case of DESIGN §1
end to end (ledger history → fair shares → reclaim → bind), the life of a decision, replays."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from sqlalchemy import Engine, text

from gpufair.api.server import build_server
from gpufair.client import GpufairClient
from gpufair.config_file import load_config_file
from gpufair.v1 import ledger_pb2, scheduler_pb2

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "llm-vs-vision.yaml"
DAY = 86400.0


class Clock:
    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock() -> Clock:
    return Clock(time.time())


@pytest.fixture
def gpufair(db: Engine, clock: Clock) -> Iterator[GpufairClient]:
    running = build_server(db, "127.0.0.1:0", max_workers=4, clock=clock)
    try:
        with GpufairClient(f"127.0.0.1:{running.port}", attempts=1, timeout_s=60) as c:
            yield c
    finally:
        running.stop(0.5)


def workload(uid: str, queue: str, pods: int, **kw: object) -> scheduler_pb2.Workload:
    return scheduler_pb2.Workload(
        uid=uid, queue=queue, pool="default", pods=pods, gpus_per_pod=1, **kw
    )  # type: ignore[arg-type]


def submit(c: GpufairClient, *workloads: scheduler_pb2.Workload) -> None:
    reply = c.scheduler.SubmitWorkloads(
        scheduler_pb2.SubmitWorkloadsRequest(workloads=workloads), timeout=30
    )
    assert all(r.accepted for r in reply.results), [r.error for r in reply.results]


def report(c: GpufairClient, *events: ledger_pb2.LedgerEvent) -> None:
    reply = c.ledger.ReportEvents(ledger_pb2.ReportEventsRequest(events=events), timeout=30)
    assert all(r.status == ledger_pb2.EVENT_STATUS_STORED for r in reply.results), reply


def event(
    kind: int, uid: str, at_s: float, pods: list[scheduler_pb2.PodBinding] | None = None
) -> ledger_pb2.LedgerEvent:
    msg = ledger_pb2.LedgerEvent(event_id=str(uuid.uuid4()), workload_uid=uid, kind=kind)  # type: ignore[arg-type]
    msg.occurred_at.FromNanoseconds(round(at_s * 1e9))
    for p in pods or []:
        msg.pods.add(
            node=p.node, gpu_indices=list(p.gpu_indices), gpu_fraction=p.gpu_fraction or 1.0
        )
    return msg


def schedule(c: GpufairClient, **kw: object) -> scheduler_pb2.ScheduleResponse:
    return c.scheduler.Schedule(scheduler_pb2.ScheduleRequest(pool="default", **kw), timeout=60)  # type: ignore[arg-type]


def start_binds(c: GpufairClient, reply: scheduler_pb2.ScheduleResponse, at_s: float) -> None:
    """What a batch system does with binds: run them, and say so."""
    if reply.binds:
        report(
            c,
            *(event(ledger_pb2.EVENT_KIND_STARTED, b.uid, at_s, list(b.pods)) for b in reply.binds),
        )


def week_of_history(c: GpufairClient, db: Engine, clock: Clock, k: float) -> None:
    """The cluster as it was configured a week ago: LLM inference (10 GPUs, non-preemptible,
    in quota) and the vision team's small training jobs holding the other 70 GPUs — all of the
    50-GPU shared pool — for the whole week."""
    config = load_config_file(EXAMPLE)
    config.pools[0].policy.k = k
    c.apply_config(config)
    with db.begin() as conn:  # the config (and so the capacity) existed before the history
        conn.execute(
            text("UPDATE pool_capacity_changes SET changed_at = now() - interval '8 days'")
        )
    week_ago = clock.now_s - 7 * DAY
    clock.now_s = week_ago
    submit(c, workload("llm-inference", "llm", 10, preemptible=False))
    submit(c, *(workload(f"vision-{i}", "vision", 1) for i in range(70)))
    reply = schedule(c)
    assert {b.uid for b in reply.binds} == {"llm-inference", *(f"vision-{i}" for i in range(70))}
    start_binds(c, reply, week_ago)
    clock.now_s = week_ago + 7 * DAY


@pytest.mark.parametrize("k", [1.0, 0.0])
def test_reference_case_gang_runs_by_reclaim_only_with_time_based_share(
    gpufair: GpufairClient, db: Engine, clock: Clock, k: float
) -> None:
    week_of_history(gpufair, db, clock, k)
    submit(gpufair, workload("llm-post-training", "llm", 60, min_pods=60))
    submit(gpufair, *(workload(f"vision-new-{i}", "vision", 1) for i in range(10)))

    first = schedule(gpufair)
    evicted = {e.uid for e in first.evicts}
    assert "llm-inference" not in evicted  # non-preemptible, in quota: never evicted
    pending = {p.uid: p for p in first.pending}
    if k == 0:
        # Classic fair share: the LLM team's share is 55 < 10 + 60; the gang starves.
        assert evicted == set()
        assert pending["llm-post-training"].reason_code == "over_fair_share"
        assert "beyond its queue's fair share" in pending["llm-post-training"].message
        return
    # Time-based: the LLM team's share is 70; reclaim frees exactly the 40 GPUs it lacks (20 are
    # free), from vision's preemptible jobs, and vision keeps its 30.
    assert len(evicted) == 40 and all(u.startswith("vision-") for u in evicted)
    assert all(e.in_favour_of == "llm-post-training" for e in first.evicts)
    assert all(e.reason == scheduler_pb2.EVICT_REASON_RECLAIM for e in first.evicts)
    assert pending["llm-post-training"].reason_code == "waiting_for_evicted_capacity"
    assert not any(b.uid.startswith("vision-new") for b in first.binds)  # the hole is held

    # Until the victims stop, the gang waits and nobody else takes the freed GPUs.
    again = schedule(gpufair)
    assert again.binds == [] and again.evicts == []
    clock.now_s += 60
    report(
        gpufair,
        *(event(ledger_pb2.EVENT_KIND_PREEMPTED, uid, clock.now_s) for uid in sorted(evicted)),
    )
    clock.now_s += 1
    # The victims stopped: their evictions stay recorded for one more cycle (standing claims).
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM evictions")).scalar_one() == 40
    third = schedule(gpufair)
    [bind] = [b for b in third.binds if b.uid == "llm-post-training"]
    assert len(bind.pods) == 60 and bind.cu == 60
    with db.connect() as conn:  # that cycle served the claims: they are forgotten
        assert conn.execute(text("SELECT count(*) FROM evictions")).scalar_one() == 0
    nodes = {(p.node, i) for p in bind.pods for i in p.gpu_indices}
    assert len(nodes) == 60  # 60 distinct GPUs

    explained = gpufair.scheduler.ExplainWorkload(
        scheduler_pb2.ExplainWorkloadRequest(uid="llm-post-training"), timeout=30
    )
    assert explained.state == "bound"
    assert explained.queue_share.fair_share_cu == pytest.approx(70)


def test_dry_run_writes_nothing_and_request_id_replays(gpufair: GpufairClient, db: Engine) -> None:
    gpufair.apply_config(load_config_file(EXAMPLE))
    submit(gpufair, workload("a", "llm", 4), workload("b", "vision", 8))
    dry = schedule(gpufair, dry_run=True)
    assert {b.uid for b in dry.binds} == {"a", "b"} and dry.cycle_id == 0
    with db.connect() as conn:
        states = dict(conn.execute(text("SELECT uid, state FROM workloads")).all())
        cycles = conn.execute(text("SELECT count(*) FROM schedule_cycles")).scalar_one()
    assert states == {"a": "pending", "b": "pending"} and cycles == 0

    first = schedule(gpufair, request_id="cycle-1")
    assert first.cycle_id > 0 and {b.uid for b in first.binds} == {"a", "b"}
    replay = schedule(gpufair, request_id="cycle-1")
    assert replay == first  # the stored reply, not a new cycle
    fresh = schedule(gpufair, request_id="cycle-2")
    assert fresh.binds == []  # both are bound already: their GPUs are taken


def test_unconfirmed_binding_is_released(gpufair: GpufairClient, db: Engine, clock: Clock) -> None:
    gpufair.apply_config(load_config_file(EXAMPLE))
    submit(gpufair, workload("x", "llm", 100))
    assert [b.uid for b in schedule(gpufair).binds] == ["x"]
    submit(gpufair, workload("y", "vision", 1))
    assert schedule(gpufair).binds == []  # x holds all 100 GPUs while bound
    clock.now_s += 301  # no `started` event within the bind timeout
    reply = schedule(gpufair)
    # x is pending again and its GPUs free; y (vision, nothing allocated) goes first in queue
    # order, and x no longer fits in the 99 GPUs left.
    assert [b.uid for b in reply.binds] == ["y"]
    with db.connect() as conn:
        states = dict(conn.execute(text("SELECT uid, state FROM workloads")).all())
    assert states == {"x": "pending", "y": "bound"}


def test_submit_rejects_work_that_can_never_fit(gpufair: GpufairClient) -> None:
    gpufair.apply_config(load_config_file(EXAMPLE))
    reply = gpufair.scheduler.SubmitWorkloads(
        scheduler_pb2.SubmitWorkloadsRequest(
            workloads=[
                workload("too-big", "llm", 101),
                workload("too-much-memory", "llm", 1, min_gpu_memory_gib=96),
                workload("wrong-type", "llm", 1, allowed_gpu_types=["v100-16gb"]),
                workload("fine", "llm", 8),
            ]
        ),
        timeout=30,
    )
    results = {r.uid: r for r in reply.results}
    assert results["fine"].accepted
    assert "the pool holds at most 100" in results["too-big"].error
    assert (
        "96 GiB" in results["too-much-memory"].error
        and "80 GiB" in results["too-much-memory"].error
    )
    assert "no GPU of type v100-16gb" in results["wrong-type"].error


def test_explain_says_why_a_workload_waits(gpufair: GpufairClient) -> None:
    gpufair.apply_config(load_config_file(EXAMPLE))
    submit(gpufair, workload("hog", "vision", 100))
    schedule(gpufair)
    submit(gpufair, workload("late", "vision", 4))
    reply = gpufair.scheduler.ExplainWorkload(
        scheduler_pb2.ExplainWorkloadRequest(uid="late"), timeout=30
    )
    assert reply.state == "pending"
    assert reply.reason_code == "over_fair_share"
    assert reply.needs_cu == 4
    assert reply.queue_share.queue == "vision"
    assert {f.filter: f.nodes_failed for f in reply.filters}["free_gpus"] == 25
    with pytest.raises(grpc.RpcError) as err:
        gpufair.scheduler.ExplainWorkload(
            scheduler_pb2.ExplainWorkloadRequest(uid="nobody"), timeout=10
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_workload_cancelled_during_the_cycle_is_not_reported_placed(
    gpufair: GpufairClient, db: Engine, clock: Clock
) -> None:
    from gpufair.api.convert_schedule import without_binds
    from gpufair.services import schedule as schedule_service
    from gpufair.store import schedule_repo

    gpufair.apply_config(load_config_file(EXAMPLE))
    submit(gpufair, workload("kept", "llm", 4), workload("gone", "vision", 4))
    with db.connect() as conn:
        decided = schedule_service.decide(conn, "default", clock.now_s)
        assert {b.workload_uid for b in decided.result.binds} == {"kept", "gone"}
        # What a concurrent CancelWorkload commits between the snapshot and the writes.
        conn.execute(text("UPDATE workloads SET state = 'cancelled' WHERE uid = 'gone'"))
        _, skipped = schedule_repo.record_cycle(
            conn, "default", decided.result, b"", clock.now_s, 300.0
        )
        result = without_binds(decided.result, skipped)
        states = dict(conn.execute(text("SELECT uid, state FROM workloads")).all())
        conn.rollback()
    assert set(skipped) == {"gone"}
    assert [b.workload_uid for b in result.binds] == ["kept"]
    assert result.pending["gone"].code.value == "changed_during_cycle"
    assert states == {"kept": "bound", "gone": "cancelled"}


def test_a_department_limit_holds_in_the_served_cycle(gpufair: GpufairClient) -> None:
    """The reference cluster with both teams under department `research`, limited to 60 CU:
    the cycle the server runs reads the tree, so the teams together get 60 of the 100 GPUs."""
    config = load_config_file(EXAMPLE)
    research = config.queues.add(name="research")
    research.quotas.add(pool="default", deserved_cu=50, limit_cu=60)
    for team in config.queues:
        if team.name in ("llm", "vision"):
            team.parent = "research"
    gpufair.apply_config(config)
    submit(
        gpufair,
        *(workload(f"llm-{i}", "llm", 4) for i in range(20)),
        *(workload(f"vision-{i}", "vision", 4) for i in range(20)),
    )
    reply = schedule(gpufair)
    # Workloads of four 1-GPU pods: 15 of them, 60 GPUs (before: all 100 GPUs were bound).
    assert len(reply.binds) == 15
    assert sum(len(d.pods) for d in reply.binds) == 60
    explained = gpufair.scheduler.ExplainWorkload(
        scheduler_pb2.ExplainWorkloadRequest(uid="vision-19"), timeout=30
    )
    assert explained.reason_code == "queue_limit"
    assert "limit of queue research above its queue (limit 60 CU" in explained.message
