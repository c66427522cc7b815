"""A plain share's going frees its whole GPU when the rest of the GPU is free (DESIGN §4.3-4.4:
a workload that fits once victims go gets them, the fewest CU).

A share of a quarter of a GPU beside three free quarters holds 0.25 GPU, but its going leaves a
whole GPU free. The tests made before a victim search counted it 0.25 GPU against a whole-GPU
pod's one, so no search was made; a topology domain's test counted, besides, only the free GPUs
of nodes with a whole pod's GPUs free. A node's bound of its cost counted the share at its CU
per GPU it holds (four times its CU), so a dearer victim elsewhere was taken first. Found by
comparing the cycle's victims with every set of candidates on small random pools
(`test_victims_against_reference`); each case here is the smallest of its kind."""

from __future__ import annotations

import random

from cycle_builders import A100, POOL, V100, evictions, node, snapshot

from gpufair.domain.capacity import EPS, Capacity, PodUse
from gpufair.domain.cycle import run_cycle
from gpufair.domain.model import (
    Allocation,
    Node,
    PodBinding,
    Queue,
    QueueQuota,
    TopologyConstraint,
    Workload,
)
from gpufair.domain.snapshot import CycleResult, EvictReason
from gpufair.domain.victim_index import Victim, VictimIndex

RACK = TopologyConstraint("rack", required=True)


def _queue(name: str) -> Queue:
    return Queue(name, quotas={POOL: QueueQuota(POOL)})


def _running(
    uid: str,
    queue: str,
    node: str,
    gpus: tuple[int, ...],
    *,
    share: float = 1.0,
    priority_class: int = 0,
    started_at_s: float = 0.0,
) -> Allocation:
    per_pod = share if share < 1.0 else float(len(gpus))
    job = Workload(uid, queue, POOL, 1, per_pod, 0.0, priority_class=priority_class)
    binding = PodBinding(0, node, gpus, min(per_pod, 1.0))
    return Allocation(job, (binding,), started_at_s, A100.name)


def _cycle(
    nodes: dict[str, int],
    queues: list[Queue],
    fair_share: dict[str, float],
    running: list[Allocation],
    pending: Workload,
) -> CycleResult:
    """One cycle of the pool's A100 nodes (GPUs by name), all in rack r0."""
    snap = snapshot(
        [node(name, A100, count, rack="r0") for name, count in nodes.items()],
        queues,
        fair_share,
        running_work=running,
        pending=[pending],
    )
    return run_cycle(snap)


def test_a_whole_gpu_pod_reclaims_a_share_beside_free_room() -> None:
    """The pool's only GPU holds a 0.25 share of a queue above its share, the rest free: a
    whole-GPU pod reclaims it. Free GPUs (none) and the victims' GPUs (0.25) fell short of one,
    so no search was made."""
    result = _cycle(
        {"a": 1},
        [_queue("wants"), _queue("over")],
        {"wants": 10.0, "over": 0.0},
        [_running("quarter", "over", "a", (0,), share=0.25)],
        Workload("pod", "wants", POOL, 1, 1.0, 0.0),
    )
    assert evictions(result) == [("quarter", EvictReason.RECLAIM)]


def test_a_whole_gpu_pod_preempts_a_share_beside_free_room() -> None:
    """As above inside one queue: a whole-GPU pod of a higher class preempts the 0.25 share.
    Preemption's test before its search counted the victims' 0.25 GPU against one."""
    result = _cycle(
        {"a": 1},
        [_queue("team")],
        {"team": 20.0},
        [_running("quarter", "team", "a", (0,), share=0.25)],
        Workload("pod", "team", POOL, 1, 1.0, 0.0, priority_class=1),
    )
    assert evictions(result) == [("quarter", EvictReason.PREEMPT)]


def test_a_pod_within_a_rack_reclaims_a_share_beside_free_room() -> None:
    """The rack's only GPU holds a 0.25 share of a queue above its share: a whole-GPU pod
    that must stay in one rack reclaims it. The rack's test counted its free GPUs (none) and
    its victims' 0.25 GPU."""
    result = _cycle(
        {"a": 1},
        [_queue("wants"), _queue("over")],
        {"wants": 10.0, "over": 0.0},
        [_running("quarter", "over", "a", (0,), share=0.25)],
        Workload("pod", "wants", POOL, 1, 1.0, 0.0, topology=RACK),
    )
    assert evictions(result) == [("quarter", EvictReason.RECLAIM)]


def test_a_two_gpu_pod_within_a_rack_reclaims_the_gpu_beside_a_free_one() -> None:
    """A node of two GPUs, one free, the other held by a queue above its share: a pod of two
    GPUs that must stay in one rack reclaims it. The rack's test counted free GPUs only on
    nodes with a pod's two free, so the free one beside the victim was not counted."""
    result = _cycle(
        {"a": 2},
        [_queue("wants"), _queue("over")],
        {"wants": 20.0, "over": 0.0},
        [_running("whole", "over", "a", (1,))],
        Workload("pod", "wants", POOL, 1, 2.0, 0.0, topology=RACK),
    )
    assert evictions(result) == [("whole", EvictReason.RECLAIM)]


def test_a_share_beside_free_room_is_reclaimed_before_a_whole_gpu() -> None:
    """A 0.25 share (2.5 CU) beside free room on one node, a whole GPU (10 CU) started later on
    another, both of a queue above its share: a whole-GPU pod reclaims the share. A node's
    bound counted the share at its CU per GPU it holds, 10 per GPU, so the whole GPU's node,
    exact at 10 and sorting first on its later start, was taken without the share's node read."""
    result = _cycle(
        {"a": 1, "b": 1},
        [_queue("wants"), _queue("over")],
        {"wants": 10.0, "over": 0.0},
        [
            _running("quarter", "over", "a", (0,), share=0.25, started_at_s=100.0),
            _running("whole", "over", "b", (0,), started_at_s=200.0),
        ],
        Workload("pod", "wants", POOL, 1, 1.0, 0.0),
    )
    assert evictions(result) == [("quarter", EvictReason.RECLAIM)]


def test_a_share_beside_free_room_is_preempted_before_a_whole_gpu() -> None:
    """As above inside one queue: a whole-GPU pod of a higher class preempts the 0.25 share,
    not the whole GPU of the same class started later."""
    result = _cycle(
        {"a": 1, "b": 1},
        [_queue("team")],
        {"team": 30.0},
        [
            _running("quarter", "team", "a", (0,), share=0.25, started_at_s=100.0),
            _running("whole", "team", "b", (0,), started_at_s=200.0),
        ],
        Workload("pod", "team", POOL, 1, 1.0, 0.0, priority_class=1),
    )
    assert evictions(result) == [("quarter", EvictReason.PREEMPT)]


def test_a_nodes_bound_for_whole_gpu_pods_never_exceeds_what_freeing_a_gpu_costs() -> None:
    """Random nodes of whole GPUs and shares (some beside free room), some of them victims:
    every prefix of a node's victims in the index's order spends at least the node's CU per
    GPU for whole-GPU pods (`VictimIndex.floor`) per GPU it leaves wholly free that was not."""
    for seed in range(400):
        rng = random.Random(seed)
        count = rng.choice((1, 2, 4))
        capacity = Capacity([Node("n0", POOL, A100.name, count, 64_000, 512_000)])
        victims = []
        for gpu in range(count):
            pods = (
                [1.0]
                if rng.random() < 0.4
                else [rng.choice((0.5, 0.25)) for _ in range(rng.randint(0, 3))]
            )
            left = 1.0
            for amount in pods:
                if amount > left + EPS:
                    break
                left -= amount
                use = PodUse(0, (gpu,), amount, 0, 0)
                capacity.take((use,))
                if rng.random() < 0.7:
                    victim = Victim(
                        f"v{len(victims)}",
                        "q",
                        0,
                        rng.randrange(2),
                        float(rng.randrange(100)),
                        10.0 * amount,
                        amount,
                        A100.name,
                        (use,),
                        (0,),
                    )
                    victims.append(victim)
        index = VictimIndex(victims, capacity)
        if not index:
            continue
        _, cu_per_gpu, _, _ = index.floor(0, True)
        used = capacity.nodes[0].gpu_used.copy()
        spent = 0.0
        freed = 0
        for victim, uses in index.on_node[0].items():
            spent += victim.cu
            for use in uses:
                for gpu in use.gpu_indices:
                    before = used[gpu]
                    used[gpu] = before - use.gpu_amount
                    freed += before > EPS and used[gpu] <= EPS
            assert spent >= freed * cu_per_gpu - EPS, (seed, spent, freed, cu_per_gpu)


def test_a_rack_pod_of_more_gpus_than_a_type_has_on_a_node_reads_only_its_buckets() -> None:
    """A rack of a 1-GPU V100 node and a 4-GPU A100 node whose GPU 0 holds two 0.25 shares of a
    queue above its share; a pod of four GPUs of any type that must stay in the rack reclaims
    both shares. Searching the V100s, the rack's look at the room beside victims read the
    nodes with 1 to 3 GPUs free, and the V100s have none with more than one (IndexError, found
    by the random worlds of `test_cycle_properties`)."""
    snap = snapshot(
        [
            node("v", V100, 1, cpu_millicores=8_000, memory_mib=16_000, rack="r0"),
            node("n", A100, 4, cpu_millicores=8_000, memory_mib=16_000, rack="r0"),
        ],
        [_queue("wants"), _queue("over")],
        {"wants": 200.0, "over": 0.0},
        running_work=[
            _running("quarter-1", "over", "n", (0,), share=0.25),
            _running("quarter-2", "over", "n", (0,), share=0.25),
        ],
        pending=[Workload("pod", "wants", POOL, 1, 4.0, 0.0, topology=RACK)],
    )
    result = run_cycle(snap)
    assert evictions(result) == [
        ("quarter-1", EvictReason.RECLAIM),
        ("quarter-2", EvictReason.RECLAIM),
    ]
