"""Per-type guarantees in the cycle (DESIGN §2 deserved per type, §3.5; issue 14).

A guarantee given only per type ("4 A100") is worth its CU at admission, as it is in the fair
share; and a queue below it may reclaim that type from queues above their own guarantee for it,
even when they are within their CU share.
"""

from __future__ import annotations

from cycle_builders import (
    A100,
    RTX4090,
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
from gpufair.domain.model import Allocation
from gpufair.domain.snapshot import EvictReason, PendingCode

A100_ONLY = (A100.name,)


def test_a_per_type_guarantee_counts_as_deserved_cu_for_non_preemptible_work() -> None:
    nodes = [node("a1", A100, gpus=8)]
    guaranteed = queue("g", deserved_gpus_by_type={A100.name: 4})
    jobs = [
        workload(f"g{i}", "g", types=A100_ONLY, preemptible=False, submit_time_s=i)
        for i in range(5)
    ]
    result = run_cycle(snapshot(nodes, [guaranteed], {"g": 80.0}, pending=jobs))
    # 4 A100 = 40 CU deserved: four non-preemptible jobs run (before: none, "deserved 0.0 CU").
    assert bound_uids(result) == {"g0", "g1", "g2", "g3"}
    assert result.queues["g"].deserved_cu == 40.0
    reason = result.pending["g4"]
    assert reason.code is PendingCode.NON_PREEMPTIBLE_OVER_DESERVED
    assert "deserved 40 CU; the queue holds 40 CU of it and this needs 10 CU" in reason.message


def _holder_with_all_a100s() -> list[Allocation]:
    """h holds all 8 A100s (80 CU) with one-GPU jobs started at 0..7 s, within its 100 CU share."""
    return [
        running(workload(f"h{i}", "h", types=A100_ONLY), [("a1", (i,))], A100, started_at_s=i)
        for i in range(8)
    ]


def test_a_queue_below_its_type_guarantee_reclaims_from_a_holder_within_its_share() -> None:
    nodes = [node("a1", A100, gpus=8), node("r1", RTX4090, gpus=8)]
    queues = [queue("g", deserved_gpus_by_type={A100.name: 4}), queue("h")]
    shares = {"g": 40.0, "h": 100.0}
    wants = [workload(f"g{i}", "g", types=A100_ONLY, submit_time_s=100 + i) for i in range(5)]
    results = run_cycles(
        nodes, queues, shares, running_work=_holder_with_all_a100s(), pending=wants
    )
    first = results[0]
    # Cycle 1: the four most recent of h's jobs go, each for one of g's first four; the fifth
    # would take g beyond its guarantee, and h is within its CU share: nothing for it.
    assert evicted_uids(first) == {"h7", "h6", "h5", "h4"}
    assert {e.reason for e in first.evicts} == {EvictReason.RECLAIM}
    assert {e.beneficiary_uid for e in first.evicts} == {"g0", "g1", "g2", "g3"}
    assert first.pending["g4"].code is PendingCode.NO_CAPACITY
    # Cycle 3 (victims stopped): g holds its 4 A100s, h keeps the other 4; then nothing moves.
    assert bound_uids(results[2]) == {"g0", "g1", "g2", "g3"}
    assert results[2].queues["g"].allocated_cu_after == 40.0
    assert results[2].queues["h"].allocated_cu_after == 40.0
    assert len(results) == 4 and results[3].evicts == () and results[3].binds == ()
    assert sum(len(r.evicts) for r in results) == 4


def test_guarantee_reclaim_keeps_the_victims_own_type_guarantee() -> None:
    nodes = [node("a1", A100, gpus=8)]
    queues = [
        queue("g", deserved_gpus_by_type={A100.name: 4}),
        queue("h", deserved_gpus_by_type={A100.name: 6}),
    ]
    wants = [workload(f"g{i}", "g", types=A100_ONLY, submit_time_s=100 + i) for i in range(4)]
    result = run_cycle(
        snapshot(
            nodes,
            queues,
            {"g": 40.0, "h": 100.0},
            running_work=_holder_with_all_a100s(),
            pending=wants,
        )
    )
    # h is guaranteed 6 A100: only 2 may go, the most recent.
    assert evicted_uids(result) == {"h7", "h6"}
    # Each message names this phase's bounds (the guarantees, h's deserved CU), not the CU
    # reclaim's "at least max(deserved, fair share)": h ends below its 100 CU fair share.
    assert [e.message for e in result.evicts] == [
        f"reclaimed for g{i} of queue g, below its guarantee of 4 a100-80gb GPUs (holds {i}); "
        f"queue h keeps {7 - i} a100-80gb GPUs, at least its own guarantee of 6, and "
        f"{70 - 10 * i}.0 CU, at least its deserved 60.0"
        for i in range(2)
    ]
    assert {e.beneficiary_uid for e in result.evicts} == {"g0", "g1"}
    assert result.pending["g2"].code is PendingCode.NO_CAPACITY
