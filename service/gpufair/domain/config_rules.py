"""What makes a declared cluster valid, and what is merely worth a warning.

Every problem is reported at once with the path of the field in the request, so that an operator
fixes a broken config in one round trip instead of one error at a time. The ranges and lengths
are those of `domain/limits.py` (the proto comments state them).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

from gpufair.domain import limits
from gpufair.domain.errors import Violation
from gpufair.domain.limits import echo, number_violations, text_violations
from gpufair.domain.model import (
    ClusterConfig,
    FairSharePolicy,
    Node,
    NodePool,
    PartitionProfile,
    Queue,
    QueueQuota,
    WindowKind,
)
from gpufair.domain.policy import (
    deserved_cu_with_types,
    queue_structure_violations,
    validate_policy,
)

NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
NODE_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$")
LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?$")


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _check_name(path: str, name: str, pattern: re.Pattern[str] = NAME_RE) -> list[Violation]:
    if not name:
        return [Violation(path, "is required")]
    if not pattern.match(name):
        return [
            Violation(
                path,
                f"{echo(name)} is not a valid name: use lowercase letters, digits, '.', '_' "
                f"and '-', starting and ending with a letter or digit, at most {limits.MAX_NAME_LEN} "
                "characters"
                if pattern is NAME_RE
                else f"{echo(name)} is not a valid node name: letters, digits, '.', '_' and '-', "
                f"at most {limits.MAX_NODE_NAME_LEN} characters",
            )
        ]
    return []


def _duplicates(kind: str, names: list[str]) -> list[Violation]:
    seen: set[str] = set()
    violations = []
    for i, name in enumerate(names):
        if name and name in seen:
            violations.append(Violation(f"{kind}[{i}].name", f"duplicate name {echo(name)}"))
        seen.add(name)
    return violations


def validate_config(config: ClusterConfig) -> list[Violation]:
    """Every violation in `config`, in request order; an empty list means it may be applied."""
    violations: list[Violation] = []
    type_names = [t.name for t in config.gpu_types]
    pool_names = [p.name for p in config.pools]
    violations += _duplicates("gpu_types", type_names)
    violations += _duplicates("pools", pool_names)

    for i, gpu in enumerate(config.gpu_types):
        path = f"gpu_types[{i}]"
        violations += _check_name(f"{path}.name", gpu.name)
        violations += number_violations(
            f"{path}.memory_gib",
            gpu.memory_gib,
            limits.MIN_GPU_MEMORY_GIB,
            limits.MAX_GPU_MEMORY_GIB,
        )
        violations += number_violations(
            f"{path}.compute_weight",
            gpu.compute_weight,
            limits.MIN_COMPUTE_WEIGHT,
            limits.MAX_COMPUTE_WEIGHT,
        )
        if len(gpu.partition_profiles) > limits.MAX_PARTITION_PROFILES:
            violations.append(
                Violation(
                    f"{path}.partition_profiles",
                    f"more than {limits.MAX_PARTITION_PROFILES} profiles",
                )
            )
            continue
        for j, profile in enumerate(gpu.partition_profiles):
            ppath = f"{path}.partition_profiles[{j}]"
            violations += _check_name(f"{ppath}.name", profile.name)
            violations += number_violations(
                f"{ppath}.gpu_fraction", profile.gpu_fraction, limits.MIN_GPU_FRACTION, 1.0
            )
            violations += number_violations(
                f"{ppath}.memory_gib",
                profile.memory_gib,
                limits.MIN_GPU_MEMORY_GIB,
                limits.MAX_GPU_MEMORY_GIB,
            )
            if _finite(profile.memory_gib) and profile.memory_gib > gpu.memory_gib:
                violations.append(
                    Violation(f"{ppath}.memory_gib", "exceeds the memory of the whole GPU")
                )
            violations += _geometry_violations(ppath, profile)

    for i, pool in enumerate(config.pools):
        violations += _validate_pool(f"pools[{i}]", pool)

    known_types, known_pools = set(type_names), set(pool_names)
    violations += validate_nodes(config.nodes, known_types, known_pools)

    violations += _validate_queues(config.queues, known_types, known_pools)

    known_queues = {q.name for q in config.queues}
    seen_budgets: set[tuple[str, str, str]] = set()
    for i, budget in enumerate(config.budgets):
        path = f"budgets[{i}]"
        if budget.queue not in known_queues:
            violations.append(Violation(f"{path}.queue", f"unknown queue {echo(budget.queue)}"))
        if budget.pool is not None and budget.pool not in known_pools:
            violations.append(Violation(f"{path}.pool", f"unknown pool {echo(budget.pool)}"))
        violations += number_violations(
            f"{path}.cu_hours", budget.cu_hours, 0.0, limits.MAX_BUDGET_CU_HOURS, lo_open=True
        )
        key = (budget.queue, budget.period.value, budget.pool or "")
        if key in seen_budgets:
            violations.append(Violation(path, "duplicate budget for this queue, period and pool"))
        seen_budgets.add(key)
    return violations


def _policy_range_violations(policy: FairSharePolicy) -> list[Violation]:
    """The limits of `domain/limits.py` on a policy's numbers, beyond what `validate_policy`
    (shared with the engine, which must still read a policy stored before the limits) checks."""
    out = number_violations("k", policy.k, 0.0, limits.MAX_K)
    for name, value in (
        ("window_s", policy.window_s),
        ("half_life_s", policy.half_life_s),
        ("recompute_interval_s", policy.recompute_interval_s),
    ):
        if value is not None:
            out += number_violations(name, value, limits.MIN_DURATION_S, limits.MAX_DURATION_S)
    out += number_violations(
        "window_anchor_unix_s", policy.window_anchor_unix_s, limits.MIN_UNIX_S, limits.MAX_UNIX_S
    )
    return out


def _validate_pool(path: str, pool: NodePool) -> list[Violation]:
    violations = _check_name(f"{path}.name", pool.name)
    policy_violations = validate_policy(pool.policy)
    named = {v.field_path for v in policy_violations}
    policy_violations += [
        v for v in _policy_range_violations(pool.policy) if v.field_path not in named
    ]
    violations += [Violation(f"{path}.policy.{v.field_path}", v.message) for v in policy_violations]
    after = pool.gang_reservation_after_s
    if after is not None:
        violations += number_violations(
            f"{path}.gang_reservation_after_s", after, 0.0, limits.MAX_DURATION_S
        )
    if pool.max_borrow_s is not None:
        violations += number_violations(
            f"{path}.max_borrow_s", pool.max_borrow_s, limits.MIN_DURATION_S, limits.MAX_DURATION_S
        )
    violations += _topology_level_violations(f"{path}.topology_levels", pool.topology_levels)
    share = pool.max_moved_share_per_hour
    if share is not None and not 0.0 < share <= 1.0:  # also true for NaN
        violations.append(
            Violation(
                f"{path}.max_moved_share_per_hour",
                f"a share of the pool's GPUs in (0, 1]; got {echo(share)}",
            )
        )
    return violations


def _topology_level_violations(path: str, levels: tuple[str, ...]) -> list[Violation]:
    if len(levels) > limits.MAX_TOPOLOGY_LEVELS:
        return [Violation(path, f"at most {limits.MAX_TOPOLOGY_LEVELS} levels")]
    out: list[Violation] = []
    seen: set[str] = set()
    for position, level in enumerate(levels):
        if not LABEL_KEY_RE.match(level):
            out.append(
                Violation(
                    f"{path}[{position}]",
                    f"a node label key: letters, digits, '.', '_', '/' and '-', at most "
                    f"{limits.MAX_LABEL_KEY_LEN} characters; got {echo(level)}",
                )
            )
        elif level in seen:
            out.append(Violation(f"{path}[{position}]", f"level {echo(level)} listed twice"))
        seen.add(level)
    return out


def _validate_node(path: str, node: Node, types: set[str], pools: set[str]) -> list[Violation]:
    violations = _check_name(f"{path}.name", node.name, NODE_NAME_RE)
    if node.pool not in pools:
        violations.append(Violation(f"{path}.pool", f"unknown pool {echo(node.pool)}"))
    if node.gpu_type not in types:
        violations.append(Violation(f"{path}.gpu_type", f"unknown GPU type {echo(node.gpu_type)}"))
    violations += number_violations(
        f"{path}.gpu_count", node.gpu_count, 0, limits.MAX_GPUS_PER_NODE
    )
    violations += number_violations(
        f"{path}.cpu_millicores", node.cpu_millicores, 0, limits.MAX_CPU_MILLICORES
    )
    violations += number_violations(f"{path}.memory_mib", node.memory_mib, 0, limits.MAX_MEMORY_MIB)
    if len(node.labels) > limits.MAX_LABELS_PER_NODE:
        violations.append(
            Violation(f"{path}.labels", f"more than {limits.MAX_LABELS_PER_NODE} labels")
        )
        return violations
    for key, value in node.labels.items():
        key_path = f"{path}.labels[{key[:80]}]"
        if not LABEL_KEY_RE.match(key):
            violations.append(
                Violation(
                    key_path,
                    f"invalid label key: letters, digits, '.', '_', '/' and '-', at most "
                    f"{limits.MAX_LABEL_KEY_LEN} characters",
                )
            )
        violations += text_violations(key_path, value, limits.MAX_LABEL_VALUE_LEN)
    return violations


def validate_nodes(
    nodes: tuple[Node, ...], types: set[str], pools: set[str], prefix: str = "nodes"
) -> list[Violation]:
    """Nodes on their own, as in ApplyConfig (also for UpsertNodes): at most
    MAX_NODES_PER_UPSERT, unique names, each valid against the declared `types` and `pools`."""
    if len(nodes) > limits.MAX_NODES_PER_UPSERT:
        return [Violation(prefix, f"more than {limits.MAX_NODES_PER_UPSERT} nodes ({len(nodes)})")]
    violations = _duplicates(prefix, [n.name for n in nodes])
    for i, node in enumerate(nodes):
        violations += _validate_node(f"{prefix}[{i}]", node, types, pools)
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
    path: str,
    quota: QueueQuota,
    pool_name: str,
    types: set[str],
    pools: set[str],
) -> list[Violation]:
    """One quota's numbers. A limit may be below the deserved quota: the guarantee is
    min(deserved, demand, limit) (DESIGN §3.1); `config_warnings` says so."""
    violations: list[Violation] = []
    if pool_name not in pools:
        violations.append(Violation(f"{path}.pool", f"unknown pool {echo(pool_name)}"))
    violations += number_violations(f"{path}.deserved_cu", quota.deserved_cu, 0.0, limits.MAX_CU)
    violations += number_violations(
        f"{path}.over_quota_weight", quota.over_quota_weight, 0.0, limits.MAX_OVER_QUOTA_WEIGHT
    )
    if quota.max_borrow_s is not None:
        violations += number_violations(
            f"{path}.max_borrow_s", quota.max_borrow_s, limits.MIN_DURATION_S, limits.MAX_DURATION_S
        )
    if quota.limit_cu is not None:
        violations += number_violations(f"{path}.limit_cu", quota.limit_cu, 0.0, limits.MAX_CU)
    for field_name, per_type in (
        ("deserved_gpus_by_type", quota.deserved_gpus_by_type),
        ("limit_gpus_by_type", quota.limit_gpus_by_type),
    ):
        if len(per_type) > limits.MAX_GPU_TYPES_PER_MAP:
            violations.append(
                Violation(
                    f"{path}.{field_name}", f"more than {limits.MAX_GPU_TYPES_PER_MAP} entries"
                )
            )
            continue
        for type_name, gpus in per_type.items():
            key_path = f"{path}.{field_name}[{type_name[:80]}]"
            if type_name not in types:
                violations.append(Violation(key_path, f"unknown GPU type {echo(type_name)}"))
            violations += number_violations(key_path, gpus, 0.0, limits.MAX_GPUS)
    return violations


def _depth_violations(queues: tuple[Queue, ...]) -> list[Violation]:
    """Queues deeper than MAX_QUEUE_DEPTH levels below a top-level queue; cycles and unknown
    parents are `queue_structure_violations`' to report. Linear in the number of queues."""
    parent_of = {q.name: q.parent for q in queues}
    depth_of: dict[str, int] = {}
    for queue in queues:
        chain: list[str] = []
        current: str | None = queue.name
        on_chain: set[str] = set()
        while current is not None and current not in depth_of and current not in on_chain:
            chain.append(current)
            on_chain.add(current)
            current = parent_of.get(current)
        above = -1 if current is None else depth_of.get(current, 0)
        for name in reversed(chain):
            above += 1
            depth_of[name] = above
    return [
        Violation(
            f"queues[{i}].parent",
            f"queue tree deeper than {limits.MAX_QUEUE_DEPTH} levels ({depth_of[q.name] + 1})",
        )
        for i, q in enumerate(queues)
        if depth_of.get(q.name, 0) >= limits.MAX_QUEUE_DEPTH
    ]


def config_warnings(config: ClusterConfig) -> list[str]:
    """Things that are allowed but probably not meant, e.g. guarantees a pool cannot honour.

    A pool's guarantees are judged against every node it is configured with, ready or not, at
    its declared GPUs: this is about the configuration, and a drain is operations. Counting
    ready nodes only, each apply during a drain (a node under maintenance, a Slurm node in
    DRAIN or DOWN) of a pool whose quotas fill it warned that its guarantees cannot all hold,
    while the drained node's running work still counted in the division (`capacity_history.
    division_capacity`) and the node was coming back; nothing in the config was wrong. (A
    reported loss of GPUs never counted here either.)"""
    weights = {t.name: t.compute_weight for t in config.gpu_types}
    capacity_cu: dict[str, float] = defaultdict(float)
    for node in config.nodes:
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
    for queue in config.queues:
        for pool_name, quota in queue.quotas.items():
            warnings += _limit_warnings(queue.name, pool_name, quota, weights)
    for i, pool in enumerate(config.pools):
        if pool.policy.window_kind is WindowKind.NONE and pool.policy.half_life_s is None:
            warnings.append(
                f"pools[{i}] {pool.name!r}: no window and no half-life: usage never fades"
            )
    return warnings


def _limit_warnings(
    queue: str, pool: str, quota: QueueQuota, compute_weights: dict[str, float]
) -> list[str]:
    """A limit below the deserved quota it bounds is allowed (the limit caps the guarantee:
    min(deserved, demand, limit), DESIGN §3.1), but a typo looks the same: say what holds."""
    warnings = []
    deserved_cu = deserved_cu_with_types(quota, compute_weights)
    if quota.limit_cu is not None and quota.limit_cu < deserved_cu:
        warnings.append(
            f"pool {pool!r}: queue {queue!r} has limit_cu {quota.limit_cu:g} below its deserved "
            f"{deserved_cu:g} CU: it is guaranteed {quota.limit_cu:g} CU at most"
        )
    for type_name, limit_gpus in sorted(quota.limit_gpus_by_type.items()):
        deserved_gpus = quota.deserved_gpus_by_type.get(type_name, 0.0)
        if limit_gpus < deserved_gpus:
            warnings.append(
                f"pool {pool!r}: queue {queue!r} has limit_gpus_by_type[{type_name}] "
                f"{limit_gpus:g} below its deserved {deserved_gpus:g} GPUs of that type: it is "
                f"guaranteed {limit_gpus:g} at most"
            )
    return warnings


def _geometry_violations(path: str, profile: PartitionProfile) -> list[Violation]:
    """A profile's slice geometry (`domain/partition_geometry.py`): `memory_slices` in
    [0, 32]; with slices, one or more distinct starts, each leaving the instance on the GPU."""
    found = number_violations(
        f"{path}.memory_slices", profile.memory_slices, 0, limits.MAX_MEMORY_SLICES
    )
    if found:
        return found
    if not profile.memory_slices:
        if profile.starts:
            found.append(Violation(f"{path}.starts", "starts need memory_slices"))
        return found
    if not profile.starts:
        found.append(Violation(f"{path}.starts", "at least one start with memory_slices"))
    if len(set(profile.starts)) != len(profile.starts):
        found.append(Violation(f"{path}.starts", "lists a start twice"))
    last = limits.MAX_MEMORY_SLICES - profile.memory_slices
    for k, start in enumerate(profile.starts):
        found += number_violations(f"{path}.starts[{k}]", start, 0, last)
    return found
