"""Reclaim and preempt (DESIGN §4.3–4.5), and the eviction semantics across cycles."""

from __future__ import annotations

from cycle_builders import (
    bound_uids,
    evicted_uids,
    node,
    queue,
    running,
    snapshot,
    workload,
)

from gpufair.domain.cycle import run_cycle
from gpufair.domain.model import Allocation, Queue, QueueQuota
from gpufair.domain.snapshot import (
    EvictionInFlight,
    EvictReason,
    PendingCode,
    ReservationKind,
)


def _full_node(uid: str, queue_name: str, name: str, **kw: object) -> Allocation:
    job = workload(uid, queue_name, gpus=8, **kw)  # type: ignore[arg-type]
    return running(job, [(name, tuple(range(8)))])


def test_p0_reclaims_from_p2_before_p1_even_at_higher_cost() -> None:
    nodes = [node("x"), node("y"), node("z")]
    queues = [queue("p0", 8, priority=2), queue("p1", 4, priority=1), queue("p2", 4, priority=0)]
    shares = {"p0": 8.0, "p1": 4.0, "p2": 4.0}
    work = [
        running(workload("p1-a", "p1", gpus=4), [("x", (0, 1, 2, 3))]),
        running(workload("p1-b", "p1", gpus=4), [("x", (4, 5, 6, 7))]),
        _full_node("p2-big", "p2", "y"),
        _full_node("p2-other", "p2", "z"),
    ]
    ask = workload("urgent", "p0", gpus=4)
    result = run_cycle(snapshot(nodes, queues, shares, running_work=work, pending=[ask]))
    # Evicting one p1 job would cost 4 CU, but p2 is the lowest tier: it gives way first.
    assert evicted_uids(result) in ({"p2-big"}, {"p2-other"})
    (evict,) = result.evicts
    assert evict.reason is EvictReason.RECLAIM and evict.beneficiary_uid == "urgent"
    assert result.pending["urgent"].code is PendingCode.WAITING_FOR_EVICTED_CAPACITY


def test_reclaim_evicts_fewest_cu_and_never_more_than_needed() -> None:
    nodes = [node("x"), node("y")]
    queues = [queue("a", 8), queue("b", 0)]
    work = [
        _full_node("b-full", "b", "y"),
        *(running(workload(f"b{i}", "b"), [("x", (i,))], started_at_s=i) for i in range(8)),
    ]
    ask = workload("a-job", "a", gpus=2)
    result = run_cycle(snapshot(nodes, queues, {"a": 8, "b": 8}, running_work=work, pending=[ask]))
    # Two 1-GPU jobs (2 CU) rather than the 8-GPU one; the most recent first.
    assert evicted_uids(result) == {"b7", "b6"}


def test_reclaim_needs_victim_past_min_runtime_and_preemptible() -> None:
    nodes = [node("x")]
    queues = [queue("a", 8), queue("b", 0)]
    young = _full_node("young", "b", "x", min_runtime_s=3_600)
    keeper = _full_node("keeper", "b", "x", preemptible=False)
    ask = workload("a-job", "a")
    for victim in (young, keeper):
        result = run_cycle(
            snapshot(nodes, queues, {"a": 8, "b": 0}, running_work=[victim], pending=[ask])
        )
        assert result.evicts == ()
        assert result.pending["a-job"].code is PendingCode.NO_CAPACITY


def test_queue_within_its_share_never_loses_work_to_reclaim() -> None:
    nodes = [node("x"), node("y")]
    queues = [queue("a", 8), queue("b", 4)]
    work = [_full_node("b1", "b", "x"), _full_node("b2", "b", "y")]
    ask = workload("a-job", "a", gpus=8)
    # b holds 16, deserved 4, fair share 16: at its share, nothing is reclaimable.
    result = run_cycle(snapshot(nodes, queues, {"a": 8, "b": 16}, running_work=work, pending=[ask]))
    assert result.evicts == ()
    # b's fair share 4 but deserved 10: the floor is 10, evicting 8 would leave 8 < 10.
    queues = [queue("a", 8), queue("b", 10)]
    result = run_cycle(snapshot(nodes, queues, {"a": 8, "b": 4}, running_work=work, pending=[ask]))
    assert result.evicts == ()


def test_no_ping_pong_reclaimer_ends_at_or_below_victim_ratio() -> None:
    nodes = [node("x", gpus=4)]
    queues = [queue("a", 0), queue("b", 0)]
    work = [running(workload(f"b{i}", "b"), [("x", (i,))]) for i in range(4)]
    ask = workload("a-job", "a", gpus=3)
    big = workload("a-big", "a", gpus=4, submit_time_s=1)
    shares = {"a": 3.5, "b": 0.5}
    result = run_cycle(snapshot(nodes, queues, shares, running_work=work, pending=[ask, big]))
    # b may lose 3.5 CU: three 1-GPU jobs for a-job; a-big (4 CU) would exceed a's share.
    assert len(result.evicts) == 3
    a, b = result.queues["a"], result.queues["b"]
    a_ratio = (a.allocated_cu_after + a.reserved_cu) / a.fair_share_cu
    b_ratio = b.allocated_cu_after / b.fair_share_cu
    assert (a_ratio, b_ratio) == (3 / 3.5, 2.0)
    assert a_ratio <= b_ratio


def test_per_type_guarantee_protects_victim() -> None:
    nodes = [node("x", gpus=4)]
    queues = [queue("a", 4), queue("b", 0, deserved_gpus_by_type={"unit": 4})]
    work = [running(workload(f"b{i}", "b"), [("x", (i,))]) for i in range(4)]
    ask = workload("a-job", "a")
    result = run_cycle(snapshot(nodes, queues, {"a": 4, "b": 0}, running_work=work, pending=[ask]))
    assert result.evicts == ()


def test_no_partial_eviction_when_gang_cannot_fit() -> None:
    nodes = [node(f"n{i}", gpus=4) for i in range(4)]
    queues = [queue("a", 0), queue("b", 10)]
    work = [running(workload(f"b{i}", "b", gpus=4), [(f"n{i}", (0, 1, 2, 3))]) for i in range(4)]
    gang = workload("gang", "a", pods=4, gpus=4)
    # b may lose only 16 − 10 = 6 CU: one node's job, not the four the gang needs.
    result = run_cycle(
        snapshot(nodes, queues, {"a": 16, "b": 0}, running_work=work, pending=[gang])
    )
    assert result.evicts == ()
    assert result.pending["gang"].code is PendingCode.NO_CAPACITY


def test_evicted_capacity_is_held_for_the_gang_until_it_binds() -> None:
    nodes = [node("x", gpus=4), node("y", gpus=4)]
    queues = [queue("a", 4), queue("b", 0)]
    work = [
        running(workload("b-old", "b", gpus=4), [("x", (0, 1, 2, 3))]),
        running(workload("b-new", "b", gpus=2), [("y", (0, 1))], started_at_s=50),
    ]
    gang = workload("gang", "a", pods=2, gpus=2)
    small = workload("b-small", "b", gpus=2, submit_time_s=10)
    shares = {"a": 4.0, "b": 4.0}
    first = run_cycle(snapshot(nodes, queues, shares, running_work=work, pending=[gang, small]))
    assert evicted_uids(first) == {"b-new"}
    assert first.pending["gang"].code is PendingCode.WAITING_FOR_EVICTED_CAPACITY
    (held,) = first.reservations
    assert held.kind is ReservationKind.EVICTED_CAPACITY and held.nodes == ("y",)
    # b-small would fit on y's 2 free GPUs, but y is held for the gang.
    assert "b-small" not in bound_uids(first)

    # Next cycle: b-new still stopping. Nothing else is evicted, the hold is re-derived.
    evicting = [EvictionInFlight("b-new", "gang")]
    second = run_cycle(
        snapshot(nodes, queues, shares, running_work=work, pending=[gang, small], evicting=evicting)
    )
    assert second.evicts == () and second.binds == ()
    assert second.pending["gang"].code is PendingCode.WAITING_FOR_EVICTED_CAPACITY
    assert second.queues["b"].evicting_cu == 2.0

    # b-new has stopped: the gang binds on y first, even though b-small is older.
    third = run_cycle(
        snapshot(
            nodes, queues, shares, running_work=work[:1], pending=[gang, small], evicting=evicting
        )
    )
    bind = next(b for b in third.binds if b.workload_uid == "gang")
    assert {b.node for b in bind.bindings} == {"y"}
    assert "b-small" not in bound_uids(third)


def test_preempt_inside_a_queue_by_priority_class() -> None:
    nodes = [node("x", gpus=4)]
    queues = [queue("a", 4)]
    work = [
        running(workload("low", "a", gpus=2, priority_class=0), [("x", (0, 1))]),
        running(
            workload("keep", "a", gpus=2, priority_class=0, preemptible=False), [("x", (2, 3))]
        ),
    ]
    high = workload("high", "a", gpus=2, priority_class=5)
    same = workload("same", "a", gpus=2, priority_class=0, submit_time_s=1)
    result = run_cycle(snapshot(nodes, queues, {"a": 4}, running_work=work, pending=[high, same]))
    (evict,) = result.evicts
    assert (evict.workload_uid, evict.reason, evict.beneficiary_uid) == (
        "low",
        EvictReason.PREEMPT,
        "high",
    )
    assert result.pending["high"].code is PendingCode.WAITING_FOR_EVICTED_CAPACITY
    assert result.pending["same"].code is not PendingCode.WAITING_FOR_EVICTED_CAPACITY


def test_best_effort_work_is_reclaimed_before_a_lower_tiers_weighted_work() -> None:
    """DESIGN §3.3: weight 0 is best effort, its work the first reclaimed, whatever its tier."""
    scavenger = Queue(
        "scavenger", quotas={"main": QueueQuota("main", over_quota_weight=0.0, priority=2)}
    )
    queues = [queue("urgent", 4, priority=2), scavenger, queue("batch", priority=0)]
    work = [
        *(running(workload(f"s{i}", "scavenger"), [("n", (i,))], started_at_s=i) for i in range(4)),
        *(running(workload(f"b{i}", "batch"), [("n", (4 + i,))], started_at_s=i) for i in range(4)),
    ]
    snap = snapshot(
        [node("n")],
        queues,
        {"urgent": 4.0, "scavenger": 0.0, "batch": 2.0},
        running_work=work,
        pending=[workload("u", "urgent", gpus=2)],
    )
    # Tier 2 would take from tier 0 (batch) first; the scavenger, best effort, goes before it:
    # its two most recent jobs.
    assert evicted_uids(run_cycle(snap)) == {"s3", "s2"}
