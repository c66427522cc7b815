"""Defragmentation: a gang that the pool's free GPUs would hold, were they not scattered, gets
room by moves decided in one cycle: which workloads moved, where to, and the hourly budget."""

from __future__ import annotations

import random

import pytest
from cycle_builders import (
    assert_holds_fit,
    assert_no_oversubscription,
    bound_uids,
    node,
    queue,
    running,
    snapshot,
    workload,
)
from test_cycle_properties import _check as check_invariants

from gpufair.domain.cycle import run_cycle
from gpufair.domain.model import Allocation, Workload
from gpufair.domain.snapshot import (
    CycleResult,
    CycleSnapshot,
    EvictionInFlight,
    EvictReason,
    PendingCode,
    ReservationKind,
)

NODES = [node(f"n{i}") for i in range(1, 5)]  # 4 nodes of 8 GPUs: 32 GPUs


def _job(uid: str, gpus: int, where: str, first_gpu: int, started_at_s: float = 0.0) -> Allocation:
    job = workload(uid, "team", gpus=float(gpus))
    return running(job, [(where, tuple(range(first_gpu, first_gpu + gpus)))], started_at_s=0.0)


# Every node has 2 GPUs free (8 in all), none 8: n1 a1 (4) + a2 (2); n2 b1 (4) + b2 (2);
# n3 c1, c2, c3 (2 each); n4 d1 (6).
RUNNING = [
    _job("a1", 4, "n1", 0),
    _job("a2", 2, "n1", 4),
    _job("b1", 4, "n2", 0),
    _job("b2", 2, "n2", 4),
    _job("c1", 2, "n3", 0),
    _job("c2", 2, "n3", 2),
    _job("c3", 2, "n3", 4),
    _job("d1", 6, "n4", 0),
]
GANG = workload("gang", "big", gpus=8.0, submit_time_s=500.0)  # one pod of 8 GPUs
# team holds 24 GPUs, its fair share: reclaim cannot take any of it.
SHARES = {"team": 24.0, "big": 8.0}


def _snapshot(share: float | None, **kwargs: object) -> CycleSnapshot:
    return snapshot(
        NODES,
        [queue("team", 24), queue("big", 8)],
        SHARES,
        running_work=RUNNING,
        pending=[GANG],
        max_moved_share_per_hour=share,
        **kwargs,  # type: ignore[arg-type]
    )


def _moves(result: CycleResult) -> dict[str, set[str]]:
    return {
        e.workload_uid: {binding.node for binding in e.move_to}
        for e in result.evicts
        if e.reason is EvictReason.DEFRAGMENT
    }


def test_without_moves_the_gang_waits_beside_8_scattered_free_gpus() -> None:
    result = run_cycle(_snapshot(None))
    assert not result.evicts and not result.binds
    assert result.pending["gang"].code is PendingCode.NO_CAPACITY


def test_the_fewest_movable_workloads_make_room_and_each_has_its_new_place() -> None:
    """d1 (6 GPUs) would empty n4 in one move, but 6 GPUs fit nowhere else; a1 + a2 and b1 + b2
    likewise (a1, b1 need 4). Moving c1, c2, c3 (2 GPUs each) to the 2 free GPUs of n1, n2 and
    n4 empties n3 for the gang: 3 moves, 6 GPUs."""
    snap = _snapshot(0.25)  # up to 8 of 32 GPUs an hour
    result = run_cycle(snap)
    moves = _moves(result)
    assert set(moves) == {"c1", "c2", "c3"}
    assert sorted(node for nodes in moves.values() for node in nodes) == ["n1", "n2", "n4"]
    assert all(e.beneficiary_uid == "gang" and e.move_gpu_type == "unit" for e in result.evicts)
    assert "moved to make room for gang" in result.evicts[0].message
    # The gang waits for the moved work to stop, on n3; the new places are held meanwhile.
    assert result.pending["gang"].code is PendingCode.WAITING_FOR_EVICTED_CAPACITY
    held = {r.workload_uid: (r.kind, r.nodes) for r in result.reservations}
    assert held["gang"] == (ReservationKind.EVICTED_CAPACITY, ("n3",))
    assert {uid for uid, (kind, _) in held.items() if kind is ReservationKind.MOVE_TARGET} == {
        "c1",
        "c2",
        "c3",
    }
    assert_no_oversubscription(snap, result)
    assert_holds_fit(snap, result)


def test_the_moved_work_rebinds_first_where_it_was_sent_and_the_gang_binds() -> None:
    """The cycle after the moves stopped: c1, c2, c3 are pending again and bind on exactly the
    GPUs chosen for them; the gang binds on n3."""
    first = run_cycle(_snapshot(0.25))
    stopped = [a for a in RUNNING if a.workload.uid not in {"c1", "c2", "c3"}]
    again = [a.workload for a in RUNNING if a.workload.uid in {"c1", "c2", "c3"}]
    evicting = [
        EvictionInFlight(e.workload_uid, e.beneficiary_uid, e.move_to, e.move_gpu_type)
        for e in first.evicts
    ]
    snap = snapshot(
        NODES,
        [queue("team", 24), queue("big", 8)],
        {"team": 18.0, "big": 8.0},  # the team's share fell meanwhile: its moved work binds anyway
        running_work=stopped,
        pending=[GANG, *again],
        evicting=evicting,
        max_moved_share_per_hour=0.25,
        moved_gpus_last_hour=6.0,
    )
    result = run_cycle(snap)
    assert bound_uids(result) == {"gang", "c1", "c2", "c3"}
    sent = {e.workload_uid: e.move_to for e in first.evicts}
    for bind in result.binds:
        if bind.workload_uid in sent:
            assert bind.bindings == sent[bind.workload_uid]
    (gang,) = [b for b in result.binds if b.workload_uid == "gang"]
    assert {binding.node for binding in gang.bindings} == {"n3"}
    assert not result.evicts
    assert_no_oversubscription(snap, result)


def test_the_hourly_budget_bounds_the_moves() -> None:
    """3.2 GPUs an hour (10 % of 32) cannot pay for 6; nor can 8 with 4 moved in the past hour."""
    assert not run_cycle(_snapshot(0.1)).evicts
    assert not run_cycle(_snapshot(0.25, moved_gpus_last_hour=4.0)).evicts
    assert set(_moves(run_cycle(_snapshot(0.25, moved_gpus_last_hour=2.0)))) == {"c1", "c2", "c3"}


def test_no_moves_for_non_preemptible_work_or_work_before_its_min_runtime() -> None:
    pinned = [
        running(
            workload(a.workload.uid, "team", gpus=a.workload.gpus_per_pod, preemptible=False),
            [(b.node, b.gpu_indices) for b in a.bindings],
        )
        if a.workload.uid.startswith("c")
        else a
        for a in RUNNING
    ]
    snap = _snapshot(0.25)
    result = run_cycle(
        CycleSnapshot(**{**{f: getattr(snap, f) for f in snap.__slots__}, "running": tuple(pinned)})
    )
    assert not result.evicts
    young = [
        running(
            workload(a.workload.uid, "team", gpus=a.workload.gpus_per_pod, min_runtime_s=3600),
            [(b.node, b.gpu_indices) for b in a.bindings],
        )
        for a in RUNNING
    ]
    result = run_cycle(
        CycleSnapshot(**{**{f: getattr(snap, f) for f in snap.__slots__}, "running": tuple(young)})
    )
    assert not result.evicts  # started at 0, now 1000 s: under an hour


def _fragmented_world(seed: int) -> tuple[list[Allocation], list[Workload]]:
    """8 nodes of 8 GPUs, each with 1- and 2-GPU jobs of queue team on 4 to 7 GPUs, and three
    8-GPU gangs of queue big waiting."""
    rng = random.Random(seed)
    allocations = []
    for index in range(1, 9):
        used = 0
        target = rng.randint(4, 7)
        while used < target:
            gpus = min(rng.choice([1, 2]), target - used)
            uid = f"s{index}-{used}"
            job = workload(uid, "team", gpus=float(gpus), min_runtime_s=rng.choice([0.0, 5e3]))
            allocations.append(running(job, [(f"n{index}", tuple(range(used, used + gpus)))]))
            used += gpus
    gangs = [workload(f"g{i}", "big", gpus=8.0, submit_time_s=float(i)) for i in range(3)]
    return allocations, gangs


@pytest.mark.parametrize("seed", range(12))
def test_moves_keep_the_cycle_invariants_and_moved_work_binds_where_it_was_sent(
    seed: int,
) -> None:
    """Random fragmented pools with moves on (a quarter of the pool an hour), over four cycles:
    every cycle keeps the invariants of the random-world property test, a moved workload stops
    at once and waits again, and the next cycle binds it exactly on the GPUs its move named;
    the moves of any hour stay within the budget (16 of 64 GPUs)."""
    nodes = [node(f"n{i}") for i in range(1, 9)]
    allocations, gangs = _fragmented_world(seed)
    running_now = {a.workload.uid: a for a in allocations}
    pending: dict[str, Workload] = {g.uid: g for g in gangs}
    in_flight: list[EvictionInFlight] = []
    moved_gpus = 0.0
    total_moves = 0
    for cycle in range(4):
        now_s = 10_000.0 + cycle * 60.0
        for stopped in in_flight:
            allocation = running_now.pop(stopped.victim_uid, None)
            if stopped.move_to and allocation is not None:
                pending[stopped.victim_uid] = allocation.workload
        snap = snapshot(
            nodes,
            [queue("team", 48), queue("big", 24)],
            {"team": 48.0, "big": 24.0},
            running_work=running_now.values(),
            pending=pending.values(),
            now_s=now_s,
            evicting=in_flight,
            max_moved_share_per_hour=0.25,
            moved_gpus_last_hour=moved_gpus,
        )
        result = run_cycle(snap)
        check_invariants(snap, result)
        binds = {b.workload_uid: b for b in result.binds}
        for moved in in_flight:
            if moved.move_to:
                assert binds[moved.victim_uid].bindings == moved.move_to
        moves = [e for e in result.evicts if e.reason is EvictReason.DEFRAGMENT]
        moved_gpus += sum(running_now[e.workload_uid].workload.gpus_per_pod for e in moves)
        assert moved_gpus <= 0.25 * 64 + 1e-9
        total_moves += len(moves)
        for bind in result.binds:
            job = pending.pop(bind.workload_uid)
            running_now[job.uid] = Allocation(job, bind.bindings, now_s, bind.gpu_type)
        in_flight = [
            EvictionInFlight(e.workload_uid, e.beneficiary_uid, e.move_to, e.move_gpu_type)
            for e in result.evicts
        ]
    # Every seed moves (5 to 9 workloads in all), and at least two of the three gangs run.
    assert total_moves >= 5
    assert "g0" not in pending and "g1" not in pending
