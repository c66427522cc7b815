"""Partition victims are ranked by what their going frees for the pending pod (DESIGN §4.3:
lower priority first, the fewest CU; §4.4), not by their fraction of a GPU.

A partition holds its profile's fraction of a GPU's CU, but a GPU holding partitions is closed
to whole-GPU pods and plain shares until its last partition goes (`capacity`), and a partition
pod needs free slices where its profile may begin (`partition_geometry`). The victim search
counted a partition's going as its fraction of room: beside a partition that stays it freed
room it does not free, and the last partitions of a GPU, their fractions summing to less than
one (two 3g.40gb are 6/7), never freed the GPU. Found by comparing the cycle's victims with every
set of candidates on small random pools; each case here is the smallest of its kind."""

from __future__ import annotations

from cycle_builders import POOL, evictions, node, snapshot

from gpufair.domain.cycle import run_cycle
from gpufair.domain.model import (
    Allocation,
    GpuType,
    PodBinding,
    Queue,
    QueueQuota,
    Workload,
)
from gpufair.domain.partition_geometry import MIG_80GB_PROFILES
from gpufair.domain.snapshot import CycleResult, EvictReason

A100 = GpuType("a100-80gb", 80, 10, MIG_80GB_PROFILES)
FRACTIONS = {p.name: p.gpu_fraction for p in MIG_80GB_PROFILES}


def _queue(name: str, priority: int = 0) -> Queue:
    return Queue(name, quotas={POOL: QueueQuota(POOL, priority=priority)})


def _running(
    uid: str,
    queue: str,
    node: str,
    gpu: int,
    *,
    profile: str = "",
    start: int | None = None,
    gpus: float = 1.0,
    priority_class: int = 0,
) -> Allocation:
    share = FRACTIONS[profile] if profile else gpus
    job = Workload(
        uid,
        queue,
        POOL,
        1,
        share,
        0.0,
        partition_profile=profile,
        priority_class=priority_class,
    )
    binding = PodBinding(0, node, (gpu,), min(share, 1.0), start)
    return Allocation(job, (binding,), 0.0, A100.name)


def _cycle(
    nodes: dict[str, int],
    queues: list[Queue],
    fair_share: dict[str, float],
    running: list[Allocation],
    pending: Workload,
) -> CycleResult:
    """One cycle of the pool's A100 nodes with MIG profiles (GPUs by name)."""
    snap = snapshot(
        [node(name, A100, count) for name, count in nodes.items()],
        queues,
        fair_share,
        running_work=running,
        pending=[pending],
        gpu_types=[A100],
    )
    return run_cycle(snap)


def test_a_partition_that_leaves_its_gpu_empty_frees_the_whole_gpu() -> None:
    """A lone 1g.10gb (1.4 CU) on one node, a whole GPU (10 CU) of the same queue on another:
    a whole-GPU pod takes the 1g.10gb's GPU. Its fraction, 1/7, never freed the GPU, so the
    search evicted the whole GPU instead: seven times the CU."""
    result = _cycle(
        {"a": 1, "b": 1},
        [_queue("wants"), _queue("over")],
        {"wants": 10.0, "over": 0.0},
        [
            _running("slice", "over", "a", 0, profile="1g.10gb", start=0),
            _running("whole", "over", "b", 0),
        ],
        Workload("pod", "wants", POOL, 1, 1.0, 0.0),
    )
    assert evictions(result) == [("slice", EvictReason.RECLAIM)]


def test_the_lowest_tier_goes_first_when_its_partitions_fill_a_gpu() -> None:
    """Two 3g.40gb of a tier-0 queue fill one GPU (6/7 of its CU); a tier-1 queue holds a
    whole GPU elsewhere. A whole-GPU pod takes the GPU of the two partitions: their fractions
    summed short of one, so the GPU seemed never freed and the tier-1 work was evicted."""
    result = _cycle(
        {"a": 1, "b": 1},
        [_queue("wants"), _queue("low", priority=0), _queue("high", priority=1)],
        {"wants": 10.0, "low": 0.0, "high": 0.0},
        [
            _running("low-0", "low", "a", 0, profile="3g.40gb", start=0),
            _running("low-4", "low", "a", 0, profile="3g.40gb", start=4),
            _running("high", "high", "b", 0),
        ],
        Workload("pod", "wants", POOL, 1, 1.0, 0.0),
    )
    assert evictions(result) == [("low-0", EvictReason.RECLAIM), ("low-4", EvictReason.RECLAIM)]


def test_a_partition_is_preempted_for_the_slices_its_going_frees() -> None:
    """A 1g.10gb at slice 1 of a GPU whose other slices are free, a whole GPU of a lower class
    on another node, both of the queue: a 4g.40gb of higher class needs slices 0-3 and
    preempts the 1g.10gb (1.4 CU). Its 1/7 seemed too little room for 4/7, so the whole GPU
    (10 CU) was preempted."""
    result = _cycle(
        {"a": 1, "b": 1},
        [_queue("team")],
        {"team": 30.0},
        [
            _running("small", "team", "a", 0, profile="1g.10gb", start=1, priority_class=1),
            _running("whole", "team", "b", 0),
        ],
        Workload(
            "big",
            "team",
            POOL,
            1,
            FRACTIONS["4g.40gb"],
            0.0,
            partition_profile="4g.40gb",
            priority_class=2,
        ),
    )
    assert evictions(result) == [("small", EvictReason.PREEMPT)]


def test_a_whole_gpu_is_reclaimed_from_partitions_that_hold_less_than_one_gpu_of_cu() -> None:
    """The pool's only GPU holds two 3g.40gb of a queue above its share: a whole-GPU pod
    reclaims both. The search's first test, free GPUs and the victims' GPUs against the
    pod's, counted them 6/7 of a GPU and gave up before any search."""
    result = _cycle(
        {"a": 1},
        [_queue("wants"), _queue("over")],
        {"wants": 10.0, "over": 0.0},
        [
            _running("left", "over", "a", 0, profile="3g.40gb", start=0),
            _running("right", "over", "a", 0, profile="3g.40gb", start=4),
        ],
        Workload("pod", "wants", POOL, 1, 1.0, 0.0),
    )
    assert evictions(result) == [("left", EvictReason.RECLAIM), ("right", EvictReason.RECLAIM)]


def test_a_whole_gpu_is_preempted_from_partitions_that_hold_less_than_one_gpu_of_cu() -> None:
    """As above inside one queue: a whole-GPU pod of a higher class preempts the two
    3g.40gb. Preemption's tests before a search (the victims' GPUs, then whether they could
    leave a GPU wholly free) counted their fractions and found no room."""
    result = _cycle(
        {"a": 1},
        [_queue("team")],
        {"team": 20.0},
        [
            _running("left", "team", "a", 0, profile="3g.40gb", start=0),
            _running("right", "team", "a", 0, profile="3g.40gb", start=4),
        ],
        Workload("pod", "team", POOL, 1, 1.0, 0.0, priority_class=1),
    )
    assert evictions(result) == [("left", EvictReason.PREEMPT), ("right", EvictReason.PREEMPT)]


def test_a_7g_partition_preempts_the_small_partition_on_its_gpu() -> None:
    """A 7g.80gb takes a whole GPU; the only GPU holds a 1g.20gb of a lower class of the
    queue: it is preempted. Its 1/7 GPU seemed too little for the 7g's one GPU."""
    result = _cycle(
        {"a": 1},
        [_queue("team")],
        {"team": 20.0},
        [_running("small", "team", "a", 0, profile="1g.20gb", start=6)],
        Workload("big", "team", POOL, 1, 1.0, 0.0, partition_profile="7g.80gb", priority_class=1),
    )
    assert evictions(result) == [("small", EvictReason.PREEMPT)]


def test_a_partition_pod_is_searched_for_though_its_victims_hold_less_than_its_fraction() -> None:
    """The 1g.10gb at slice 1 is the only victim: the 4g.40gb preempts it. The search's first
    test, free GPUs and the victims' GPUs against the pods', counted 1/7 against 4/7 and gave up
    (a partition's room is in free slices, which that test does not count)."""
    result = _cycle(
        {"a": 1},
        [_queue("team")],
        {"team": 20.0},
        [_running("small", "team", "a", 0, profile="1g.10gb", start=1, priority_class=1)],
        Workload(
            "big",
            "team",
            POOL,
            1,
            FRACTIONS["4g.40gb"],
            0.0,
            partition_profile="4g.40gb",
            priority_class=2,
        ),
    )
    assert evictions(result) == [("small", EvictReason.PREEMPT)]
