"""Allocation over many pending workloads of few kinds: each kind (and preemptibility) is tried
once per turn of its queue, and every workload of it is left the reason that try found."""

from __future__ import annotations

import pytest

from gpufair.domain import cycle_allocate
from gpufair.domain.cycle import run_cycle
from gpufair.domain.cycle_allocate import allocate
from gpufair.domain.cycle_load import load
from gpufair.domain.cycle_state import CycleState, Pending
from gpufair.domain.placement_ask import Exclusion
from gpufair.domain.snapshot import PendingCode
from tests.domain.cycle_builders import node, queue, running, snapshot, workload


def test_twenty_workloads_that_find_no_room_leave_it_to_one_that_fits() -> None:
    # n0 full and 4 of n1's 8 GPUs taken by work that cannot be evicted: 4 GPUs free.
    held = [
        running(workload("r0", "other", gpus=8, preemptible=False), [("n0", tuple(range(8)))]),
        running(workload("r1", "other", gpus=4, preemptible=False), [("n1", (0, 1, 2, 3))]),
    ]
    wide = [
        workload(f"wide{i}", "q", gpus=6, submit_time_s=i, preemptible=i % 2 == 0)
        for i in range(20)
    ]
    small = workload("small", "q", gpus=4, submit_time_s=30)
    beyond = workload("beyond", "tight", gpus=4, submit_time_s=0)
    snap = snapshot(
        [node("n0"), node("n1")],
        [queue("other", 12), queue("q", 8), queue("tight", 2)],
        {"other": 12, "q": 8, "tight": 2},
        running_work=held,
        pending=[*wide, small, beyond],
    )
    result = run_cycle(snap)
    # 6 GPUs (6 CU) are within q's share of 8 but only 4 are free: none of the 20 fits, and
    # the 4-GPU workload behind them takes n1's 4 free GPUs.
    assert [(bind.workload_uid, bind.bindings[0].node) for bind in result.binds] == [
        ("small", "n1")
    ]
    codes = {job.uid: result.pending[job.uid].code for job in wide}
    # The 10 preemptible ones wait for room; the 10 others were then held to q's share in the
    # pass beyond it (non-preemptible work never goes beyond its share).
    assert [uid for uid, code in codes.items() if code is PendingCode.NO_CAPACITY] == [
        f"wide{i}" for i in range(0, 20, 2)
    ]
    assert [uid for uid, code in codes.items() if code is PendingCode.OVER_FAIR_SHARE] == [
        f"wide{i}" for i in range(1, 20, 2)
    ]
    # 4 CU is beyond a share of 2: that workload is not tried within the share.
    assert result.pending["beyond"].code is PendingCode.OVER_FAIR_SHARE


def test_kinds_of_one_trial_are_tried_once_per_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    # Kinds that differ only in what no type of the pool tells apart (GPU memory asked below
    # every type's) share their trial: one failed try per turn stands for all of them.
    full = [running(workload("r0", "other", gpus=6, preemptible=False), [("n0", tuple(range(6)))])]
    wide = [
        workload(f"wide{i}", "q", gpus=4, submit_time_s=i, min_gpu_memory_gib=10.0 * (i % 3))
        for i in range(9)
    ]
    snap = snapshot(
        [node("n0")],
        [queue("other", 6), queue("q", 8)],
        {"other": 6, "q": 8},
        running_work=full,
        pending=wide,
    )
    tried: list[str] = []
    real = cycle_allocate._try_bind

    def counted(
        state: CycleState, item: Pending, within_share: bool, exclusion: Exclusion
    ) -> cycle_allocate.Failure | None:
        tried.append(item.uid)
        return real(state, item, within_share, exclusion)

    monkeypatch.setattr(cycle_allocate, "_try_bind", counted)
    state = CycleState(snap)
    load(state)
    kinds = {id(item.kind) for item in state.queue_pending["q"]}
    trials = {id(item.kind.trial) for item in state.queue_pending["q"]}
    problems = {id(item.kind.memo_key) for item in state.queue_pending["q"]}
    assert (len(kinds), len(trials), len(problems)) == (3, 1, 1)
    numbers = {item.uid: item.trial for item in state.queue_pending["q"]}
    assert len(set(numbers.values())) == 1  # all preemptible, of one trial
    allocate(state, within_share=True)
    assert tried == ["wide0"]  # 4 GPUs within q's share of 8, but only 2 are free
    assert {item.code for item in state.queue_pending["q"]} == {PendingCode.NO_CAPACITY}
    assert run_cycle(snap).pending.keys() == {job.uid for job in wide}


def test_reasons_of_one_trial_are_shared_within_a_queue_only() -> None:
    # Two queues with workloads of one trial (preemptible or not, GPU memory asked below every
    # type's): the sentence is shared by a queue's workloads, each naming its own queue's numbers.
    full = [running(workload("r0", "other", gpus=6, preemptible=False), [("n0", tuple(range(6)))])]
    pending = [
        workload(
            f"{name}{i}",
            name,
            gpus=4,
            submit_time_s=i,
            preemptible=i % 2 == 0,
            min_gpu_memory_gib=10.0 * (i % 3),
        )
        for name in ("a", "b")
        for i in range(6)
    ]
    snap = snapshot(
        [node("n0")],
        [queue("other", 6), queue("a", 8), queue("b", 5)],
        {"other": 6, "a": 8, "b": 5},
        running_work=full,
        pending=pending,
    )
    result = run_cycle(snap)
    messages = {job.uid: result.pending[job.uid].message for job in pending}
    assert len(set(messages.values())) == 2
    for uid, message in messages.items():
        name = uid[0]
        assert f"queue {name}: allocated 0 CU, fair share {8 if name == 'a' else 5} CU" in message
