"""A pool's decayed usage kept up to date as the simulation runs: the `usage.UsageInputs` that
`usage.usage_inputs` gives over the pool's whole allocation history, at a cost per recompute that
does not grow with that history.

`usage_inputs` integrates, for each queue q, x_q(t) = max(0, a_q(t) - deserved_q) under the
`over_quota` basis (a_q(t) itself under `total`), where a_q is the CU the queue holds (an inner
queue: its children's sum); for each inner group p, max(0, a_p(t) - Σ deserved of p's children);
for the top level, max(0, capacity - Σ top-level deserved). Each of these step functions changes
only when a queue's allocation does, so each is kept in a `usage.RunningIntegral`, fed at every
change and read at a recompute over the window of that instant. The pool's capacity is constant
through a run (its ready nodes, from 0 s), so the top level's part is one closed-form integral.
Deserved quotas are the configuration's, which a run does not change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from gpufair.domain.model import FairSharePolicy, GpuType, Queue, UsageBasis, WindowKind
from gpufair.domain.policy import deserved_cu_with_types
from gpufair.domain.tree import QueueTree
from gpufair.domain.usage import (
    RunningIntegral,
    UsageInputs,
    decayed_segment_integral,
    window_bounds,
)


class PoolUsage:
    """The running integrals of one pool (module docstring). `set(at_s, queue, cu)` whenever a
    queue's allocation changes (leaves and inner queues alike); `inputs(now_s)` at a recompute."""

    __slots__ = (
        "_capacity_cu",
        "_group_over",
        "_groups",
        "_policy",
        "_top_over_cu",
        "_tree",
        "_usage",
        "_usage_over",
    )

    def __init__(
        self,
        pool: str,
        policy: FairSharePolicy,
        queues: Sequence[Queue],
        gpu_types: Mapping[str, GpuType],
        capacity_cu: float,
    ) -> None:
        tree = QueueTree.build(queues)
        self._tree = tree
        self._policy = policy
        self._capacity_cu = capacity_cu
        half_life_s = policy.half_life_s
        windowed = policy.window_kind is not WindowKind.NONE
        self._usage = {
            name: RunningIntegral(half_life_s, windowed=windowed) for name in tree.postorder()
        }
        self._groups: dict[str, RunningIntegral] = {}
        self._usage_over: dict[str, float] = dict.fromkeys(tree.queues, 0.0)
        self._group_over: dict[str, float] = {}
        self._top_over_cu = capacity_cu
        if policy.usage_basis == UsageBasis.TOTAL:
            return
        weights = {name: t.compute_weight for name, t in gpu_types.items()}
        deserved = {
            name: deserved_cu_with_types(queue.quota(pool), weights)
            for name, queue in tree.queues.items()
        }
        self._usage_over = deserved
        for group in tree.inner_groups():
            children_deserved = math.fsum(deserved[c] for c in tree.children_of(group))
            if group is None:
                self._top_over_cu = max(0.0, capacity_cu - children_deserved)
            else:
                self._groups[group] = RunningIntegral(half_life_s, windowed=windowed)
                self._group_over[group] = children_deserved

    def set(self, at_s: float, queue: str, cu: float) -> None:
        """`queue` holds `cu` CU from `at_s` on."""
        self._usage[queue].set(at_s, max(0.0, cu - self._usage_over[queue]))
        group = self._groups.get(queue)
        if group is not None:
            group.set(at_s, max(0.0, cu - self._group_over[queue]))

    def inputs(self, now_s: float) -> UsageInputs:
        """What `usage_inputs` gives at `now_s` over the history fed so far (module docstring);
        `now_s` never before the latest change, nor before the latest call's."""
        policy = self._policy
        lo_s, _ = window_bounds(now_s, policy)
        usage = {name: running.read(now_s, lo_s) for name, running in self._usage.items()}
        top_cu_s = 0.0
        start_s = max(0.0, lo_s)
        if self._capacity_cu > 0.0 and start_s < now_s:
            top_cu_s = decayed_segment_integral(
                start_s, now_s, self._top_over_cu, now_s, policy.half_life_s
            )
        capacity: dict[str | None, float] = {}
        for group in self._tree.inner_groups():
            if group is None or policy.usage_basis == UsageBasis.TOTAL:
                capacity[group] = top_cu_s
            else:
                capacity[group] = self._groups[group].read(now_s, lo_s)
        return UsageInputs(usage_cu_s=usage, group_capacity_cu_s=capacity)
