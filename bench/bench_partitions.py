"""Benchmark: a cycle whose shared-GPU work asks for MIG partitions and part of whose work asks
for compute units, beside the same cycle with plain shares and GPU counts.

Run from the repository root:

    PYTHONPATH=service python bench/bench_partitions.py --sizes 1000

Both snapshots come from `bench_cycle.build_snapshot(size)` (the `steady` mix: 5 running and 20
pending workloads a node, 200 queues). The A100s declare the MIG profiles of an 80 GB card.
In the *partition* snapshot, every shared-GPU workload on an A100 (running or pending, 0.25 or
0.5 of a GPU) asks instead for a `2g.20gb` or `3g.40gb` instance (2/7 or 3/7 of a GPU; running
ones are reported without their start, so the cycle places their slices itself), and one pending
whole-GPU workload in ten asks for `pods × gpus × 4` CU instead of its GPUs. Only `run_cycle` is
timed: wall and CPU seconds, median of the runs, the two snapshots alternating so both see the
same machine load.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from bench_cycle import build_snapshot

from gpufair.domain.cycle import run_cycle
from gpufair.domain.model import Allocation, PodBinding, Workload
from gpufair.domain.partition_geometry import MIG_80GB_PROFILES
from gpufair.domain.snapshot import CycleSnapshot

A100 = "a100-80gb"
PROFILE_FOR_SHARE = {0.25: "2g.20gb", 0.5: "3g.40gb"}
SHARE_OF = {p.name: p.gpu_fraction for p in MIG_80GB_PROFILES}


def with_mig(snapshot: CycleSnapshot) -> CycleSnapshot:
    """The A100s declare MIG profiles; the workloads are unchanged (the reference)."""
    types = tuple(
        dataclasses.replace(t, partition_profiles=MIG_80GB_PROFILES) if t.name == A100 else t
        for t in snapshot.gpu_types
    )
    return dataclasses.replace(snapshot, gpu_types=types)


def _as_partition(workload: Workload) -> Workload:
    profile = PROFILE_FOR_SHARE[workload.gpus_per_pod]
    return dataclasses.replace(
        workload,
        gpus_per_pod=SHARE_OF[profile],
        partition_profile=profile,
        allowed_gpu_types=(A100,),
        min_gpu_memory_gib=0.0,
    )


def with_partitions_and_cu(snapshot: CycleSnapshot) -> CycleSnapshot:
    """Shared-GPU work on A100s as partitions, one whole-GPU pending workload in ten as CU."""
    running = []
    for allocation in snapshot.running:
        job = allocation.workload
        if allocation.gpu_type == A100 and job.gpus_per_pod in PROFILE_FOR_SHARE:
            job = _as_partition(job)
            bindings = tuple(
                PodBinding(b.pod_index, b.node, b.gpu_indices, job.gpus_per_pod)
                for b in allocation.bindings
            )
            running.append(Allocation(job, bindings, allocation.started_at_s, A100))
        else:
            running.append(allocation)
    pending = []
    for index, waiting in enumerate(snapshot.pending):
        job = waiting
        if job.gpus_per_pod in PROFILE_FOR_SHARE and A100 in (job.allowed_gpu_types or (A100,)):
            job = _as_partition(job)
        elif job.gpus_per_pod >= 1.0 and job.min_pods is None and index % 10 == 0:
            job = dataclasses.replace(
                job, compute_units=job.total_gpus * 4.0, pods=0, gpus_per_pod=0.0, topology=None
            )
        pending.append(job)
    return dataclasses.replace(snapshot, running=tuple(running), pending=tuple(pending))


def count(snapshot: CycleSnapshot) -> str:
    partitions = sum(1 for w in snapshot.pending if w.partition_profile)
    partitions += sum(1 for a in snapshot.running if a.workload.partition_profile)
    cu = sum(1 for w in snapshot.pending if w.compute_units)
    return f"{partitions} partition workloads, {cu} CU requests"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000", help="node counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=7, help="runs of each snapshot")
    args = parser.parse_args()
    print("| nodes | snapshot | median s | median CPU s | binds | evicts | CPU ratio |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for size in (int(s) for s in args.sizes.split(",")):
        reference = with_mig(build_snapshot(size))
        variant = with_partitions_and_cu(reference)
        snapshots = {"plain shares and GPUs": reference, "partitions and CU": variant}
        results = {name: run_cycle(snap) for name, snap in snapshots.items()}  # warm-up
        wall: dict[str, list[float]] = {name: [] for name in snapshots}
        cpu: dict[str, list[float]] = {name: [] for name in snapshots}
        for _ in range(args.repeats):
            for name, snap in snapshots.items():
                started, cpu_started = time.perf_counter(), time.process_time()
                results[name] = run_cycle(snap)
                cpu[name].append(time.process_time() - cpu_started)
                wall[name].append(time.perf_counter() - started)
        base = statistics.median(cpu["plain shares and GPUs"])
        for name in snapshots:
            result = results[name]
            print(
                f"| {size:,} | {name} | {statistics.median(wall[name]):.3f} | "
                f"{statistics.median(cpu[name]):.3f} | {len(result.binds)} | "
                f"{len(result.evicts)} | {statistics.median(cpu[name]) / base:.2f} |",
                flush=True,
            )
        print(f"\n{size:,} nodes, partitions and CU: {count(variant)}")


if __name__ == "__main__":
    main()
