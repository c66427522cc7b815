"""A drained node while work still runs on it: what the fair share divides, and the cycle after.

A drain (`gpufair drain`, SetNodesReady ready=false, a Slurm node in DRAIN or DOWN) takes the
node out of placement at once; the work running there keeps its GPUs and stays in its queue's
allocation until it ends. The division counts those GPUs until then
(`capacity_history.division_capacity`): a drain for maintenance changes no share and evicts
nobody elsewhere. Counting the ready nodes only, the shares added up to less than what was
held, and the next cycle reclaimed work of a queue the drain did not touch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cycle_builders import UNIT, node, queue, running, snapshot, workload

from gpufair.domain.capacity_history import HeldNode, division_capacity, totals
from gpufair.domain.cycle import run_cycle
from gpufair.domain.fairshare import FairShareInput, QueueDemand, compute_fair_shares
from gpufair.domain.model import Allocation, FairSharePolicy, GpuType
from gpufair.domain.snapshot import CycleResult, EvictReason, PendingCode

A100 = GpuType("a100-80gb", memory_gib=80, compute_weight=10)

# Pool `main`: four nodes of 8 `unit` GPUs (1 CU each). c holds all of x in quota; b holds y and
# half of z over quota; a (deserved 12) holds 2 GPUs on z and 6 on w, and waits for a 4-GPU pod
# that the 4 free GPUs (2 on z, 2 on w) cannot hold. b waits for 4 more GPUs.
QUEUES = [queue("a", 12), queue("b", 0), queue("c", 8)]
RUNNING_C = running(workload("c-x", "c", gpus=8, preemptible=False), [("x", tuple(range(8)))])
RUNNING = [
    running(workload("b-y", "b", gpus=8), [("y", tuple(range(8)))]),
    running(workload("b-z", "b", gpus=4), [("z", (0, 1, 2, 3))]),
    running(workload("a-z", "a", gpus=2), [("z", (4, 5))]),
    running(workload("a-w", "a", gpus=6), [("w", (0, 1, 2, 3, 4, 5))]),
]
PENDING = [
    workload("a-four", "a", gpus=4, submit_time_s=10),
    workload("b-more", "b", gpus=4, submit_time_s=10),
]


def _groups(ready_gpus: int) -> dict[tuple[str, float], tuple[int, int]]:
    return {("unit", 1.0): (ready_gpus // 8, ready_gpus)}


def _shares(capacity: Mapping[str, float], held: Sequence[Allocation]) -> dict[str, float]:
    """The fair shares of QUEUES over `capacity`, with demand from `held` and PENDING."""
    allocated: dict[str, float] = {}
    for allocation in held:
        gpus = sum(len(b.gpu_indices) for b in allocation.bindings)
        allocated[allocation.workload.queue] = allocated.get(allocation.workload.queue, 0) + gpus
    pending: dict[str, float] = {}
    for job in PENDING:
        pending[job.queue] = pending.get(job.queue, 0) + job.total_gpus
    demands = {
        q.name: QueueDemand(
            {"unit": allocated[q.name]} if q.name in allocated else {},
            {"unit": pending[q.name]} if q.name in pending else {},
        )
        for q in QUEUES
    }
    result = compute_fair_shares(
        FairShareInput("main", FairSharePolicy(), {"unit": UNIT}, capacity, QUEUES, demands)
    )
    return dict(result.fair_share_cu)


def _cycle(shares: Mapping[str, float], held: Sequence[Allocation]) -> CycleResult:
    nodes = [node("x", ready=False), node("y"), node("z"), node("w")]
    return run_cycle(snapshot(nodes, QUEUES, shares, running_work=held, pending=PENDING))


def test_division_counts_what_running_work_holds_on_a_node_not_ready() -> None:
    ready = _groups(24)  # y, z, w
    assert totals(ready) == (24.0, {"unit": 24.0})
    # x drained with its 8 GPUs busy: they count until the work ends.
    assert division_capacity(ready, [HeldNode("unit", 1.0, 8, 8.0)]) == (32.0, {"unit": 32.0})
    # Only what is held: 3 whole GPUs and half a shared one of 8; its 4.5 free GPUs do not count.
    assert division_capacity(ready, [HeldNode("unit", 1.0, 8, 3.5)]) == (27.5, {"unit": 27.5})
    # Never more than the node counts for (it reported 6 usable GPUs, work holds 8 indices).
    assert division_capacity(ready, [HeldNode("unit", 1.0, 6, 8.0)]) == (30.0, {"unit": 30.0})
    # A drained node nothing runs on counts nothing: exactly the ready nodes' numbers.
    assert division_capacity(ready, [HeldNode("unit", 1.0, 8, 0.0)]) == totals(ready)
    assert division_capacity(ready, []) == totals(ready)
    # The only node of a type drained while 4 of its GPUs are busy: the type stays, 4 GPUs.
    both = division_capacity(ready, [HeldNode("a100-80gb", 10.0, 8, 4.0)])
    assert both == (64.0, {"a100-80gb": 4.0, "unit": 24.0})


def test_drain_changes_no_share_and_evicts_nobody_while_its_work_runs() -> None:
    held = [RUNNING_C, *RUNNING]
    before_drain = _shares({"unit": 32.0}, held)
    assert before_drain == {"a": 12.0, "b": 12.0, "c": 8.0}
    capacity = division_capacity(_groups(24), [HeldNode("unit", 1.0, 8, 8.0)])
    assert capacity == (32.0, {"unit": 32.0})
    shares = _shares(capacity[1], held)
    assert shares == before_drain
    result = _cycle(shares, held)
    assert result.evicts == () and result.binds == ()
    assert result.pending["a-four"].code is PendingCode.NO_CAPACITY
    assert result.pending["b-more"].code is PendingCode.OVER_FAIR_SHARE
    summary = result.queues["b"]
    assert (summary.allocated_cu_after, summary.fair_share_cu) == (12.0, 12.0)  # not over it


def test_ready_nodes_only_would_reclaim_from_a_queue_the_drain_did_not_touch() -> None:
    """What dividing the ready nodes alone did: c's 8 GPUs on x stayed held and allocated, the
    over-quota pool lost them, and b's share fell from 12 to 4 CU: b's 8-GPU job on y was
    reclaimed for a's pod, though the drain freed nothing and b ran nothing on x."""
    held = [RUNNING_C, *RUNNING]
    shares = _shares(totals(_groups(24))[1], held)
    assert shares == {"a": 12.0, "b": 4.0, "c": 8.0}
    result = _cycle(shares, held)
    assert [(e.workload_uid, e.reason) for e in result.evicts] == [("b-y", EvictReason.RECLAIM)]
    assert result.pending["a-four"].code is PendingCode.WAITING_FOR_EVICTED_CAPACITY


def test_when_the_drained_work_ends_its_gpus_leave_the_division() -> None:
    # c-x stopped: x counts nothing, c wants nothing; the 24 ready GPUs are divided.
    capacity = division_capacity(_groups(24), [HeldNode("unit", 1.0, 8, 0.0)])
    assert capacity == (24.0, {"unit": 24.0})
    shares = _shares(capacity[1], RUNNING)
    assert shares == {"a": 12.0, "b": 12.0, "c": 0.0}
    result = _cycle(shares, RUNNING)
    assert result.evicts == () and result.binds == ()  # nothing placed on x's free GPUs
    assert result.pending["a-four"].code is PendingCode.NO_CAPACITY


def test_only_node_of_a_type_drained_keeps_its_holder_share() -> None:
    """A queue (deserved 88 CU) holding all 8 A100s of the pool's only A100 node, drained, and 8
    `unit` GPUs: counting ready nodes only, the type left the capacity, the queue's held A100s
    left its allowed demand, and its fair share read 8 CU while it held 88 (GetFairShare showed
    it 80 CU over its share). Counted while the work runs, nothing changes."""
    queues = [queue("big", 88), queue("small", 0)]
    demands = {
        "big": QueueDemand({"a100-80gb": 8.0, "unit": 8.0}, {}),
        "small": QueueDemand({"unit": 16.0}, {"unit": 8.0}),
    }
    types = {"a100-80gb": A100, "unit": UNIT}

    def divide(capacity: Mapping[str, float]) -> dict[str, float]:
        inp = FairShareInput("main", FairSharePolicy(), types, capacity, queues, demands)
        return dict(compute_fair_shares(inp).fair_share_cu)

    undrained = divide({"a100-80gb": 8.0, "unit": 24.0})
    assert undrained == {"big": 88.0, "small": 16.0}
    assert divide(totals(_groups(24))[1]) == {"big": 8.0, "small": 16.0}
    kept = division_capacity(_groups(24), [HeldNode("a100-80gb", 10.0, 8, 8.0)])
    assert kept == (104.0, {"a100-80gb": 8.0, "unit": 24.0})
    assert divide(kept[1]) == undrained
