"""Capacity freed by eviction is held GPU by GPU, not node by node (DESIGN §4.3, issue 14).

A workload waiting for its victims holds exactly the GPUs its placement will use; the rest of
each node stays free, so several claimants reclaim on one node in one cycle, in the victim order
DESIGN §4.3 gives (most recent first), and free GPUs beside a hold keep taking work.
"""

from __future__ import annotations

from cycle_builders import (
    bound_uids,
    evicted_uids,
    node,
    queue,
    run_cycles,
    running,
    snapshot,
    workload,
)

from gpufair.domain.cycle import run_cycle
from gpufair.domain.explain import explain
from gpufair.domain.model import Allocation
from gpufair.domain.snapshot import EvictionInFlight, PendingCode, ReservationKind

NODES = [node("n1"), node("n2")]
QUEUES = [queue("a", 8), queue("b", 0)]
SHARES = {"a": 8.0, "b": 8.0}


def _b_fills_both_nodes() -> list[Allocation]:
    """b runs 16 one-GPU jobs: b0–b7 (oldest) on n2, b8–b15 (newest) on n1; its fair share
    is 8, so the 8 newest are beyond it."""
    return [
        running(
            workload(f"b{start}", "b"),
            [("n1" if start >= 8 else "n2", (start % 8,))],
            started_at_s=start,
        )
        for start in range(16)
    ]


def _claimants(count: int) -> list[object]:
    return [workload(f"a{i}", "a", submit_time_s=i) for i in range(count)]


def test_two_claimants_evict_the_two_most_recent_jobs_on_one_node() -> None:
    snap = snapshot(
        NODES, QUEUES, SHARES, running_work=_b_fills_both_nodes(), pending=_claimants(2)
    )
    result = run_cycle(snap)
    # Most recent first: b15 and b14, both on n1 (whole-node holds took b15 and then b7).
    assert evicted_uids(result) == {"b15", "b14"}
    held = {r.workload_uid: r for r in result.reservations}
    assert set(held) == {"a0", "a1"}
    assert all(r.kind is ReservationKind.EVICTED_CAPACITY for r in held.values())
    assert held["a0"].nodes == held["a1"].nodes == ("n1",)
    held_gpus = {b.gpu_indices for r in held.values() for b in r.held}
    assert held_gpus == {(7,), (6,)}  # exactly the victims' GPUs
    assert result.queues["a"].reserved_cu == 2.0
    assert "the GPUs it will use on 1 nodes are held for it" in result.pending["a0"].message


def test_eight_claimants_converge_in_three_cycles_taking_only_beyond_share_work() -> None:
    results = run_cycles(
        NODES, QUEUES, SHARES, running_work=_b_fills_both_nodes(), pending=_claimants(8)
    )
    first, second, third = results[:3]
    # Cycle 1: all eight reclaim at once, each the next most recent of b's 8 beyond-share jobs
    # (whole-node holds evicted two per cycle, one per node, half of them within b's share).
    assert evicted_uids(first) == {f"b{start}" for start in range(8, 16)}
    assert {e.beneficiary_uid for e in first.evicts} == {f"a{i}" for i in range(8)}
    # Cycle 2: victims stopping, every hold re-derived, nothing more evicted.
    assert second.evicts == () and second.binds == ()
    assert {p.code for p in second.pending.values()} == {PendingCode.WAITING_FOR_EVICTED_CAPACITY}
    # Cycle 3: all eight bound, on n1, where their victims ran; b keeps its 8 CU share on n2.
    assert bound_uids(third) == {f"a{i}" for i in range(8)}
    assert {b.node for bind in third.binds for b in bind.bindings} == {"n1"}
    assert third.queues["a"].allocated_cu_after == 8.0
    assert third.queues["b"].allocated_cu_after == 8.0
    assert sum(len(r.evicts) for r in results) == 8


def test_free_gpus_beside_a_hold_take_work_within_share() -> None:
    nodes = [node("x")]
    queues = [queue("a", 4), queue("b", 0), queue("c", 1)]
    big = workload("b-big", "b", gpus=4)
    work = [
        running(big, [("x", (0, 1, 2, 3))], started_at_s=50),
        *(running(workload(f"b{i}", "b"), [("x", (i,))]) for i in (4, 5, 6)),
    ]
    gang = workload("gang", "a", gpus=4)
    shares = {"a": 4.0, "b": 3.0, "c": 1.0}
    first = run_cycle(snapshot(nodes, queues, shares, running_work=work, pending=[gang]))
    assert evicted_uids(first) == {"b-big"}
    # Next cycle b-big is still stopping; c's job arrives. The gang holds GPUs 0–3 only: c's
    # job takes GPU 7 at once (a whole-node hold left it idle until the gang bound).
    late = workload("c-job", "c", submit_time_s=100)
    second = run_cycle(
        snapshot(
            nodes,
            queues,
            shares,
            running_work=work,
            pending=[gang, late],
            evicting=[EvictionInFlight("b-big", "gang")],
        )
    )
    assert second.pending["gang"].code is PendingCode.WAITING_FOR_EVICTED_CAPACITY
    (hold,) = second.reservations
    assert [b.gpu_indices for b in hold.held] == [(0, 1, 2, 3)]
    (bind,) = second.binds
    assert bind.workload_uid == "c-job" and bind.bindings[0].gpu_indices == (7,)


def test_explain_counts_a_node_whose_free_gpus_are_all_held_for_another() -> None:
    nodes = [node("x", gpus=4), node("y", gpus=4)]
    queues = [queue("a", 4), queue("b", 0)]
    work = [
        running(workload("b-old", "b", gpus=4), [("x", (0, 1, 2, 3))]),
        running(workload("b-new", "b", gpus=2), [("y", (0, 1))], started_at_s=50),
    ]
    gang = workload("gang", "a", pods=2, gpus=2)
    small = workload("b-small", "b", gpus=2, submit_time_s=10)
    snap = snapshot(nodes, queues, {"a": 4.0, "b": 4.0}, running_work=work, pending=[gang, small])
    result = run_cycle(snap)
    assert evicted_uids(result) == {"b-new"}
    # y's two free GPUs and b-new's two are held for the gang; x is full.
    why = explain(snap, result, "b-small")
    assert (why.nodes.held_for_other, why.nodes.too_few_free_gpus) == (1, 1)
    assert "1 held for other workloads" in why.message
