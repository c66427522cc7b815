"""Workloads that ask for an amount of compute (`Workload.compute_units`) instead of GPUs.

A request of `C` CU is served by whole GPUs of one type `t` (weight `w_t` CU per GPU):

    gpus_t = ceil(C / w_t)       rounded up to whole pods of `gpus_per_pod` (default 1)
    given_t = gpus_t × w_t       the CU actually given, never less than C

**Cheapest adequate first.** The options are the pool's types that pass the workload's filters
(`allowed_gpu_types`, `min_gpu_memory_gib` per whole GPU), ordered by `given_t` (the least
compute charged to the queue), then by the usual type order (lower weight, less memory, name).
20 CU on a pool of A100 (10 CU), V100 (4 CU) and RTX 4090 (2 CU) is 10 × RTX 4090, 5 × V100 or
2 × A100 at 20 CU each: the RTX 4090 is first. 6 CU is 3 × RTX 4090 (6) before 2 × V100 (8) and
1 × A100 (10).

**A mix of types** (`mixed_gpu_types`, with a `topology` level): when the single-type gang does
not fit, `cycle_cu_mix` looks for GPUs of several accepted types inside one domain of that level.
`mix` picks them: the largest GPUs first while they do not overshoot, then the one GPU that
covers the rest with the least CU (20 CU from 1 free A100 and 6 free RTX 4090s: 1 × A100 +
5 × RTX 4090). The domain giving the least CU wins, then the fewest GPUs, then its name.

**When it is decided.** Each cycle turns the request into a concrete workload before it is
queued (`cycle_load`): the first option that the queue's limits allow (its `limit_cu`, its
`limit_gpus_by_type` and those of the queues above it) and whose type has `gpus_t` untouched GPUs
free when the cycle starts (less those the requests resolved before it in the same cycle chose,
in snapshot order); else the first option the limits allow and the pool could ever hold (so
reclaim works for it on that type); else the first the pool could hold; else the first option
(then the workload never fits, with the reason of its cheapest option). From there it is
an ordinary gang of `gpus_t / gpus_per_pod` pods on type `t`: fair share, limits, reclaim and
preemption see exactly that, and the bind (gpu_type, pods, cu) says what was chosen. The ledger
counts what runs, so usage is the CU given.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from gpufair.domain.capacity import EPS
from gpufair.domain.model import GpuType, Workload


@dataclass(frozen=True, slots=True)
class Option:
    """One way to serve a CU request: `pods` pods of `gpus_per_pod` GPUs of `gpu_type`."""

    gpu_type: str
    pods: int
    gpus_per_pod: float
    given_cu: float

    @property
    def gpus(self) -> float:
        return self.pods * self.gpus_per_pod


def pod_gpus(workload: Workload) -> float:
    """GPUs per pod of a CU request: as given when whole, else one."""
    return workload.gpus_per_pod if workload.gpus_per_pod >= 1.0 else 1.0


def options(
    workload: Workload, gpu_types: Mapping[str, GpuType], present: Collection[str]
) -> list[Option]:
    """The ways to serve `workload`'s CU request in a pool with types `present`, best first."""
    allowed = workload.allowed_gpu_types or tuple(present)
    per_pod = pod_gpus(workload)
    found: list[tuple[tuple[float, float, float, str], Option]] = []
    for name in set(allowed):
        gpu_type = gpu_types.get(name)
        if name not in present or gpu_type is None or gpu_type.compute_weight <= 0.0:
            continue
        if gpu_type.memory_gib < workload.min_gpu_memory_gib - EPS:
            continue
        gpus = math.ceil(workload.compute_units / gpu_type.compute_weight - EPS)
        pods = max(1, math.ceil(gpus / per_pod - EPS))
        given = pods * per_pod * gpu_type.compute_weight
        key = (round(given, 9), gpu_type.compute_weight, gpu_type.memory_gib, name)
        found.append((key, Option(name, pods, per_pod, given)))
    found.sort(key=lambda pair: pair[0])
    return [option for _, option in found]


def concrete(workload: Workload, option: Option) -> Workload:
    """The ordinary gang that serves `workload` by `option` (same uid, queue and limits); it
    asks for GPUs, no longer for CU."""
    return dataclasses.replace(
        workload,
        pods=option.pods,
        gpus_per_pod=option.gpus_per_pod,
        min_pods=None,
        allowed_gpu_types=(option.gpu_type,),
        compute_units=0.0,
    )


def describe(option: Option) -> str:
    """E.g. `2 × a100 (1 GPU each) = 20 CU`."""
    each = "" if option.gpus_per_pod == 1.0 else f" of {option.gpus_per_pod:g} GPUs"
    return f"{option.pods} × {option.gpu_type}{each} = {option.given_cu:g} CU"


def mix(
    compute_units: float, free: Mapping[str, int], weights: Mapping[str, float]
) -> dict[str, int] | None:
    """GPUs per type, from `free` GPUs per type, giving at least `compute_units` CU (see the
    module docstring); None when all of them together give less."""
    order = sorted((t for t in free if weights.get(t, 0.0) > 0.0), key=lambda t: (-weights[t], t))
    taken: dict[str, int] = {}
    remaining = compute_units
    for name in order:
        count = min(free[name], math.floor((remaining + EPS) / weights[name]))
        if count > 0:
            taken[name] = count
            remaining -= count * weights[name]
    while remaining > EPS:
        spare = [t for t in order if free[t] > taken.get(t, 0)]
        if not spare:
            return None
        covering = [t for t in spare if weights[t] >= remaining - EPS]
        name = min(covering, key=lambda t: (weights[t], t)) if covering else spare[0]
        taken[name] = taken.get(name, 0) + 1
        remaining -= weights[name]
    return taken
