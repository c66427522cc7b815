"""What makes a declared cluster valid, and what is merely worth a warning.

Every problem is reported at once with the path of the field in the request, so that an operator
fixes a broken config in one round trip instead of one error at a time.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

from gpufair.domain.errors import Violation
from gpufair.domain.model import (
    ClusterConfig,
    Node,
    NodePool,
    Queue,
    QueueQuota,
    WindowKind,
)
from gpufair.domain.policy import queue_structure_violations, validate_policy

NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
NODE_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$")
LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?$")
MAX_LABEL_VALUE_LEN = 253
MAX_QUEUE_DEPTH = 16
MAX_GPUS_PER_NODE = 1024


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _check_name(path: str, name: str, pattern: re.Pattern[str] = NAME_RE) -> list[Violation]:
    if not name:
        return [Violation(path, "is required")]
    if not pattern.match(name):
        return [
            Violation(
                path,
                f"{name[:80]!r} is not a valid name: use lowercase letters, digits, '.', '_' "
                "and '-', starting and ending with a letter or digit, at most 63 characters"
                if pattern is NAME_RE
                else f"{name[:80]!r} is not a valid node name",
            )
        ]
    return []


def _non_negative(path: str, value: float) -> list[Violation]:
    if not _finite(value):
        return [Violation(path, f"must be a finite number, got {value}")]
    if value < 0:
        return [Violation(path, f"must be >= 0, got {value}")]
    return []


def _positive(path: str, value: float) -> list[Violation]:
    if not _finite(value) or value <= 0:
        return [Violation(path, f"must be a finite number > 0, got {value}")]
    return []


def _duplicates(kind: str, names: list[str]) -> list[Violation]:
    seen: set[str] = set()
    violations = []
    for i, name in enumerate(names):
        if name and name in seen:
            violations.append(Violation(f"{kind}[{i}].name", f"duplicate name {name!r}"))
        seen.add(name)
    return violations


def validate_config(config: ClusterConfig) -> list[Violation]:
    """Every violation in `config`, in request order; an empty list means it may be applied."""
    violations: list[Violation] = []
    type_names = [t.name for t in config.gpu_types]
    pool_names = [p.name for p in config.pools]
    violations += _duplicates("gpu_types", type_names)
    violations += _duplicates("pools", pool_names)
    violations += _duplicates("nodes", [n.name for n in config.nodes])

    for i, gpu in enumerate(config.gpu_types):
        path = f"gpu_types[{i}]"
        violations += _check_name(f"{path}.name", gpu.name)
        violations += _positive(f"{path}.memory_gib", gpu.memory_gib)
        violations += _positive(f"{path}.compute_weight", gpu.compute_weight)
        for j, profile in enumerate(gpu.partition_profiles):
            ppath = f"{path}.partition_profiles[{j}]"
            violations += _check_name(f"{ppath}.name", profile.name)
            if not _finite(profile.gpu_fraction) or not 0 < profile.gpu_fraction <= 1:
                violations.append(Violation(f"{ppath}.gpu_fraction", "must be in (0, 1]"))
            violations += _positive(f"{ppath}.memory_gib", profile.memory_gib)
            if _finite(profile.memory_gib) and profile.memory_gib > gpu.memory_gib:
                violations.append(
                    Violation(f"{ppath}.memory_gib", "exceeds the memory of the whole GPU")
                )

    for i, pool in enumerate(config.pools):
        violations += _validate_pool(f"pools[{i}]", pool)

    known_types, known_pools = set(type_names), set(pool_names)
    for i, node in enumerate(config.nodes):
        violations += _validate_node(f"nodes[{i}]", node, known_types, known_pools)

    violations += _validate_queues(config.queues, known_types, known_pools)

    known_queues = {q.name for q in config.queues}
    seen_budgets: set[tuple[str, str, str]] = set()
    for i, budget in enumerate(config.budgets):
        path = f"budgets[{i}]"
        if budget.queue not in known_queues:
            violations.append(Violation(f"{path}.queue", f"unknown queue {budget.queue!r}"))
        if budget.pool is not None and budget.pool not in known_pools:
            violations.append(Violation(f"{path}.pool", f"unknown pool {budget.pool!r}"))
        violations += _positive(f"{path}.cu_hours", budget.cu_hours)
        key = (budget.queue, budget.period.value, budget.pool or "")
        if key in seen_budgets:
            violations.append(Violation(path, "duplicate budget for this queue, period and pool"))
        seen_budgets.add(key)
    return violations


def _validate_pool(path: str, pool: NodePool) -> list[Violation]:
    violations = _check_name(f"{path}.name", pool.name)
    violations += [
        Violation(f"{path}.policy.{v.field_path}", v.message) for v in validate_policy(pool.policy)
    ]
    after = pool.gang_reservation_after_s
    if after is not None:
        violations += _non_negative(f"{path}.gang_reservation_after_s", after)
    if pool.max_borrow_s is not None:
        violations += _positive(f"{path}.max_borrow_s", pool.max_borrow_s)
    return violations


def _validate_node(path: str, node: Node, types: set[str], pools: set[str]) -> list[Violation]:
    violations = _check_name(f"{path}.name", node.name, NODE_NAME_RE)
    if node.pool not in pools:
        violations.append(Violation(f"{path}.pool", f"unknown pool {node.pool!r}"))
    if node.gpu_type not in types:
        violations.append(Violation(f"{path}.gpu_type", f"unknown GPU type {node.gpu_type!r}"))
    if not 0 <= node.gpu_count <= MAX_GPUS_PER_NODE:
        violations.append(
            Violation(f"{path}.gpu_count", f"must be between 0 and {MAX_GPUS_PER_NODE}")
        )
    violations += _non_negative(f"{path}.cpu_millicores", node.cpu_millicores)
    violations += _non_negative(f"{path}.memory_mib", node.memory_mib)
    for key, value in node.labels.items():
        if not LABEL_KEY_RE.match(key):
            violations.append(Violation(f"{path}.labels[{key[:80]}]", "invalid label key"))
        if len(value) > MAX_LABEL_VALUE_LEN:
            violations.append(Violation(f"{path}.labels[{key[:80]}]", "label value too long"))
    return violations


def _validate_queues(
    queues: tuple[Queue, ...], types: set[str], pools: set[str]
) -> list[Violation]:
    violations = [
        Violation(f"queues{v.field_path}", v.message) for v in queue_structure_violations(queues)
    ]
    for i, queue in enumerate(queues):
        path = f"queues[{i}]"
        violations += _check_name(f"{path}.name", queue.name)
        for j, (pool_name, quota) in enumerate(queue.quotas.items()):
            violations += _validate_quota(f"{path}.quotas[{j}]", quota, pool_name, types, pools)
    violations += _depth_violations(queues)
    return violations


def _validate_quota(
    path: str, quota: QueueQuota, pool_name: str, types: set[str], pools: set[str]
) -> list[Violation]:
    violations: list[Violation] = []
    if pool_name not in pools:
        violations.append(Violation(f"{path}.pool", f"unknown pool {pool_name!r}"))
    violations += _non_negative(f"{path}.deserved_cu", quota.deserved_cu)
    violations += _non_negative(f"{path}.over_quota_weight", quota.over_quota_weight)
    if quota.max_borrow_s is not None:
        violations += _positive(f"{path}.max_borrow_s", quota.max_borrow_s)
    if quota.limit_cu is not None:
        violations += _non_negative(f"{path}.limit_cu", quota.limit_cu)
        if (
            _finite(quota.limit_cu)
            and _finite(quota.deserved_cu)
            and quota.limit_cu < quota.deserved_cu
        ):
            violations.append(
                Violation(
                    f"{path}.limit_cu", "is below deserved_cu: the guarantee could never hold"
                )
            )
    for field_name, per_type in (
        ("deserved_gpus_by_type", quota.deserved_gpus_by_type),
        ("limit_gpus_by_type", quota.limit_gpus_by_type),
    ):
        for type_name, gpus in per_type.items():
            key_path = f"{path}.{field_name}[{type_name}]"
            if type_name not in types:
                violations.append(Violation(key_path, f"unknown GPU type {type_name!r}"))
            violations += _non_negative(key_path, gpus)
    for type_name, limit in quota.limit_gpus_by_type.items():
        deserved = quota.deserved_gpus_by_type.get(type_name, 0.0)
        if _finite(limit) and _finite(deserved) and limit < deserved:
            violations.append(
                Violation(
                    f"{path}.limit_gpus_by_type[{type_name}]",
                    "is below deserved_gpus_by_type: the guarantee could never hold",
                )
            )
    return violations


def _depth_violations(queues: tuple[Queue, ...]) -> list[Violation]:
    """Trees deeper than MAX_QUEUE_DEPTH; cycles are `queue_structure_violations`' to report."""
    parent_of = {q.name: q.parent for q in queues}
    violations = []
    for i, queue in enumerate(queues):
        depth, current, seen = 0, queue.parent, {queue.name}
        while current is not None and current in parent_of and current not in seen:
            seen.add(current)
            depth += 1
            current = parent_of[current]
        if depth >= MAX_QUEUE_DEPTH:
            violations.append(
                Violation(f"queues[{i}].parent", f"queue tree deeper than {MAX_QUEUE_DEPTH} levels")
            )
    return violations


def config_warnings(config: ClusterConfig) -> list[str]:
    """Things that are allowed but probably not meant, e.g. guarantees a pool cannot honour."""
    weights = {t.name: t.compute_weight for t in config.gpu_types}
    capacity_cu: dict[str, float] = defaultdict(float)
    for node in config.nodes:
        if node.ready:
            capacity_cu[node.pool] += node.gpu_count * weights.get(node.gpu_type, 0.0)
    children: dict[str | None, list[Queue]] = defaultdict(list)
    for queue in config.queues:
        children[queue.parent].append(queue)

    warnings: list[str] = []
    for pool in config.pools:
        top_deserved = sum(q.quota(pool.name).deserved_cu for q in children[None])
        if top_deserved > capacity_cu[pool.name] + 1e-9:
            warnings.append(
                f"pool {pool.name!r}: top-level deserved quotas add up to {top_deserved:g} CU, "
                f"more than its {capacity_cu[pool.name]:g} CU: guarantees cannot all hold at once"
            )
        for parent in config.queues:
            kids = children[parent.name]
            kids_deserved = sum(q.quota(pool.name).deserved_cu for q in kids)
            own = parent.quota(pool.name).deserved_cu
            if kids and kids_deserved > own + 1e-9 and pool.name in parent.quotas:
                warnings.append(
                    f"pool {pool.name!r}: children of {parent.name!r} deserve {kids_deserved:g} CU, "
                    f"more than its own {own:g} CU"
                )
    for i, pool in enumerate(config.pools):
        if pool.policy.window_kind is WindowKind.NONE and pool.policy.half_life_s is None:
            warnings.append(
                f"pools[{i}] {pool.name!r}: no window and no half-life: usage never fades"
            )
    return warnings
