"""Gang entitlement (issue 20, `cycle_entitlement`): a gang larger than any share the formula can
reach is admitted beyond its queue's fair share when that queue is the most under-served of its
tier, and only then.

The burst case in one cycle: 16 GPUs (two 8-GPU nodes), a and b hold 8 each with 1-GPU jobs, c
waits with a 12-GPU gang (3 pods x 4). Fair shares as time-based fair share gives them at k = 1
after a and b have used the pool: a 2.67, b 2.67, c 10.67 (< 12: the gang is blocked by c's
share alone). U' = 0.5, 0.5, 0; W' = 1/3 each.
"""

from __future__ import annotations

import pytest
from cycle_builders import (
    assert_holds_fit,
    assert_no_oversubscription,
    bound_uids,
    evicted_uids,
    node,
    queue,
    running,
    snapshot,
    workload,
)

from gpufair.domain.cycle import run_cycle
from gpufair.domain.cycle_entitlement import reachable_share_cu
from gpufair.domain.model import Allocation, Workload
from gpufair.domain.snapshot import (
    CycleResult,
    CycleSnapshot,
    EvictReason,
    PendingCode,
    ReservationKind,
    UsageStanding,
)

NOW_S = 100_000.0
THIRD = 1.0 / 3.0
SHARES = {"a": 16 / 6, "b": 16 / 6, "c": 16 * 2 / 3}
STANDING = {
    "a": UsageStanding(THIRD, 0.5),
    "b": UsageStanding(THIRD, 0.5),
    "c": UsageStanding(THIRD, 0.0),
}


def _pool_full(min_runtime_s: float = 0.0) -> list[Allocation]:
    """a's 8 jobs on n1, b's 8 on n2, started one second apart (a0 oldest)."""
    work = []
    for owner, host in (("a", "n1"), ("b", "n2")):
        for i in range(8):
            job = workload(f"{owner}{i}", owner, min_runtime_s=min_runtime_s)
            work.append(running(job, [(host, (i,))], started_at_s=NOW_S - 3600 + i))
    return work


def _gang(waited_s: float = 3600.0, **kwargs: object) -> Workload:
    return workload("c-gang", "c", pods=3, gpus=4, submit_time_s=NOW_S - waited_s, **kwargs)  # type: ignore[arg-type]


def _snap(
    *,
    standing: dict[str, UsageStanding] | None = None,
    gang: Workload | None = None,
    min_runtime_s: float = 0.0,
    shares: dict[str, float] | None = None,
    extra_pending: list[Workload] | None = None,
    **kwargs: object,
) -> CycleSnapshot:
    return snapshot(
        [node("n1"), node("n2")],
        [queue("a"), queue("b"), queue("c")],
        shares or SHARES,
        running_work=_pool_full(min_runtime_s),
        pending=[gang or _gang(), *(extra_pending or [])],
        now_s=NOW_S,
        gang_reservation_after_s=600.0,
        standing=STANDING if standing is None else standing,
        **kwargs,  # type: ignore[arg-type]
    )


def _run(snap: CycleSnapshot) -> CycleResult:
    result = run_cycle(snap)
    assert_no_oversubscription(snap, result)
    assert_holds_fit(snap, result)
    return result


def test_the_most_under_served_queues_gang_takes_the_capacity_it_never_gets_as_a_share() -> None:
    result = _run(_snap())
    # 12 GPUs must be freed for 4-GPU pods: beyond-share work alone (a and b hold 5.33 each
    # above their shares: 5 whole jobs each, 10 GPUs) is not enough, so over-quota work goes
    # too: all of n1 (two pods) and the four most recent jobs of n2 (the third pod).
    assert len(result.evicts) == 12
    assert {e.reason for e in result.evicts} == {EvictReason.ENTITLEMENT}
    assert {e.beneficiary_uid for e in result.evicts} == {"c-gang"}
    by_queue = {q: sum(1 for e in result.evicts if e.queue == q) for q in ("a", "b")}
    assert by_queue == {"a": 8, "b": 4}
    assert evicted_uids(result) == {f"a{i}" for i in range(8)} | {f"b{i}" for i in range(4, 8)}
    assert "the most under-served of its tier" in result.evicts[0].message
    assert result.pending["c-gang"].code is PendingCode.WAITING_FOR_EVICTED_CAPACITY
    (held,) = [r for r in result.reservations if r.kind is ReservationKind.EVICTED_CAPACITY]
    assert sum(len(b.gpu_indices) for b in held.held) == 12
    assert result.queues["c"].reserved_cu == 12.0  # its fair share is 10.67


def test_with_free_room_the_gang_binds_at_once_beyond_its_share() -> None:
    snap = snapshot(
        [node("n1"), node("n2")],
        [queue("a"), queue("b"), queue("c")],
        SHARES,
        # a's two oldest jobs on n1: 6 + 8 GPUs free, room for three 4-GPU pods.
        running_work=[a for a in _pool_full() if a.workload.uid in {"a0", "a1"}],
        pending=[_gang()],
        now_s=NOW_S,
        gang_reservation_after_s=600.0,
        standing=STANDING,
    )
    result = _run(snap)
    assert bound_uids(result) == {"c-gang"}
    (bind,) = result.binds
    assert bind.cu == 12.0 and bind.over_fair_share
    assert result.evicts == ()


def test_nothing_happens_when_the_rule_may_not_fire() -> None:
    cases = {
        "policy off": _snap(gang_entitlement=False),
        "not waited long enough": _snap(gang=_gang(waited_s=599.0)),
        "non-preemptible gang": _snap(gang=_gang(preemptible=False)),
        # c has had its weight's worth already: U' = W'.
        "not under-served": _snap(
            standing={
                "a": UsageStanding(THIRD, 0.4),
                "b": UsageStanding(THIRD, 0.3),
                "c": UsageStanding(THIRD, THIRD),
            }
        ),
        # b, waiting too, has used less than c relative to its weight: b is the most
        # under-served, and its waiting job is no gang blocked by its share alone.
        "another queue more under-served": _snap(
            standing={
                "a": UsageStanding(THIRD, 0.9),
                "b": UsageStanding(THIRD, 0.02),
                "c": UsageStanding(THIRD, 0.08),
            },
            extra_pending=[workload("b-next", "b", submit_time_s=NOW_S - 3600)],
        ),
        "no standing known": _snap(standing={}),
    }
    for name, snap in cases.items():
        result = _run(snap)
        assert result.evicts == (), name
        assert result.binds == (), name
        expected = PendingCode.OVER_FAIR_SHARE
        if name == "non-preemptible gang":
            expected = PendingCode.NON_PREEMPTIBLE_OVER_DESERVED
        assert result.pending["c-gang"].code is expected, name


def test_min_runtime_protects_victims_and_the_gang_gets_a_hole_instead() -> None:
    result = _run(_snap(min_runtime_s=7200.0))  # everything started an hour ago
    assert result.evicts == ()
    (hole,) = [r for r in result.reservations if r.kind is ReservationKind.GANG_WAIT]
    assert hole.workload_uid == "c-gang"
    assert set(hole.nodes) == {"n1", "n2"}  # 12 GPUs of 4-GPU pods need both nodes


def test_deserved_quotas_are_never_taken() -> None:
    # a and b are guaranteed 6 each: only 2 + 2 GPUs are over quota, the gang cannot be served
    # by eviction, so it waits with a hole.
    snap = snapshot(
        [node("n1"), node("n2")],
        [queue("a", 6), queue("b", 6), queue("c")],
        {"a": 7.0, "b": 7.0, "c": 2.0},
        running_work=_pool_full(),
        pending=[_gang()],
        now_s=NOW_S,
        gang_reservation_after_s=600.0,
        standing=STANDING,
    )
    result = _run(snap)
    assert result.evicts == ()
    assert [r.kind for r in result.reservations] == [ReservationKind.GANG_WAIT]


def test_a_queue_already_beyond_its_share_gets_no_second_gang() -> None:
    # c already runs a 4-GPU job beyond its 2-GPU share: it is not within its share.
    work = [a for a in _pool_full() if a.workload.uid not in {f"a{i}" for i in range(4)}]
    work.append(running(workload("c-small", "c", gpus=4), [("n1", (0, 1, 2, 3))]))
    snap = snapshot(
        [node("n1"), node("n2")],
        [queue("a"), queue("b"), queue("c")],
        {"a": 7.0, "b": 7.0, "c": 2.0},
        running_work=work,
        pending=[_gang()],
        now_s=NOW_S,
        gang_reservation_after_s=600.0,
        standing=STANDING,
    )
    result = _run(snap)
    assert result.evicts == () and result.binds == ()


def test_a_higher_tier_is_never_a_victim() -> None:
    snap = snapshot(
        [node("n1"), node("n2")],
        [queue("a", priority=1), queue("b", priority=1), queue("c")],
        SHARES,
        running_work=_pool_full(),
        pending=[_gang()],
        now_s=NOW_S,
        gang_reservation_after_s=600.0,
        standing=STANDING,
    )
    result = _run(snap)
    assert result.evicts == ()


def test_the_reachable_share_is_what_the_formula_can_ever_give() -> None:
    # Three equal queues, k = 1, nothing held: 2/3 of the 16 GPUs, short of a 12-GPU gang.
    assert reachable_share_cu(THIRD, 0.0, 16.0, 1.0) == pytest.approx(32 / 3)
    # Weights 3 : 1 on 64 GPUs, holding two 20-GPU gangs: 56, short of a third gang.
    assert reachable_share_cu(0.75, 40.0, 64.0, 1.0) == pytest.approx(56.0)
    # Two equal queues, nothing held: the whole pool (the oscillation scenario's gang fits).
    assert reachable_share_cu(0.5, 0.0, 16.0, 1.0) == pytest.approx(16.0)
    # A larger k lifts the burst case's bound: 12 GPUs only past k = 1.25, the whole pool at 2.
    assert reachable_share_cu(THIRD, 0.0, 16.0, 2.0) == pytest.approx(16.0)
    assert (
        reachable_share_cu(THIRD, 0.0, 16.0, 1.2)
        < 12.0
        < reachable_share_cu(THIRD, 0.0, 16.0, 1.35)
    )
