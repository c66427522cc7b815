"""The type contention rule (`cycle_contention`) in the mixed compute-unit pass (`cycle_cu_mix`):
a request that may take several GPU types in one domain leaves a type's free GPUs to pending work
that can run only there when another domain's mix serves it, and takes them when none does.

The pool: T4 (1 CU per GPU), g2 (2 CU) and a10 (4 CU); queue a below its share, queue b at a
share of 0, so its T4-only work binds only beyond its share, after the mix.
"""

from __future__ import annotations

import dataclasses

from cycle_builders import node, queue, running, snapshot, workload

from gpufair.domain.cycle import run_cycle
from gpufair.domain.model import Allocation, GpuType, Node, TopologyConstraint, Workload
from gpufair.domain.snapshot import CycleResult, PendingCode

T4 = GpuType("t4", memory_gib=16, compute_weight=1)
G2 = GpuType("g2", memory_gib=24, compute_weight=2)
A10 = GpuType("a10", memory_gib=24, compute_weight=4)
TYPES = (T4, G2, A10)
QUEUES = [queue("a"), queue("b")]


def _cycle(
    nodes: list[Node],
    pending: list[Workload],
    shares: dict[str, float],
    work: tuple[Allocation, ...] = (),
) -> CycleResult:
    snap = snapshot(nodes, QUEUES, shares, running_work=work, pending=pending, gpu_types=TYPES)
    return run_cycle(snap)


def _placed(result: CycleResult) -> dict[str, tuple[str, float]]:
    """Each bound workload's GPU type and CU."""
    return {b.workload_uid: (b.gpu_type, b.cu) for b in result.binds}


# -- mixed compute-unit requests -----------------------------------------------------------

# Rack r1: 4 T4 and 1 g2 GPU; rack r2: 1 g2 and 1 a10 (4 CU). All free.
MIX_NODES = [
    node("t4-1", T4, gpus=4, rack="r1"),
    node("g2-1", G2, gpus=1, rack="r1"),
    node("g2-2", G2, gpus=1, rack="r2"),
    node("a10-2", A10, gpus=1, rack="r2"),
]
# 5 CU inside one rack, of any types: no single type in one rack gives it.
MIX = dataclasses.replace(
    workload("mix", "a"),
    compute_units=5.0,
    mixed_gpu_types=True,
    topology=TopologyConstraint("rack", required=True),
)
# 2 T4 GPUs for queue b, whose share is 0: it may bind only beyond the share, after the mix.
T4_PAIR = workload("t4-pair", "b", gpus=2, types=("t4",), submit_time_s=10.0)
MIX_SHARES = {"a": 10.0, "b": 0.0}


def test_a_mix_leaves_the_t4_gpus_single_type_work_waits_for() -> None:
    # Before: the mix took r1's g2 GPU and 3 of its 4 T4 (5 CU), and the T4 pair, 1 T4 left,
    # waited. Now it takes r2's g2 and a10 (6 CU) and the pair binds beyond b's share on T4.
    result = _cycle(MIX_NODES, [MIX, T4_PAIR], MIX_SHARES)
    (mix,) = [b for b in result.binds if b.workload_uid == "mix"]
    assert dict(mix.gpus_by_type) == {"a10": 1.0, "g2": 1.0} and mix.cu == 6.0
    assert _placed(result)["t4-pair"] == ("t4", 2.0)
    assert result.pending == {}


def test_a_mix_takes_the_contended_t4_when_no_rack_serves_it_otherwise() -> None:
    # Without r2's a10, no mix leaves the pair its 2 T4: the mix takes 3 T4 all the same.
    result = _cycle(MIX_NODES[:3], [MIX, T4_PAIR], MIX_SHARES)
    assert _placed(result) == {"mix": ("t4", 5.0)}
    assert dict(result.binds[0].gpus_by_type) == {"g2": 1.0, "t4": 3.0}
    assert result.pending["t4-pair"].code is PendingCode.OVER_FAIR_SHARE


def test_a_mix_without_single_type_demand_takes_the_least_cu() -> None:
    result = _cycle(MIX_NODES, [MIX], MIX_SHARES)
    assert dict(result.binds[0].gpus_by_type) == {"g2": 1.0, "t4": 3.0}
    assert result.binds[0].cu == 5.0


def test_a_mix_does_not_leave_t4_to_its_own_t4_gang() -> None:
    # Rack r3 has 5 T4, 2 of them busy: the request's one-type gang of the cycle is 5 T4 (7 of
    # the pool's T4 are free), which no rack holds now, and it is what the T4 figure counts
    # (5 GPUs). That is the request itself: its mix is r1's g2 and 3 T4 at 5 CU, not r2's g2
    # and a10 at 6 CU as if other work waited for the T4.
    r3 = [node("t4-3", T4, gpus=5, rack="r3")]
    busy = running(
        workload("busy", "b", pods=2, types=("t4",)), [("t4-3", (0,)), ("t4-3", (1,))], T4
    )
    result = _cycle(MIX_NODES + r3, [MIX], MIX_SHARES, (busy,))
    assert dict(result.binds[0].gpus_by_type) == {"g2": 1.0, "t4": 3.0}
    assert result.binds[0].cu == 5.0
