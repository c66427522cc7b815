"""When the topology is why a gang waits: the sentence `gpufair explain` shows.

A gang with a required `TopologyConstraint` that does not fit may wait for either of two
reasons: the pool is full, or the pool has room but no domain of the allowed levels does. In the
second case the pending message says so, naming the levels tried and the most pods any domain of
the bounding level could take now. Asked only of workloads with a required constraint that ended
the cycle without capacity, once per workload kind, on the capacity as the cycle left it.
"""

from __future__ import annotations

from gpufair.domain.capacity import Capacity
from gpufair.domain.model import PlacementStrategy, Workload
from gpufair.domain.placement import place
from gpufair.domain.placement_ask import Ask, Exclusion, PodShape
from gpufair.domain.placement_fit import pods_fit
from gpufair.domain.topology import ladder


def topology_note(
    capacity: Capacity,
    workload: Workload,
    types: tuple[str, ...],
    pool_levels: tuple[str, ...],
    strategy: PlacementStrategy,
) -> str:
    """ "; …" naming the topology when it alone keeps `workload` out, else ""."""
    steps = ladder(pool_levels, workload.topology)
    if not steps.bounded:
        return ""
    shape = PodShape.of(workload)
    pods = workload.gang_min_pods
    unbounded = Exclusion()
    for gpu_type in types:
        ask = Ask(shape, gpu_type, pods, pods)
        if place(capacity, ask, strategy, unbounded) is None:
            continue
        level = steps.levels[-1]
        best = max(
            (
                sum(pods_fit(capacity.nodes[index], shape) for index in members)
                for members in capacity.domains(level).get(gpu_type, {}).values()
            ),
            default=0,
        )
        tried = " → ".join(steps.levels)
        return (
            f"; the pool has room for {pods} pods of {workload.gpus_per_pod:g} GPU on "
            f"{gpu_type}, but the topology keeps it out: no domain of {tried} holds them "
            f"(required {level}; the roomiest {level} domain takes {best} now)"
        )
    return ""
