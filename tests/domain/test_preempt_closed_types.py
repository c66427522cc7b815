"""Preemption passes over what could only fail (`cycle_preempt`): a GPU type with no victim of a
class below the workload's is closed without reading the victims' totals, and the room test
counts a GPU freed only when every use of it is a victim of a lower class."""

from __future__ import annotations

from typing import Any

import pytest
from cycle_builders import V100, count_victim_searches, node, queue, running, snapshot, workload

from gpufair.domain import cycle_preempt
from gpufair.domain.cycle import run_cycle
from gpufair.domain.snapshot import CycleResult, EvictReason, PendingCode


def _one_gpu_over_halves(keep_preemptible: bool) -> CycleResult:
    """A cycle of one class-5 workload of one GPU in queue a, whose node x's eight GPUs each
    hold two half-GPU jobs of the queue: a class-0 job and another (`keep_preemptible`)."""
    work = []
    for gpu in range(8):
        low = workload(f"low{gpu}", "a", gpus=0.5)
        work.append(running(low, [("x", (gpu,), 0.5)], started_at_s=gpu))
        other = workload(f"other{gpu}", "a", gpus=0.5, preemptible=keep_preemptible)
        work.append(running(other, [("x", (gpu,), 0.5)], started_at_s=gpu))
    return run_cycle(
        snapshot(
            [node("x")],
            [queue("a", 16)],
            {"a": 16},
            running_work=work,
            pending=[workload("one", "a", priority_class=5)],
        )
    )


def test_no_search_when_each_gpu_keeps_a_use_that_is_no_victim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Evicting all eight class-0 jobs frees half of each GPU and no whole one (the other half
    # runs non-preemptible work): the one-GPU class-5 workload's search could find nothing, so
    # none is made. Counting each victim's GPU as freed would have searched.
    searched = count_victim_searches(monkeypatch)
    result = _one_gpu_over_halves(keep_preemptible=False)
    assert searched == []
    assert result.evicts == ()
    assert result.pending["one"].code is PendingCode.NO_CAPACITY


def test_a_gpu_whose_every_use_is_a_lower_victim_counts_as_freed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The same pool with both halves preemptible class-0 work: one GPU is freed by evicting
    # its two jobs, the most recent first (GPU 7's).
    searched = count_victim_searches(monkeypatch)
    result = _one_gpu_over_halves(keep_preemptible=True)
    assert searched == ["unit"]
    assert sorted(evict.workload_uid for evict in result.evicts) == ["low7", "other7"]
    assert {evict.reason for evict in result.evicts} == {EvictReason.PREEMPT}
    assert result.pending["one"].code is PendingCode.WAITING_FOR_EVICTED_CAPACITY


def test_a_type_without_lower_victims_is_closed_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    # 20 class-5 workloads of one 8-GPU pod may run on x (unit) or y (V100). Queue a's victims
    # on x are of class 5, none below: x is closed without reading their totals. On y four
    # class-0 jobs of one GPU run beside non-preemptible work: too few GPUs for a pod, so the
    # first workload's try fails, its trial is dead, and the other 19 are not tried.
    nodes = [node("x"), node("y", V100)]
    work = [
        *(
            running(workload(f"peer{i}", "a", priority_class=5), [("x", (i,))], started_at_s=i)
            for i in range(8)
        ),
        *(running(workload(f"low{i}", "a"), [("y", (i,))], V100, started_at_s=i) for i in range(4)),
        running(workload("keep", "a", gpus=4, preemptible=False), [("y", (4, 5, 6, 7))], V100),
    ]
    pending = [
        workload(
            f"w{i:02}", "a", gpus=8, priority_class=5, submit_time_s=i, types=("unit", "v100-16gb")
        )
        for i in range(20)
    ]
    tried: list[str] = []
    try_preempt = cycle_preempt._try_preempt

    def counted(state: Any, item: Any, *rest: Any) -> None:
        tried.append(item.uid)
        try_preempt(state, item, *rest)

    totals_of: list[str] = []
    totals = cycle_preempt._totals

    def counted_totals(state: Any, name: str, gpu_type: str, victims: Any) -> Any:
        totals_of.append(gpu_type)
        return totals(state, name, gpu_type, victims)

    monkeypatch.setattr(cycle_preempt, "_try_preempt", counted)
    monkeypatch.setattr(cycle_preempt, "_totals", counted_totals)
    result = run_cycle(
        snapshot(nodes, [queue("a", 200)], {"a": 200}, running_work=work, pending=pending)
    )
    assert tried == ["w00"]
    assert totals_of == ["v100-16gb"]
    assert result.evicts == ()
    assert {result.pending[f"w{i:02}"].code for i in range(20)} == {PendingCode.NO_CAPACITY}
