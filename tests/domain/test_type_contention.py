"""Placement (DESIGN §4.2, `cycle_contention`): a workload that allows several GPU types does not
take the capacity of a type that pending single-type work waits for while another of its types
has room; the cheapest type stays its first choice otherwise, and it still takes the contended
type when its other types are full (work-conserving)."""

from __future__ import annotations

from cycle_builders import node, queue, running, snapshot, workload

from gpufair.domain.cycle import run_cycle
from gpufair.domain.cycle_contention import exclusive_demand, type_order
from gpufair.domain.cycle_load import load
from gpufair.domain.cycle_state import CycleState
from gpufair.domain.model import GpuType, Node, Workload
from gpufair.domain.snapshot import CycleResult, CycleSnapshot, PendingCode

T4 = GpuType("t4", memory_gib=16, compute_weight=1)
G2 = GpuType("g2", memory_gib=24, compute_weight=2)
TYPES = (T4, G2)
SHARES = {"a": 100.0, "b": 100.0}
QUEUES = [queue("a", 100), queue("b", 100)]
T4_BUSY = running(workload("t4-busy", "b", types=("t4",)), [("t4-1", (0,))], T4)
G2_BUSY = running(
    workload("g2-busy", "b", pods=4, types=("g2",)),
    [("g2-1", (0,)), ("g2-1", (1,)), ("g2-1", (2,)), ("g2-1", (3,))],
    G2,
)
# Submitted first, in a queue tied with the other: tried first in the cycle.
FLEX = workload("flex", "a", types=("t4", "g2"), submit_time_s=0.0)


def _t4_only(uid: str, gpus: float, submit_time_s: float = 10.0) -> Workload:
    return workload(uid, "b", gpus=gpus, types=("t4",), submit_time_s=submit_time_s)


def _cycle(t4_gpus: int, pending: list[Workload], *, g2_full: bool = False) -> CycleResult:
    nodes = [node("t4-1", T4, gpus=t4_gpus), node("g2-1", G2, gpus=4)]
    work = [T4_BUSY, G2_BUSY] if g2_full else [T4_BUSY]
    return run_cycle(_snap(nodes, work, pending))


def _snap(nodes: list[Node], work: list, pending: list[Workload]) -> CycleSnapshot:
    return snapshot(nodes, QUEUES, SHARES, running_work=work, pending=pending, gpu_types=TYPES)


def _placed(result: CycleResult) -> dict[str, tuple[str, float]]:
    """Each bound workload's GPU type and CU."""
    return {b.workload_uid: (b.gpu_type, b.cu) for b in result.binds}


def test_flexible_job_leaves_the_t4_a_waiting_t4_only_job_needs() -> None:
    # T4: 2 GPUs, 1 busy, 1 free; the T4-only job asks 2 and waits. Taking the free T4 would
    # leave 0 of the 2 it waits for, so the flexible job goes to g2 (2 CU, not 1).
    result = _cycle(2, [FLEX, _t4_only("t4-only", 2.0)])
    assert _placed(result) == {"flex": ("g2", 2.0)}
    assert result.pending["t4-only"].code is PendingCode.NO_CAPACITY


def test_both_bind_in_one_cycle_when_the_flexible_job_moves() -> None:
    # T4: 3 GPUs, 1 busy, 2 free; the T4-only job (2 GPUs) is tried after the flexible one.
    # Cheapest first alone, the flexible job took a T4 and the T4-only job waited.
    result = _cycle(3, [FLEX, _t4_only("t4-only", 2.0)])
    assert _placed(result) == {"flex": ("g2", 2.0), "t4-only": ("t4", 2.0)}
    assert result.pending == {}


def test_without_t4_only_demand_the_flexible_job_takes_the_cheapest_type() -> None:
    result = _cycle(2, [FLEX])
    assert _placed(result) == {"flex": ("t4", 1.0)}


def test_t4_with_room_for_both_stays_the_first_choice() -> None:
    # T4: 4 GPUs, 1 busy, 3 free; the T4-only job asks 2: 3 - 1 leaves the 2 it needs.
    result = _cycle(4, [FLEX, _t4_only("t4-only", 2.0)])
    assert _placed(result) == {"flex": ("t4", 1.0), "t4-only": ("t4", 2.0)}


def test_with_the_other_types_full_the_flexible_job_still_takes_t4() -> None:
    # g2's 4 GPUs all busy: the contended T4 is the only room, and it is taken.
    result = _cycle(2, [FLEX, _t4_only("t4-only", 2.0)], g2_full=True)
    assert _placed(result) == {"flex": ("t4", 1.0)}
    assert result.pending["t4-only"].code is PendingCode.NO_CAPACITY


def test_t4_only_work_bound_in_the_pass_no_longer_counts() -> None:
    # T4: 4 GPUs, 1 busy, 3 free. The T4-only job (2 GPUs, submitted first) binds, leaving 1
    # free T4 and no T4-only demand: the flexible job (tried next) takes that T4.
    flex = workload("flex", "a", types=("t4", "g2"), submit_time_s=20.0)
    result = _cycle(4, [flex, _t4_only("t4-only", 2.0, submit_time_s=0.0)])
    assert _placed(result) == {"t4-only": ("t4", 2.0), "flex": ("t4", 1.0)}


def test_the_demand_counts_gang_minimum_gpus_of_single_type_work() -> None:
    # T4-only: a gang of 4 pods of 1 GPU that starts with 2 (2 GPUs) in queue a; in queue b
    # 2 GPUs, 0.5 GPU and the same gang again; g2-only: 1 GPU in queue a; flexible work adds
    # nothing. g2 has room for 4 more, so every queue is read: 6.5 GPUs on T4, 1 on g2.
    gang = {"pods": 4, "min_pods": 2, "types": ("t4",)}
    pending = [
        FLEX,
        _t4_only("t4-only", 2.0),
        _t4_only("t4-half", 0.5),
        workload("t4-gang", "b", **gang),
        workload("t4-gang-2", "a", **gang),
        workload("g2-only", "a", types=("g2",)),
    ]
    nodes = [node("t4-1", T4, gpus=2), node("g2-1", G2, gpus=4)]
    state = CycleState(_snap(nodes, [T4_BUSY], pending))
    load(state)
    assert list(state.queue_pending) == ["a", "b"]
    demand = exclusive_demand(state.queue_pending.values(), state.kinds.values(), state.capacity)
    assert demand == {"t4": 6.5, "g2": 1.0}
    # With g2 full, queue a alone gives each type at least its room (T4: 1 free GPU, g2: 0):
    # counting stops there, T4 at 2 GPUs, which makes it contended for any try all the same.
    state = CycleState(_snap(nodes, [T4_BUSY, G2_BUSY], pending))
    load(state)
    demand = exclusive_demand(state.queue_pending.values(), state.kinds.values(), state.capacity)
    assert demand == {"t4": 2.0, "g2": 1.0}
    # A 1-GPU try: 1 free T4 - 1 < 2.5, so t4 goes behind g2; with 4 free, 4 - 1 >= 2.5.
    assert type_order(("t4", "g2"), 1.0, {"t4": 2.5}, {"t4": 1, "g2": 4}) == ("g2", "t4")
    assert type_order(("t4", "g2"), 1.0, {"t4": 2.5}, {"t4": 4, "g2": 4}) == ("t4", "g2")
    # Every type contended: the cheapest-first order stays.
    assert type_order(("t4", "g2"), 1.0, {"t4": 2, "g2": 8}, {"t4": 1, "g2": 4}) == ("t4", "g2")
