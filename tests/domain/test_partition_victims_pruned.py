"""A victim that frees nothing for the workload is never kept (DESIGN §4.3: never evict more
than needed), also when it is a partition whose GPU other partitions still hold.

Found by the random runs under load (`test_cycle_rules_under_load`): freeing a partition was
taken as freeing its fraction of the GPU, so a plain share seemed to fit beside the partition
that stays, the pick gained no pod, and the gang's picks were all kept unpruned."""

from __future__ import annotations

from gpufair.domain.cycle import run_cycle
from gpufair.domain.model import (
    Allocation,
    GpuType,
    Node,
    NodePool,
    PodBinding,
    Queue,
    QueueQuota,
    Workload,
)
from gpufair.domain.partition_geometry import MIG_80GB_PROFILES
from gpufair.domain.snapshot import CycleSnapshot

POOL = "main"
A100 = GpuType("a100-80gb", 80, 10, MIG_80GB_PROFILES)
FRACTIONS = {p.name: p.gpu_fraction for p in MIG_80GB_PROFILES}


def _queue(name: str, weight: float = 1.0) -> Queue:
    return Queue(name, quotas={POOL: QueueQuota(POOL, over_quota_weight=weight)})


def _running(
    uid: str, queue: str, node: str, pods: list[tuple[float, int | None]], **kw
) -> Allocation:
    profile = kw.pop("profile", "")
    gpus = pods[0][0]
    job = Workload(uid, queue, POOL, len(pods), gpus, 0.0, partition_profile=profile, **kw)
    bindings = tuple(
        PodBinding(i, node, (0,), fraction, start) for i, (fraction, start) in enumerate(pods)
    )
    return Allocation(job, bindings, 0.0, A100.name)


def test_a_partition_victim_beside_a_staying_partition_is_not_evicted_for_a_share() -> None:
    nodes = [Node(name, POOL, A100.name, 1, 64_000, 512_000) for name in ("a", "b")]
    four, three = FRACTIONS["4g.40gb"], FRACTIONS["3g.40gb"]
    running = [
        # Node a: a best-effort 4g.40gb (the first victim in order) beside a 3g.40gb that stays.
        _running("part", "loose", "a", [(four, 0)], profile="4g.40gb"),
        _running("stays-a", "kept", "a", [(three, 4)], profile="3g.40gb", preemptible=False),
        # Node b: two quarter shares of a queue above its share, and a half that stays.
        _running("shares", "over", "b", [(0.25, None), (0.25, None)]),
        _running("stays-b", "kept", "b", [(0.5, None)], preemptible=False),
    ]
    snap = CycleSnapshot(
        pool=NodePool(POOL, gang_reservation_after_s=None),
        nodes=tuple(nodes),
        gpu_types=(A100,),
        queues=(_queue("loose", 0.0), _queue("over"), _queue("kept"), _queue("wants")),
        fair_share_cu={"kept": 10.0, "wants": 10.0},
        running=tuple(running),
        pending=(Workload("half", "wants", POOL, 1, 0.5, 0.0),),
        now_s=1_000.0,
    )
    result = run_cycle(snap)
    assert [(e.workload_uid, e.beneficiary_uid) for e in result.evicts] == [("shares", "half")]
    assert [[b.node for b in r.held] for r in result.reservations] == [["b"]]
