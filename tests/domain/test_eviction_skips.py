"""Reclaim and preempt pass over workloads whose try could only fail (`cycle_reclaim`,
`cycle_preempt`): the same decisions, with fewer tries."""

from __future__ import annotations

import math
import random

import pytest
from cycle_builders import POOL, count_victim_searches, node, queue, running, snapshot, workload

from gpufair.domain import cycle_preempt, cycle_reclaim
from gpufair.domain.capacity import EPS
from gpufair.domain.cycle import run_cycle
from gpufair.domain.cycle_reclaim import least_cu_in_share
from gpufair.domain.cycle_state import Kind
from gpufair.domain.placement_ask import PodShape
from gpufair.domain.queuebook import QueueBook
from gpufair.domain.snapshot import EvictReason, PendingCode


def _count_calls(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[str]:
    called: list[str] = []
    original = getattr(module, name)

    def counted(state: object, item: object, *rest: object) -> object:
        called.append(item.uid)  # type: ignore[attr-defined]
        return original(state, item, *rest)

    monkeypatch.setattr(module, name, counted)
    return called


def test_reclaim_skips_workloads_its_share_no_longer_admits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Queue a holds 5 of its 9 CU; 30 workloads of 4 GPUs each wait for capacity. Reclaim takes
    # 4 GPUs from b (above its share) for the first; a then sits at its share, and the other 29
    # are passed over without a try.
    nodes = [node("x"), node("y")]
    queues = [queue("a", 9), queue("b", 0)]
    work = [
        *(running(workload(f"a{i}", "a"), [("x", (i,))]) for i in range(5)),
        *(running(workload(f"bx{i}", "b"), [("x", (5 + i,))]) for i in range(3)),
        *(running(workload(f"by{i}", "b"), [("y", (i,))], started_at_s=i) for i in range(8)),
    ]
    pending = [workload(f"w{i:02}", "a", gpus=4, submit_time_s=i) for i in range(30)]
    tried = _count_calls(monkeypatch, cycle_reclaim, "_try_reclaim")
    result = run_cycle(
        snapshot(nodes, queues, {"a": 9, "b": 7}, running_work=work, pending=pending)
    )
    assert tried == ["w00"]
    assert len(result.evicts) == 4
    assert {evict.beneficiary_uid for evict in result.evicts} == {"w00"}
    assert {evict.reason for evict in result.evicts} == {EvictReason.RECLAIM}
    assert result.pending["w00"].code is PendingCode.WAITING_FOR_EVICTED_CAPACITY
    assert {result.pending[f"w{i:02}"].code for i in range(1, 30)} == {PendingCode.NO_CAPACITY}


def test_preempt_tries_a_failed_kind_once_per_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    # 40 gangs of two 8-GPU pods (class 5) cannot be served by evicting a's eight 1-GPU jobs
    # (class 0) on x, y being held by non-preemptible work: the first fails, the other 39 of
    # its kind are not tried; a 4-GPU workload (class 4) after them still preempts 4 jobs.
    nodes = [node("x"), node("y")]
    queues = [queue("a", 16)]
    work = [
        *(running(workload(f"low{i}", "a"), [("x", (i,))], started_at_s=i) for i in range(8)),
        running(workload("keep", "a", gpus=8, preemptible=False), [("y", tuple(range(8)))]),
    ]
    gangs = [
        workload(f"g{i:02}", "a", pods=2, gpus=8, priority_class=5, submit_time_s=i)
        for i in range(40)
    ]
    small = workload("small", "a", gpus=4, priority_class=4)
    tried = _count_calls(monkeypatch, cycle_preempt, "_try_preempt")
    result = run_cycle(
        snapshot(nodes, queues, {"a": 16}, running_work=work, pending=[*gangs, small])
    )
    assert tried == ["g00", "small"]
    assert sorted(evict.workload_uid for evict in result.evicts) == [
        "low4",
        "low5",
        "low6",
        "low7",
    ]
    assert {evict.beneficiary_uid for evict in result.evicts} == {"small"}
    assert {evict.reason for evict in result.evicts} == {EvictReason.PREEMPT}
    assert result.pending["small"].code is PendingCode.WAITING_FOR_EVICTED_CAPACITY


def _kind(cu_per_pod: tuple[float, ...]) -> Kind:
    shape = PodShape.of(workload("k", "a"))
    types = tuple(f"t{i}" for i in range(len(cu_per_pod)))
    return Kind(None, shape, types, cu_per_pod, 0.0, ())


@pytest.mark.parametrize("seed", range(4))
def testleast_cu_in_share_is_below_what_the_share_test_admits(seed: int) -> None:
    """Whenever the room is below the bound, `QueueBook.max_pods` (within share) refuses the
    gang minimum on every type; at the bound's own CU (gang minimum times the cheapest CU per
    pod) it admits it."""
    rng = random.Random(seed)
    weights = {"t0": 1.0, "t1": 2.0, "t2": 10.0}
    book = QueueBook(queue("a", 0), POOL, 0.0, weights)
    for _ in range(2_000):
        gpus_per_pod = rng.choice([0.25, 0.5, 1.0, 2.0, 3.0, 8.0])
        pods = rng.randint(1, 16)
        cu_per_pod = tuple(gpus_per_pod * weight for weight in weights.values())
        least = least_cu_in_share(_kind(cu_per_pod), pods)
        book.fair_share_cu = rng.choice([7.3, 64.0, 100.1, 1_000.0 / 3.0])
        need = pods * min(cu_per_pod)
        for room in (need, need - EPS, need - 2 * EPS, need * (1 - 1e-15), rng.uniform(0, need)):
            book.allocated_cu = book.fair_share_cu - room
            computed = book.fair_share_cu - book.allocated_cu + EPS
            allowed = [
                book.max_pods(cu, gpus_per_pod, name, True, True)[0]
                for cu, name in zip(cu_per_pod, weights, strict=True)
            ]
            if computed < least:
                assert max(allowed) < pods
            if math.isclose(room, need, rel_tol=0.0, abs_tol=0.0):
                assert computed >= least and max(allowed) >= pods


def testleast_cu_in_share_never_refuses_free_or_empty_gangs() -> None:
    assert least_cu_in_share(_kind((0.0, 2.0)), 4) == -math.inf
    assert least_cu_in_share(_kind((1.0,)), 0) == -math.inf
    assert least_cu_in_share(_kind((2.0, 8.0)), 3) == pytest.approx(6.0, rel=1e-11)


def test_preempt_searches_no_victims_that_could_not_free_a_whole_pod(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Four 8-GPU nodes, each with two 1-GPU jobs of class 0 (8 GPUs in all, enough by count)
    # and six GPUs of non-preemptible work: no node can ever free 8 GPUs for the class-5
    # workload's one pod, so no search is made, and nothing is evicted.
    nodes = [node(f"n{i}") for i in range(4)]
    queues = [queue("a", 32)]
    work = []
    for i in range(4):
        work += [running(workload(f"low{i}-{gpu}", "a"), [(f"n{i}", (gpu,))]) for gpu in range(2)]
        keep = workload(f"keep{i}", "a", gpus=6, preemptible=False)
        work.append(running(keep, [(f"n{i}", tuple(range(2, 8)))]))
    big = workload("big", "a", gpus=8, priority_class=5)
    searched = count_victim_searches(monkeypatch)
    result = run_cycle(snapshot(nodes, queues, {"a": 32}, running_work=work, pending=[big]))
    assert searched == []
    assert result.evicts == ()
    assert result.pending["big"].code is not PendingCode.WAITING_FOR_EVICTED_CAPACITY
