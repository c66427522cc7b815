"""The reference case of DESIGN §1 through the cycle: classic versus time-based fair shares."""

from __future__ import annotations

from cycle_builders import assert_no_oversubscription, bound_uids, evicted_uids
from reference_case import GANG, reference_snapshot, running_work

from gpufair.domain.cycle import run_cycle
from gpufair.domain.explain import explain
from gpufair.domain.snapshot import (
    EvictionInFlight,
    EvictReason,
    PendingCode,
    ReservationKind,
)


def test_classic_fair_share_keeps_gang_pending_with_a_clear_reason() -> None:
    snap = reference_snapshot(llm_fair_share_cu=55, vision_fair_share_cu=45)
    result = run_cycle(snap)
    assert result.evicts == () and result.binds == ()
    reason = result.pending[GANG.uid]
    assert reason.code is PendingCode.OVER_FAIR_SHARE
    assert "fair share 55 CU" in reason.message
    why = explain(snap, result, GANG.uid)
    assert (why.needed_cu, why.over_quota_needed_cu) == (60, 40)
    assert (why.queue_may_take_cu, why.over_quota_may_take_cu) == (45, 25)
    assert "needs 60 CU, 40 of it over-quota; the queue may take 45 CU now" in why.message


def test_time_based_fair_share_reclaims_just_enough_then_binds_the_gang() -> None:
    snap = reference_snapshot(llm_fair_share_cu=80, vision_fair_share_cu=20)
    first = run_cycle(snap)
    assert_no_oversubscription(snap, first)
    victims = evicted_uids(first)
    # 15 whole nodes of 2 vision jobs each: 60 GPUs, exactly what the gang needs.
    assert len(victims) == 30
    assert all(e.reason is EvictReason.RECLAIM and e.queue == "vision" for e in first.evicts)
    assert "llm-inference" not in victims
    vision = first.queues["vision"]
    assert vision.allocated_cu_after == 30  # above its fair share and deserved (20)
    assert first.pending[GANG.uid].code is PendingCode.WAITING_FOR_EVICTED_CAPACITY
    (held,) = first.reservations
    assert held.kind is ReservationKind.EVICTED_CAPACITY and len(held.nodes) == 15
    assert first.binds == ()  # nothing else fits: vision is over its share, nodes are held

    evicting = [EvictionInFlight(uid, GANG.uid) for uid in victims]
    second = run_cycle(reference_snapshot(80, 20, evicting=evicting))
    assert second.evicts == () and second.binds == ()
    assert second.pending[GANG.uid].code is PendingCode.WAITING_FOR_EVICTED_CAPACITY
    assert second.reservations[0].nodes == held.nodes

    stopped = [a for a in running_work() if a.workload.uid not in victims]
    third_snapshot = reference_snapshot(80, 20, work=stopped, evicting=evicting)
    third = run_cycle(third_snapshot)
    assert_no_oversubscription(third_snapshot, third)
    assert bound_uids(third) == {GANG.uid}
    (bind,) = third.binds
    assert {b.node for b in bind.bindings} == set(held.nodes)
    assert third.queues["llm"].allocated_cu_after == 70
