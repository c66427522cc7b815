"""Allocation order, admission rules and pending reasons of the cycle (DESIGN §4.1)."""

from __future__ import annotations

from cycle_builders import (
    POOL,
    bound_uids,
    node,
    queue,
    running,
    snapshot,
    workload,
)

from gpufair.domain.cycle import run_cycle
from gpufair.domain.model import Allocation, Workload
from gpufair.domain.snapshot import CycleResult, PendingCode, ReservationKind


def _keeper(uid: str, queue_name: str, where: str, gpus: tuple[int, ...]) -> Allocation:
    """Running work reclaim may not touch (still inside its minimum runtime)."""
    job = workload(uid, queue_name, gpus=len(gpus), min_runtime_s=10**9)
    return running(job, [(where, gpus)])


def test_higher_priority_tier_is_served_first() -> None:
    nodes = [node("x", gpus=4)]
    queues = [queue("low", 4, priority=0), queue("high", 4, priority=1)]
    pending = [
        workload("low-1", "low", pods=4, submit_time_s=0),
        workload("high-1", "high", pods=4, submit_time_s=50),
    ]
    result = run_cycle(snapshot(nodes, queues, {"low": 4, "high": 4}, pending=pending))
    assert bound_uids(result) == {"high-1"}
    assert result.pending["low-1"].code is PendingCode.NO_CAPACITY


def test_lowest_allocated_to_fair_share_ratio_goes_first() -> None:
    nodes = [node("x", gpus=4)]
    queues = [queue("a"), queue("b")]
    work = [running(workload("a-run", "a", gpus=2), [("x", (0, 1))])]
    pending = [
        workload("a-1", "a", gpus=2, submit_time_s=0),
        workload("b-1", "b", gpus=2, submit_time_s=50),
    ]
    # a: 2 of 8 (0.25) already; b: 0 of 8 (0.0) goes first although a's job is older.
    result = run_cycle(
        snapshot(nodes, queues, {"a": 8, "b": 8}, running_work=work, pending=pending)
    )
    assert bound_uids(result) == {"b-1"}


def test_queues_take_turns_by_ratio() -> None:
    nodes = [node("x", gpus=4)]
    queues = [queue("a"), queue("b")]
    pending = [workload(f"{q}-{i}", q, submit_time_s=i) for q in "ab" for i in range(4)]
    result = run_cycle(snapshot(nodes, queues, {"a": 8, "b": 8}, pending=pending))
    assert bound_uids(result) == {"a-0", "a-1", "b-0", "b-1"}


def test_inside_a_queue_priority_class_then_submit_time() -> None:
    nodes = [node("x", gpus=2)]
    pending = [
        workload("old-low", "q", submit_time_s=0, priority_class=0),
        workload("new-high", "q", submit_time_s=9, priority_class=3),
        workload("mid-high", "q", submit_time_s=5, priority_class=3),
    ]
    result = run_cycle(snapshot(nodes, [queue("q")], {"q": 8}, pending=pending))
    assert bound_uids(result) == {"mid-high", "new-high"}


def test_work_conserving_pass_marks_work_beyond_fair_share() -> None:
    nodes = [node("x", gpus=8)]
    queues = [queue("a"), queue("b")]
    pending = [workload(f"a-{i}", "a", submit_time_s=i) for i in range(4)]
    pending += [workload(f"b-{i}", "b", submit_time_s=i) for i in range(2)]
    result = run_cycle(snapshot(nodes, queues, {"a": 2, "b": 6}, pending=pending))
    flags = {b.workload_uid: b.over_fair_share for b in result.binds}
    assert flags == {
        "a-0": False,
        "a-1": False,
        "b-0": False,
        "b-1": False,
        "a-2": True,
        "a-3": True,
    }


def test_non_preemptible_work_stays_within_deserved() -> None:
    nodes = [node("x", gpus=8)]
    pending = [workload("serve", "q", pods=4, preemptible=False)]
    result = run_cycle(snapshot(nodes, [queue("q", deserved_cu=2)], {"q": 8}, pending=pending))
    assert result.binds == ()
    assert result.pending["serve"].code is PendingCode.NON_PREEMPTIBLE_OVER_DESERVED


def test_queue_limits_are_hard_caps() -> None:
    nodes = [node("x", gpus=8)]
    queues = [queue("q", limit_cu=3), queue("t", limit_gpus_by_type={"unit": 1})]
    pending = [
        workload("q-big", "q", pods=4),
        workload("q-small", "q", pods=3, submit_time_s=1),
        workload("t-two", "t", pods=2),
    ]
    result = run_cycle(snapshot(nodes, queues, {"q": 8, "t": 8}, pending=pending))
    assert bound_uids(result) == {"q-small"}
    assert result.pending["q-big"].code is PendingCode.QUEUE_LIMIT
    assert result.pending["t-two"].code is PendingCode.QUEUE_LIMIT


def _gang_wait_case(waited_s: float) -> CycleResult:
    nodes = [node("x", gpus=4), node("y", gpus=4)]
    queues = [queue("a", 8), queue("b"), queue("c", 1)]
    work = [_keeper("b-x", "b", "x", (0, 1)), _keeper("b-y", "b", "y", (0,))]
    gang: Workload = workload("gang", "a", pods=2, gpus=4, submit_time_s=1_000 - waited_s)
    pending = [gang, workload("b-more", "b"), workload("c-one", "c")]
    snap = snapshot(
        nodes,
        queues,
        {"a": 8, "b": 0, "c": 1},
        running_work=work,
        pending=pending,
        gang_reservation_after_s=600,
    )
    return run_cycle(snap)


def test_long_waiting_gang_stops_beyond_share_work_on_its_nodes() -> None:
    result = _gang_wait_case(waited_s=700)
    (reservation,) = result.reservations
    assert reservation.kind is ReservationKind.GANG_WAIT
    assert set(reservation.nodes) == {"x", "y"}
    # c is within its share: it may still land there; b is beyond its share: it may not.
    assert bound_uids(result) == {"c-one"}
    assert result.pending["b-more"].code is PendingCode.OVER_FAIR_SHARE
    assert "2 nodes reserved" in result.pending["gang"].message


def test_short_waiting_gang_gets_no_reservation() -> None:
    result = _gang_wait_case(waited_s=100)
    assert result.reservations == ()
    assert bound_uids(result) == {"c-one", "b-more"}


def test_every_left_workload_has_a_reason() -> None:
    nodes = [node("x", gpus=2), node("down", gpus=8, ready=False)]
    pending = [
        workload("fits", "q"),
        workload("stranger", "nobody"),
        workload("never", "q", pods=3, gpus=8),
        workload("no-room", "q", pods=2, submit_time_s=1),
    ]
    other_pool = Workload("elsewhere", "q", "other", 1, 1.0, 0.0)
    result = run_cycle(snapshot(nodes, [queue("q")], {"q": 100}, pending=[*pending, other_pool]))
    assert bound_uids(result) == {"fits"}
    codes = {uid: reason.code for uid, reason in result.pending.items()}
    assert codes == {
        "stranger": PendingCode.UNKNOWN_QUEUE,
        "never": PendingCode.NEVER_FITS,
        "no-room": PendingCode.NO_CAPACITY,
        "elsewhere": PendingCode.OTHER_POOL,
    }
    assert POOL in result.pending["stranger"].message


def test_queue_summary_reports_cu_before_and_after() -> None:
    nodes = [node("x", gpus=4)]
    work = [running(workload("r", "q", gpus=2), [("x", (0, 1))])]
    result = run_cycle(
        snapshot(nodes, [queue("q", 3)], {"q": 4}, running_work=work, pending=[workload("p", "q")])
    )
    summary = result.queues["q"]
    assert (summary.allocated_cu_before, summary.bound_cu, summary.allocated_cu_after) == (2, 1, 3)
    assert (summary.deserved_cu, summary.fair_share_cu) == (3, 4)
