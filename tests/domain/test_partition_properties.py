"""Partitions over random clusters and workloads, across cycles with reclaim: instances never
share a slice, sit only at their profile's starts, and never share a GPU with other work."""

from __future__ import annotations

from collections import defaultdict

from cycle_builders import POOL, node, queue
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpufair.domain.cycle import run_cycle
from gpufair.domain.model import Allocation, GpuType, NodePool, Workload
from gpufair.domain.partition_geometry import MIG_80GB_PROFILES, slice_mask
from gpufair.domain.partitions import with_profile_share
from gpufair.domain.snapshot import CycleSnapshot, EvictionInFlight

A100_MIG = GpuType("a100-80gb", 80, 10, MIG_80GB_PROFILES)
TYPES = {A100_MIG.name: A100_MIG}
PROFILES = {p.name: p for p in MIG_80GB_PROFILES}

# What one pod asks: a profile name, a plain share, or whole GPUs.
asks = st.one_of(
    st.sampled_from(sorted(PROFILES)),
    st.sampled_from([0.5, 0.25, 1.0, 2.0]),
)


def make(uid: str, queue_name: str, ask: str | float, pods: int, at_s: float) -> Workload:
    if isinstance(ask, str):
        job = Workload(uid, queue_name, POOL, pods, 0.0, at_s, partition_profile=ask)
        resolved, problem = with_profile_share(job, TYPES)
        assert problem is None
        return resolved
    return Workload(uid, queue_name, POOL, pods, ask, at_s)


def check_gpus(live: dict[str, Allocation]) -> None:
    slices: dict[tuple[str, int], int] = defaultdict(int)
    other: dict[tuple[str, int], float] = defaultdict(float)
    for allocation in live.values():
        job = allocation.workload
        for binding in allocation.bindings:
            if job.partition_profile:
                profile = PROFILES[job.partition_profile]
                start = binding.partition_start
                assert start in profile.starts, (job.uid, start)
                mask = slice_mask(start, profile.memory_slices)
                key = (binding.node, binding.gpu_indices[0])
                assert not slices[key] & mask, (job.uid, key)
                slices[key] |= mask
            else:
                for gpu in binding.gpu_indices:
                    other[(binding.node, gpu)] += min(binding.gpu_fraction, 1.0)
    assert not set(slices) & set(other), "a GPU holds partitions and other work"
    assert all(used <= 1.0 + 1e-9 for used in other.values())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gpus=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    arrivals=st.lists(
        st.lists(st.tuples(st.sampled_from(["a", "b"]), asks, st.integers(1, 5)), max_size=6),
        min_size=1,
        max_size=4,
    ),
    shares=st.lists(st.floats(0, 60), min_size=2, max_size=2),
)
# Found by this test: a partition's hold over a victim sharing the GPU (0.5) let a second
# partition onto the same GPU in the same cycle, beside the victim still running there.
@example(
    gpus=[1, 1],
    arrivals=[
        [("a", "1g.10gb", 1)] * 4 + [("b", "1g.10gb", 3), ("b", 0.5, 1)],
        [("a", "1g.10gb", 1)] * 2,
    ],
    shares=[0.0, 8.0],
)
def test_instances_never_overlap_nor_mix_with_other_work(
    gpus: list[int], arrivals: list[list[tuple[str, str | float, int]]], shares: list[float]
) -> None:
    nodes = tuple(node(f"n{i}", A100_MIG, count) for i, count in enumerate(gpus))
    queues = (queue("a", 20.0), queue("b", 0.0))
    live: dict[str, Allocation] = {}
    waiting: dict[str, Workload] = {}
    in_flight: list[EvictionInFlight] = []
    for cycle, batch in enumerate(arrivals + [[]] * 2):
        now_s = 1_000.0 + 10.0 * cycle
        for index, (queue_name, ask, pods) in enumerate(batch):
            uid = f"{queue_name}-{cycle}-{index}"
            waiting[uid] = make(uid, queue_name, ask, pods, now_s - 5.0)
        # Fair shares move between cycles, so reclaim takes partitions back and forth.
        fair = dict(zip(("a", "b"), shares if cycle % 2 == 0 else shares[::-1], strict=True))
        snap = CycleSnapshot(
            pool=NodePool(POOL),
            nodes=nodes,
            gpu_types=(A100_MIG,),
            queues=queues,
            fair_share_cu=fair,
            running=tuple(live.values()),
            pending=tuple(waiting.values()),
            now_s=now_s,
            evicting=tuple(in_flight),
        )
        result = run_cycle(snap)
        for stopped in in_flight:
            live.pop(stopped.victim_uid, None)
        for bind in result.binds:
            job = waiting.pop(bind.workload_uid)
            live[job.uid] = Allocation(job, bind.bindings, now_s, bind.gpu_type)
        check_gpus(live)
        in_flight = [EvictionInFlight(e.workload_uid, e.beneficiary_uid) for e in result.evicts]
