"""MIG-style partitions: the slice geometry, and where the cycle puts partition pods."""

from __future__ import annotations

import dataclasses

import pytest
from cycle_builders import POOL, V100, node, queue

from gpufair.domain.cycle import run_cycle
from gpufair.domain.model import (
    Allocation,
    GpuType,
    NodePool,
    PlacementStrategy,
    PodBinding,
    Workload,
)
from gpufair.domain.partition_geometry import MIG_80GB_PROFILES, geometry
from gpufair.domain.partitions import with_profile_share
from gpufair.domain.placement_rejection import never_fits
from gpufair.domain.snapshot import CycleResult, CycleSnapshot, PendingCode

A100_MIG = GpuType("a100-80gb", 80, 10, MIG_80GB_PROFILES)
H100_MIG = GpuType("h100-80gb", 80, 20, MIG_80GB_PROFILES)
TYPES = {t.name: t for t in (A100_MIG, H100_MIG, V100)}
SEVENTH = 1 / 7


def geometry_of(name: str):  # type: ignore[no-untyped-def]
    found = geometry(next(p for p in MIG_80GB_PROFILES if p.name == name))
    assert found is not None
    return found


def test_an_empty_80gb_gpu_holds_the_mig_counts_of_each_profile() -> None:
    counts = {p.name: geometry_of(p.name).per_empty_gpu for p in MIG_80GB_PROFILES}
    assert counts == {
        "1g.10gb": 7,
        "1g.20gb": 4,
        "2g.20gb": 3,
        "3g.40gb": 2,
        "4g.40gb": 1,
        "7g.80gb": 1,
    }


def test_valid_mixes_follow_from_the_slices() -> None:
    four, three, one, seven = (geometry_of(n) for n in ("4g.40gb", "3g.40gb", "1g.10gb", "7g.80gb"))
    taken = four.first_fit(0)
    assert taken == 0b00001111  # slices 0-3
    assert three.first_fit(taken) == 0b11110000  # 4g + 3g fill the GPU
    # A 1g instance takes the highest start (slice 6), so 4g still fits at slice 0 beside it,
    # while the 7g needs every slice and does not.
    one_mask = one.first_fit(0)
    assert one_mask == 0b01000000
    assert four.count(one_mask) == 1 and seven.count(one_mask) == 0
    assert one.count(one_mask) == 6
    # Two 3g instances, then no room for a third nor for a 2g... except none is left at all.
    both = three.first_fit(0) | three.first_fit(three.first_fit(0))
    assert both == 0xFF and geometry_of("2g.20gb").count(both) == 0


def mig_workload(
    uid: str, queue_name: str, profile: str, pods: int = 1, **fields: object
) -> Workload:
    job = Workload(uid, queue_name, POOL, pods, 0.0, 0.0, partition_profile=profile, **fields)  # type: ignore[arg-type]
    resolved, problem = with_profile_share(job, TYPES)
    assert problem is None
    return resolved


def cycle(
    nodes: list,  # type: ignore[type-arg]
    pending: list[Workload],
    running: tuple[Allocation, ...] = (),
    fair_share_cu: float = 100.0,
) -> CycleResult:
    snap = CycleSnapshot(
        pool=NodePool(POOL),
        nodes=tuple(nodes),
        gpu_types=tuple(TYPES.values()),
        queues=(queue("team", 100.0),),
        fair_share_cu={"team": fair_share_cu},
        running=running,
        pending=tuple(pending),
        now_s=1_000.0,
    )
    return run_cycle(snap)


def placements(result: CycleResult, uid: str) -> list[tuple[str, int, int | None, float]]:
    bind = next(b for b in result.binds if b.workload_uid == uid)
    return [(b.node, b.gpu_indices[0], b.partition_start, b.gpu_fraction) for b in bind.bindings]


def test_seven_1g_pods_fill_one_gpu_and_count_one_gpu_of_cu() -> None:
    result = cycle(
        [node("n1", A100_MIG, gpus=2)], [mig_workload("small", "team", "1g.10gb", pods=7)]
    )
    assert placements(result, "small") == [
        ("n1", 0, start, pytest.approx(SEVENTH)) for start in (6, 5, 4, 3, 2, 1, 0)
    ]
    (bind,) = result.binds
    assert bind.gpu_type == "a100-80gb"
    assert bind.cu == pytest.approx(10.0)  # 7 × 1/7 of a 10 CU GPU


def test_4g_and_3g_share_a_gpu_and_whole_gpu_work_takes_the_other() -> None:
    pending = [
        mig_workload("four", "team", "4g.40gb"),
        mig_workload("three", "team", "3g.40gb"),
        Workload("whole", "team", POOL, 1, 1.0, 1.0),
        Workload("whole-2", "team", POOL, 1, 1.0, 2.0, allowed_gpu_types=("a100-80gb",)),
    ]
    result = cycle([node("n1", A100_MIG, gpus=2)], pending)
    assert placements(result, "four") == [("n1", 0, 0, pytest.approx(4 / 7))]
    assert placements(result, "three") == [("n1", 0, 4, pytest.approx(3 / 7))]
    assert placements(result, "whole") == [("n1", 1, None, 1.0)]
    # Both GPUs are taken: one by partitions, one by the whole-GPU pod.
    assert result.pending["whole-2"].code is PendingCode.NO_CAPACITY
    cu = {b.workload_uid: b.cu for b in result.binds}
    assert cu == pytest.approx({"four": 40 / 7, "three": 30 / 7, "whole": 10.0})


def test_partitions_avoid_gpus_with_whole_or_shared_work() -> None:
    whole = Workload("whole", "team", POOL, 1, 1.0, 0.0)
    half = Workload("half", "team", POOL, 1, 0.5, 0.0)
    running = (
        Allocation(whole, (PodBinding(0, "n1", (0,)),), 0.0, "a100-80gb"),
        Allocation(half, (PodBinding(0, "n1", (1,), 0.5),), 0.0, "a100-80gb"),
    )
    result = cycle(
        [node("n1", A100_MIG, gpus=3)],
        [
            mig_workload("mig", "team", "2g.20gb", pods=4),
            Workload("other-half", "team", POOL, 1, 0.5, 1.0),
        ],
        running,
    )
    # Three 2g instances fill GPU 2 (starts 4, 2, 0); the fourth has nowhere to go, and a plain
    # half-GPU share goes beside the running half on GPU 1, never onto the partitioned GPU.
    assert result.pending["mig"].code is PendingCode.NO_CAPACITY
    assert placements(result, "other-half") == [("n1", 1, None, 0.5)]
    three = mig_workload("mig3", "team", "2g.20gb", pods=3)
    result = cycle([node("n1", A100_MIG, gpus=3)], [three], running)
    assert placements(result, "mig3") == [("n1", 2, s, pytest.approx(2 / 7)) for s in (4, 2, 0)]


def test_running_partitions_hold_their_reported_slices() -> None:
    small = mig_workload("small", "team", "1g.10gb")
    at_zero = (Allocation(small, (PodBinding(0, "n1", (0,), SEVENTH, 0),), 0.0, "a100-80gb"),)
    result = cycle(
        [node("n1", A100_MIG, gpus=2)], [mig_workload("four", "team", "4g.40gb")], at_zero
    )
    # The 1g instance at slice 0 blocks the only start of 4g on GPU 0: it goes to GPU 1.
    assert placements(result, "four") == [("n1", 1, 0, pytest.approx(4 / 7))]
    # Reported without a start, the instance is taken to sit where placement puts it (slice 6),
    # so a 4g fits beside it on GPU 0.
    unknown = (Allocation(small, (PodBinding(0, "n1", (0,), SEVENTH),), 0.0, "a100-80gb"),)
    result = cycle(
        [node("n1", A100_MIG, gpus=2)], [mig_workload("four", "team", "4g.40gb")], unknown
    )
    assert placements(result, "four") == [("n1", 0, 0, pytest.approx(4 / 7))]


def test_the_cheaper_type_offering_the_profile_wins_and_memory_filters() -> None:
    nodes = [node("a", A100_MIG, gpus=1), node("h", H100_MIG, gpus=1), node("v", V100, gpus=8)]
    result = cycle(nodes, [mig_workload("m", "team", "3g.40gb", min_gpu_memory_gib=40)])
    (bind,) = result.binds
    assert (bind.gpu_type, bind.cu) == ("a100-80gb", pytest.approx(30 / 7))
    # Asking more memory than the profile has: no type serves it.
    job = mig_workload("big", "team", "3g.40gb", min_gpu_memory_gib=41)
    rejection = never_fits(job, nodes, TYPES.values())
    assert rejection is not None and rejection.field == "partition_profile"
    assert "offered by a100-80gb, h100-80gb" in rejection.message


def test_spread_takes_untouched_gpus_first() -> None:
    snap = CycleSnapshot(
        pool=NodePool(POOL, placement=PlacementStrategy.SPREAD),
        nodes=(node("n1", A100_MIG, gpus=2), node("n2", A100_MIG, gpus=2)),
        gpu_types=tuple(TYPES.values()),
        queues=(queue("team", 100.0),),
        fair_share_cu={"team": 100.0},
        running=(),
        pending=(mig_workload("m", "team", "1g.10gb", pods=4),),
        now_s=1_000.0,
    )
    (bind,) = run_cycle(snap).binds
    used = sorted((b.node, b.gpu_indices[0]) for b in bind.bindings)
    assert used == [("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1)]


def test_profile_share_is_set_from_the_profile_and_checked() -> None:
    job = Workload("j", "team", POOL, 1, 0.0, 0.0, partition_profile="2g.20gb")
    resolved, problem = with_profile_share(job, TYPES)
    assert problem is None and resolved.gpus_per_pod == pytest.approx(2 / 7)
    _, problem = with_profile_share(dataclasses.replace(job, gpus_per_pod=0.5), TYPES)
    assert problem is not None and "is not the share of '2g.20gb'" in problem
    _, problem = with_profile_share(dataclasses.replace(job, partition_profile="5g.50gb"), TYPES)
    assert problem is not None and "no GPU type declares partition profile '5g.50gb'" in problem
