"""A pool's queue tree compiled for the fair-share division, once per configuration (issue 17).

A recompute divides the same tree again and again: the queues, their quotas, weights, limits
and per-type guarantees change only with the configuration, the demands and the history every
time. `FairSharePlan` holds the static part, checked and flattened into tuples indexed by a
queue's position in the tree's pre-order, so that a call reads columns instead of walking
10,000 `Queue` objects and their quota maps:

- the structure: each queue's parent and children (in name order), the sibling groups
  top-down, and the queues children-before-parents;
- each queue's terms in the pool: priority, over-quota weight, age, CU guarantee (per-type
  quotas included, `policy.deserved_cu_with_types`), CU limit, per-type limits and per-type
  guarantees (None where the queue declares none);
- the sibling groups in which a per-type guarantee can arise at all, with only the members
  whose subtree declares one (the others never claim a type).

The plan is a value the caller keeps (pure: `domain/` does no I/O) and passes to
`compute_fair_shares` with each input; an input it does not fit (another pool, policy, GPU
type set or queue list) is divided with a plan compiled for it on the spot, so a stale plan
costs time, never a wrong answer. The queue list is compared by identity first, then by value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpufair.domain.errors import InvalidInputError, Violation
from gpufair.domain.model import FairSharePolicy, GpuType, Queue
from gpufair.domain.policy import (
    deserved_cu_with_types,
    validate_gpu_types,
    validate_policy,
    validate_pool_quotas,
)
from gpufair.domain.tree import QueueTree

TOP = -1  # the parent index of a top-level queue, and the key of the top-level group


@dataclass(frozen=True, slots=True)
class GroupPlan:
    """One sibling group: its parent (`TOP` for the top level) and its members, positions
    `start` to `end` of the plan's columns in name order, with their static numbers in the same
    order, as the division reads them."""

    parent: int
    start: int
    end: int
    names: tuple[str, ...]
    created_at_s: tuple[float, ...]
    deserved_cu: tuple[float, ...]
    over_quota_weights: tuple[float, ...]
    priorities: tuple[int, ...]
    # Positions in the group of each over-quota tier, in the order they are served: weighted
    # queues by priority, highest first, then best effort (weight 0) by priority.
    tiers: tuple[tuple[int, ...], ...]
    # Positions in the group of each priority, highest first, weight 0 included: the tiers of
    # the `kai` division (`kai_division.kai_over_quota`).
    priority_tiers: tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True, eq=False)
class FairSharePlan:
    """The static part of one pool's division (module docstring). Build it with `compile`.

    Queues are numbered group by group: the top-level queues first, then the children of each
    parent in the tree's pre-order, siblings in name order. A group's members are therefore
    contiguous (its numbers are read and written as slices) and every parent's number is below
    its children's, so descending numbers visit children before parents.
    """

    pool: str
    policy: FairSharePolicy
    gpu_types: Mapping[str, GpuType]
    queues: tuple[Queue, ...]
    compute_weights: Mapping[str, float]
    names: tuple[str, ...]  # by number
    index: Mapping[str, int]  # name → number
    preorder: tuple[int, ...]  # parents before children, siblings in name order: result order
    parents: tuple[int, ...]  # TOP for a top-level queue
    children: tuple[tuple[int, ...] | None, ...]  # None for a leaf
    # Each leaf's (number, name, per-type limits, per-type guarantees, CU limit).
    leaves: tuple[
        tuple[int, str, Mapping[str, float] | None, Mapping[str, float] | None, float | None],
        ...,
    ]
    inner_postorder: tuple[int, ...]  # inner queues, children before parents
    groups: tuple[GroupPlan, ...]  # top-down: the top level, then each parent in pre-order
    typed_groups: tuple[tuple[int, tuple[int, ...]], ...]  # (parent, members that may claim)
    priorities: tuple[int, ...]
    over_quota_weights: tuple[float, ...]
    created_at_s: tuple[float, ...]
    deserved_cu: tuple[float, ...]
    limit_cu: tuple[float | None, ...]
    limit_gpus_by_type: tuple[Mapping[str, float] | None, ...]
    deserved_gpus_by_type: tuple[Mapping[str, float] | None, ...]
    # The same terms as arrays, for the demand pass on columns (`fairshare_aggregate`): the
    # pool's GPU types in `gpu_types` order (a column each), their CU per GPU, every queue's
    # per-type limits (inf where none) and CU limit (inf where None).
    type_names: tuple[str, ...]
    type_cu: np.ndarray
    type_limit_array: np.ndarray  # (queues, types)
    limit_cu_array: np.ndarray  # (queues,)
    leaf_names: tuple[str, ...]  # the leaves in plan order: `LeafDemands`' rows
    leaf_numbers: np.ndarray  # each leaf's number
    inner_levels: tuple[InnerLevel, ...]  # inner queues by height, lowest first
    typed_leaves: tuple[int, ...]  # leaves declaring a per-type guarantee
    typed_inner: tuple[int, ...]  # inner queues whose subtree declares one, children first

    @classmethod
    def compile(
        cls,
        pool: str,
        policy: FairSharePolicy,
        gpu_types: Mapping[str, GpuType],
        queues: Sequence[Queue],
    ) -> FairSharePlan:
        """Check and flatten one pool's configuration; raises `InvalidInputError` for an invalid
        policy, GPU type, quota or tree, with the messages `compute_fair_shares` gives."""
        violations = static_violations(pool, policy, gpu_types, queues)
        if violations:
            raise InvalidInputError(violations)
        return cls.compile_checked(pool, policy, gpu_types, queues)

    @classmethod
    def compile_checked(
        cls,
        pool: str,
        policy: FairSharePolicy,
        gpu_types: Mapping[str, GpuType],
        queues: Sequence[Queue],
    ) -> FairSharePlan:
        """`compile` for a configuration whose `static_violations` are known to be none (the
        tree is still checked)."""
        queue_tuple = tuple(queues)
        tree = QueueTree.build(queue_tuple)
        compute_weights = {name: t.compute_weight for name, t in gpu_types.items()}
        group_keys = [None, *(name for name in tree.preorder if name in tree.children)]
        names = tuple(name for key in group_keys for name in tree.children_of(key))
        index = {name: i for i, name in enumerate(names)}
        quotas = [
            tree.queues[name].quotas.get(pool) or tree.queues[name].quota(pool) for name in names
        ]
        deserved_cu = tuple(
            deserved_cu_with_types(quota, compute_weights)
            if quota.deserved_gpus_by_type
            else quota.deserved_cu
            for quota in quotas
        )
        parent_names = [tree.queues[name].parent for name in names]
        parents = tuple(TOP if parent is None else index[parent] for parent in parent_names)
        children = tuple(
            None if name not in tree.children else tuple(index[k] for k in tree.children[name])
            for name in names
        )
        created = tuple(tree.queues[name].created_at_s for name in names)
        priorities = tuple(q.priority for q in quotas)
        weights = tuple(q.over_quota_weight for q in quotas)
        limit_cu = tuple(q.limit_cu for q in quotas)
        type_limits = tuple(q.limit_gpus_by_type or None for q in quotas)
        deserved_by_type = tuple(q.deserved_gpus_by_type or None for q in quotas)
        count = len(names)
        # Which queues' subtrees declare a per-type guarantee: only they can claim a type.
        typed = [bool(q.deserved_gpus_by_type) for q in quotas]
        for i in range(count - 1, -1, -1):
            if typed[i] and parents[i] != TOP:
                typed[parents[i]] = True
        groups: list[GroupPlan] = []
        typed_groups: list[tuple[int, tuple[int, ...]]] = []
        start = 0
        for key in group_keys:
            end = start + len(tree.children_of(key))
            members = range(start, end)
            group_weights = tuple(weights[i] for i in members)
            group_priorities = tuple(priorities[i] for i in members)
            groups.append(
                GroupPlan(
                    parent=TOP if key is None else index[key],
                    start=start,
                    end=end,
                    names=names[start:end],
                    created_at_s=created[start:end],
                    deserved_cu=deserved_cu[start:end],
                    over_quota_weights=group_weights,
                    priorities=group_priorities,
                    tiers=_tiers(group_weights, group_priorities),
                    priority_tiers=_priority_tiers(group_priorities),
                )
            )
            claiming = tuple(i for i in members if typed[i])
            if claiming:
                typed_groups.append((TOP if key is None else index[key], claiming))
            start = end
        type_names = tuple(gpu_types)
        leaf_list = [i for i in range(count) if children[i] is None]
        return cls(
            pool=pool,
            policy=policy,
            gpu_types=dict(gpu_types),
            queues=queue_tuple,
            compute_weights=compute_weights,
            names=names,
            index=index,
            preorder=tuple(index[name] for name in tree.preorder),
            parents=parents,
            children=children,
            leaves=tuple(
                (i, names[i], type_limits[i], deserved_by_type[i], limit_cu[i])
                for i in range(count)
                if children[i] is None
            ),
            inner_postorder=tuple(i for i in range(count - 1, -1, -1) if children[i] is not None),
            groups=tuple(groups),
            typed_groups=tuple(typed_groups),
            priorities=priorities,
            over_quota_weights=weights,
            created_at_s=created,
            deserved_cu=deserved_cu,
            limit_cu=limit_cu,
            limit_gpus_by_type=type_limits,
            deserved_gpus_by_type=deserved_by_type,
            type_names=type_names,
            type_cu=np.array([compute_weights[t] for t in type_names], dtype=float),
            type_limit_array=np.array(
                [[(lim or {}).get(t, np.inf) for t in type_names] for lim in type_limits],
                dtype=float,
            ).reshape(count, len(type_names)),
            limit_cu_array=np.array(
                [np.inf if lim is None else lim for lim in limit_cu], dtype=float
            ),
            leaf_names=tuple(names[i] for i in leaf_list),
            leaf_numbers=np.array(leaf_list, dtype=np.intp),
            inner_levels=_inner_levels(children),
            typed_leaves=tuple(i for i in leaf_list if deserved_by_type[i]),
            typed_inner=tuple(
                i for i in range(count - 1, -1, -1) if children[i] is not None and typed[i]
            ),
        )

    def fits(
        self,
        pool: str,
        policy: FairSharePolicy,
        gpu_types: Mapping[str, GpuType],
        queues: Sequence[Queue],
    ) -> bool:
        """True if this plan was compiled from this configuration (equal values)."""
        if self.pool != pool or self.policy != policy or self.gpu_types != gpu_types:
            return False
        if queues is self.queues:
            return True
        # Tuple equality compares identical queues by identity first: the common case of a
        # caller that rebuilt the list from the same queue objects stays cheap.
        return len(queues) == len(self.queues) and tuple(queues) == self.queues


LONG_GROUP = 32  # children beyond which a group's sums run on its own (`InnerLevel.long`)


@dataclass(frozen=True, slots=True, eq=False)
class InnerLevel:
    """Inner queues of one height (1: every child a leaf; h: children below h, one at h - 1),
    whose sums over their children can run side by side once the lower heights are done.

    Each queue's children are the contiguous numbers `start .. start + size`. The queues with at
    most `LONG_GROUP` children are ordered by size, largest first, so that the queues with more
    than k children are the first `live[k]` (sums go child by child, in name order, across all
    of them at once); larger groups are listed in `long` and summed one by one.
    """

    parents: np.ndarray  # the short groups' queue numbers, largest group first
    starts: np.ndarray  # their first child's number
    live: tuple[int, ...]  # live[k]: how many of them have more than k children
    long: tuple[tuple[int, int, int], ...]  # (queue, first child, children) of larger groups


def _inner_levels(children: tuple[tuple[int, ...] | None, ...]) -> tuple[InnerLevel, ...]:
    height = [0] * len(children)
    for i in range(len(children) - 1, -1, -1):  # children (higher numbers) first
        kids = children[i]
        if kids is not None:
            height[i] = 1 + max(height[k] for k in kids)
    levels = []
    for h in range(1, max(height, default=0) + 1):
        members = [i for i in range(len(children)) if height[i] == h]
        short = [i for i in members if len(children[i] or ()) <= LONG_GROUP]
        short.sort(key=lambda i: -len(children[i] or ()))
        sizes = [len(children[i] or ()) for i in short]
        levels.append(
            InnerLevel(
                parents=np.array(short, dtype=np.intp),
                starts=np.array([(children[i] or (0,))[0] for i in short], dtype=np.intp),
                live=tuple(sum(1 for n in sizes if n > k) for k in range(max(sizes, default=0))),
                long=tuple(
                    (i, (children[i] or (0,))[0], len(children[i] or ()))
                    for i in members
                    if len(children[i] or ()) > LONG_GROUP
                ),
            )
        )
    return tuple(levels)


def _priority_tiers(priorities: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """A group's positions by priority, highest first (`GroupPlan.priority_tiers`)."""
    by_priority: dict[int, list[int]] = {}
    for j, priority in enumerate(priorities):
        by_priority.setdefault(priority, []).append(j)
    return tuple(tuple(by_priority[p]) for p in sorted(by_priority, reverse=True))


def _tiers(weights: tuple[float, ...], priorities: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """A group's over-quota tiers in serving order (`GroupPlan.tiers`)."""
    tiers: list[tuple[int, ...]] = []
    for best_effort in (False, True):
        by_priority: dict[int, list[int]] = {}
        for j, weight in enumerate(weights):
            if (weight <= 0.0) is best_effort:
                by_priority.setdefault(priorities[j], []).append(j)
        tiers.extend(tuple(by_priority[p]) for p in sorted(by_priority, reverse=True))
    return tuple(tiers)


def static_violations(
    pool: str,
    policy: FairSharePolicy,
    gpu_types: Mapping[str, GpuType],
    queues: Sequence[Queue],
) -> list[Violation]:
    """What is wrong with a pool's policy, GPU types and quotas (the tree is checked by
    `QueueTree.build`)."""
    return [*type_violations(policy, gpu_types), *quota_violations(pool, policy, gpu_types, queues)]


def type_violations(policy: FairSharePolicy, gpu_types: Mapping[str, GpuType]) -> list[Violation]:
    """What is wrong with a pool's policy and GPU types."""
    violations = [Violation(f"policy.{v.field_path}", v.message) for v in validate_policy(policy)]
    violations.extend(
        Violation(f"gpu_types{v.field_path}", v.message)
        for v in validate_gpu_types(list(gpu_types.values()))
    )
    for key, gpu_type in gpu_types.items():
        if key != gpu_type.name:
            violations.append(Violation(f'gpu_types["{key}"]', f"is named {gpu_type.name!r}"))
    return violations


def quota_violations(
    pool: str,
    policy: FairSharePolicy,
    gpu_types: Mapping[str, GpuType],
    queues: Sequence[Queue],
) -> list[Violation]:
    """What is wrong with the queues' terms in the pool."""
    return [
        Violation(f"queues{v.field_path}", v.message)
        for v in validate_pool_quotas(queues, pool, gpu_types=gpu_types)
    ]
