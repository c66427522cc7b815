"""Validation of fair-share policies, GPU types and queue trees, written once.

Every function returns a list of `Violation(field_path, message)`; an empty list means valid.
Paths are relative to the object passed in, so the API layer only prefixes its own location:
`validate_policy` yields `half_life_s`, which the API turns into `pools[2].policy.half_life_s`;
functions that take a sequence start their paths with the index, `[3].parent`, and map keys are
written `quotas["pool-a"].deserved_cu`.

The fair-share engine calls the same functions and raises `InvalidInputError` rather than divide
capacity under a policy or tree it cannot make sense of.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Mapping, Sequence

from gpufair.domain.errors import Violation
from gpufair.domain.model import (
    Division,
    FairSharePolicy,
    GpuType,
    NodePool,
    Queue,
    QueueQuota,
    Rounding,
    UsageBasis,
    WindowKind,
)


def _finite(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, int) and not isinstance(value, bool)


# The checks take the path in two parts and join them only on failure: validation runs on every
# fair-share computation, over every queue, and valid input should cost no string building.


def _check_non_negative(prefix: str, name: str, value: object, out: list[Violation]) -> bool:
    if not _finite(value):
        out.append(Violation(prefix + name, f"must be a finite number, got {value!r}"))
        return False
    if value < 0:  # type: ignore[operator]
        out.append(Violation(prefix + name, f"must be ≥ 0, got {value!r}"))
        return False
    return True


def _check_positive(prefix: str, name: str, value: object, out: list[Violation]) -> bool:
    if not _finite(value):
        out.append(Violation(prefix + name, f"must be a finite number, got {value!r}"))
        return False
    if value <= 0:  # type: ignore[operator]
        out.append(Violation(prefix + name, f"must be > 0, got {value!r}"))
        return False
    return True


def _check_enum(
    path: str, value: object, enum_type: type[enum.StrEnum], out: list[Violation]
) -> None:
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        enum_type(value)
    except ValueError:
        known = ", ".join(member.value for member in enum_type)
        out.append(Violation(path, f"unknown value {value!r}; expected one of: {known}"))


def validate_policy(policy: FairSharePolicy) -> list[Violation]:
    """Check one pool's fair-share policy (DESIGN §2, §3.3).

    Rules: `k` ≥ 0; `half_life_s` is None (off) or > 0; a sliding or tumbling window has
    `window_s` > 0 and at least one half-life long (a shorter window would cut the decay off
    before it has any effect, which is almost always a typo of units); a tumbling window has a
    finite anchor; `recompute_interval_s` > 0; `dead_band` in [0, 1), since it applies to
    normalised weights and a band of 1 would freeze them forever; enums hold known values.
    """
    out: list[Violation] = []
    _check_enum("window_kind", policy.window_kind, WindowKind, out)
    _check_enum("usage_basis", policy.usage_basis, UsageBasis, out)
    _check_enum("rounding", policy.rounding, Rounding, out)
    _check_enum("division", policy.division, Division, out)
    _check_non_negative("", "k", policy.k, out)
    half_life_ok = policy.half_life_s is None or _check_positive(
        "", "half_life_s", policy.half_life_s, out
    )
    if policy.window_kind in (WindowKind.SLIDING, WindowKind.TUMBLING):
        window_ok = _check_positive("", "window_s", policy.window_s, out)
        if (
            window_ok
            and half_life_ok
            and policy.half_life_s is not None
            and policy.window_s < policy.half_life_s
        ):
            out.append(
                Violation(
                    "window_s",
                    f"must be ≥ half_life_s ({policy.half_life_s} s), got {policy.window_s} s",
                )
            )
    if policy.window_kind == WindowKind.TUMBLING and not _finite(policy.window_anchor_unix_s):
        out.append(
            Violation(
                "window_anchor_unix_s",
                f"must be a finite number, got {policy.window_anchor_unix_s!r}",
            )
        )
    _check_positive("", "recompute_interval_s", policy.recompute_interval_s, out)
    if _check_non_negative("", "dead_band", policy.dead_band, out) and policy.dead_band >= 1:
        out.append(Violation("dead_band", f"must be < 1, got {policy.dead_band!r}"))
    return out


def validate_gpu_types(gpu_types: Sequence[GpuType]) -> list[Violation]:
    """Check GPU types: unique non-empty names, memory ≥ 0, compute weight > 0."""
    out: list[Violation] = []
    seen: set[str] = set()
    for index, gpu_type in enumerate(gpu_types):
        prefix = f"[{index}]."
        if not gpu_type.name:
            out.append(Violation(prefix + "name", "must not be empty"))
        elif gpu_type.name in seen:
            out.append(Violation(prefix + "name", f"duplicate GPU type {gpu_type.name!r}"))
        seen.add(gpu_type.name)
        _check_non_negative(prefix, "memory_gib", gpu_type.memory_gib, out)
        _check_positive(prefix, "compute_weight", gpu_type.compute_weight, out)
    return out


def max_borrow_s(quota: QueueQuota, pool: NodePool) -> float | None:
    """How long a queue's work beyond its fair share may run before it may be reclaimed even
    ahead of its `min_runtime_s`: the queue's own `max_borrow_s` in the pool, else the pool's;
    None: no limit."""
    return quota.max_borrow_s if quota.max_borrow_s is not None else pool.max_borrow_s


def deserved_cu_with_types(quota: QueueQuota, compute_weights: Mapping[str, float]) -> float:
    """The CU a quota guarantees: `deserved_cu`, raised to cover its per-type guarantees.

    A queue may state its guarantee only per type ("8 A100s"); those GPUs are worth their CU,
    so the CU guarantee is never below Σ_t deserved_gpus_by_type[t] · compute_weight(t).
    Types missing from `compute_weights` count 0 (they are not in the pool).
    """
    if not quota.deserved_gpus_by_type:
        return quota.deserved_cu
    by_type_cu = sum(
        gpus * compute_weights.get(type_name, 0.0)
        for type_name, gpus in quota.deserved_gpus_by_type.items()
    )
    return max(quota.deserved_cu, by_type_cu)


def _validate_quota(
    path: str,
    key: str,
    quota: QueueQuota,
    *,
    pools: Collection[str] | None,
    compute_weights: Mapping[str, float] | None,
    out: list[Violation],
) -> None:
    if quota.pool != key:
        out.append(Violation(path + ".pool", f"is {quota.pool!r} but the quota is keyed {key!r}"))
    if pools is not None and key not in pools:
        out.append(Violation(path, f"unknown node pool {key!r}"))
    _check_non_negative(path, ".deserved_cu", quota.deserved_cu, out)
    _check_non_negative(path, ".over_quota_weight", quota.over_quota_weight, out)
    if quota.limit_cu is not None:
        _check_non_negative(path, ".limit_cu", quota.limit_cu, out)
    for field_name, by_type in (
        ("deserved_gpus_by_type", quota.deserved_gpus_by_type),
        ("limit_gpus_by_type", quota.limit_gpus_by_type),
    ):
        for type_name, gpus in by_type.items():
            type_key = f'.{field_name}["{type_name}"]'
            if compute_weights is not None and type_name not in compute_weights:
                out.append(Violation(path + type_key, f"unknown GPU type {type_name!r}"))
            _check_non_negative(path, type_key, gpus, out)


_NUMBER = (float, int)


def _plainly_valid(quota: QueueQuota, key: str) -> bool:
    """True for the common quota that `_validate_quota` would pass: keyed right, no per-type
    maps, finite numbers ≥ 0. Anything else takes the full check, which also writes the
    messages. Runs on every fair-share computation, so
    the common case costs a few comparisons, not a list of checks."""
    if quota.pool != key or quota.deserved_gpus_by_type or quota.limit_gpus_by_type:
        return False
    deserved, weight, limit = quota.deserved_cu, quota.over_quota_weight, quota.limit_cu
    if type(deserved) not in _NUMBER or type(weight) not in _NUMBER:
        return False
    if not (0.0 <= deserved < math.inf and 0.0 <= weight < math.inf):
        return False
    if limit is None:
        return True
    return type(limit) in _NUMBER and 0.0 <= limit < math.inf


def validate_pool_quotas(
    queues: Sequence[Queue],
    pool: str,
    *,
    gpu_types: Mapping[str, GpuType] | None = None,
) -> list[Violation]:
    """Check every queue's terms in one pool; paths `[3].quotas["pool"].limit_cu`.

    A limit may be below the deserved quota it bounds: the guarantee is
    min(deserved, demand, limit) (DESIGN §3.1), so the limit caps it.
    """
    out: list[Violation] = []
    compute_weights = (
        None if gpu_types is None else {name: t.compute_weight for name, t in gpu_types.items()}
    )
    for index, queue in enumerate(queues):
        quota = queue.quotas.get(pool)
        if quota is not None and not _plainly_valid(quota, pool):
            path = f'[{index}].quotas["{pool}"]'
            _validate_quota(
                path,
                pool,
                quota,
                pools=None,
                compute_weights=compute_weights,
                out=out,
            )
    return out


def validate_queue(
    queue: Queue,
    *,
    pools: Collection[str] | None = None,
    gpu_types: Mapping[str, GpuType] | None = None,
) -> list[Violation]:
    """Check one queue on its own: name, parent, numbers in every quota.

    With `pools` or `gpu_types` given, quotas naming an unknown pool or GPU type are violations
    too. Quotas: every number finite and ≥ 0; limits (CU and per type) at least the deserved
    amount they bound.
    """
    out: list[Violation] = []
    if not queue.name:
        out.append(Violation("name", "must not be empty"))
    if queue.parent is not None and queue.parent == queue.name:
        out.append(Violation("parent", "a queue cannot be its own parent"))
    if not _finite(queue.created_at_s):
        out.append(
            Violation("created_at_s", f"must be a finite number, got {queue.created_at_s!r}")
        )
    compute_weights = (
        None if gpu_types is None else {name: t.compute_weight for name, t in gpu_types.items()}
    )
    for key, quota in queue.quotas.items():
        _validate_quota(
            f'quotas["{key}"]', key, quota, pools=pools, compute_weights=compute_weights, out=out
        )
    return out


def queue_structure_violations(queues: Sequence[Queue]) -> list[Violation]:
    """Duplicate names, unknown parents and cycles: what makes a list of queues not a forest."""
    out: list[Violation] = []
    index_by_name: dict[str, int] = {}
    for index, queue in enumerate(queues):
        if queue.name in index_by_name:
            out.append(Violation(f"[{index}].name", f"duplicate queue name {queue.name[:80]!r}"))
        else:
            index_by_name[queue.name] = index
    for index, queue in enumerate(queues):
        if queue.parent is not None and queue.parent not in index_by_name:
            out.append(
                Violation(f"[{index}].parent", f"unknown parent queue {queue.parent[:80]!r}")
            )
    # Follow each parent chain once; a chain that comes back to a queue still on the current
    # path is a cycle. Every queue on it is reported, so a user sees the whole loop.
    parent_of = {q.name: q.parent for q in queues}
    state: dict[str, int] = {}  # 1: on the current path, 2: known to reach a root
    for queue in queues:
        path: list[str] = []
        name: str | None = queue.name
        while name is not None and name in parent_of and state.get(name) is None:
            state[name] = 1
            path.append(name)
            name = parent_of[name]
        if name is not None and state.get(name) == 1:
            cycle = path[path.index(name) :]
            shown = cycle if len(cycle) <= 8 else [*cycle[:4], f"… {len(cycle) - 5} more …"]
            message = f"queue tree has a cycle: {' → '.join([*shown, name])}"  # built once
            out.extend(
                Violation(f"[{index}].parent", message)
                for index in sorted(index_by_name[member] for member in cycle)
            )
        for member in path:
            state[member] = 2
    return out


def quota_nesting_violations(
    queues: Sequence[Queue], *, gpu_types: Mapping[str, GpuType] | None = None
) -> list[Violation]:
    """Children whose deserved quotas add up to more than their parent's, per pool.

    Siblings divide what their parent received (DESIGN §3), so a parent guaranteed less than
    its children's sum cannot keep all their guarantees. The engine still divides such a tree
    (the guarantees are scaled down in proportion), but a configuration should not promise it.
    Per-type guarantees count through `deserved_cu_with_types`. Structural problems are left
    to `queue_structure_violations`.
    """
    compute_weights = (
        {} if gpu_types is None else {name: t.compute_weight for name, t in gpu_types.items()}
    )
    index_by_name = {q.name: i for i, q in enumerate(queues)}
    children_deserved: dict[tuple[str, str], float] = {}
    for queue in queues:
        if queue.parent is None or queue.parent not in index_by_name:
            continue
        for pool, quota in queue.quotas.items():
            key = (queue.parent, pool)
            deserved = deserved_cu_with_types(quota, compute_weights)
            children_deserved[key] = children_deserved.get(key, 0.0) + deserved
    out: list[Violation] = []
    for (parent, pool), total in children_deserved.items():
        parent_queue = queues[index_by_name[parent]]
        own = deserved_cu_with_types(parent_queue.quota(pool), compute_weights)
        if total > own * (1 + 1e-12):
            out.append(
                Violation(
                    f'[{index_by_name[parent]}].quotas["{pool}"].deserved_cu',
                    f"children's deserved quotas in pool {pool!r} add up to {total} CU, "
                    f"more than this queue's {own} CU",
                )
            )
    return out


def validate_queues(
    queues: Sequence[Queue],
    *,
    pools: Collection[str] | None = None,
    gpu_types: Mapping[str, GpuType] | None = None,
) -> list[Violation]:
    """Everything about a queue list: each queue, the tree's shape and quota nesting."""
    out: list[Violation] = []
    for index, queue in enumerate(queues):
        out.extend(
            Violation(f"[{index}].{v.field_path}", v.message)
            for v in validate_queue(queue, pools=pools, gpu_types=gpu_types)
        )
    structure = queue_structure_violations(queues)
    out.extend(structure)
    if not structure:
        out.extend(quota_nesting_violations(queues, gpu_types=gpu_types))
    return out
