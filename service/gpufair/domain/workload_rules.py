"""What makes a submitted workload valid, before any look at the cluster it is meant for."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence

from gpufair.domain import limits
from gpufair.domain.errors import Violation
from gpufair.domain.limits import (
    instant_violations,
    number_violations,
    text_violations,
    texts_violations,
)
from gpufair.domain.model import ClusterConfig, Node, Workload
from gpufair.domain.partitions import with_profile_share
from gpufair.domain.placement_rejection import never_fits

UID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,252}$")


def workload_violations(w: Workload, path: str) -> list[Violation]:
    """Problems with one workload's own fields; paths are prefixed with `path`. Ranges and
    lengths are those of `domain/limits.py`."""
    v: list[Violation] = []
    if not UID_RE.match(w.uid):
        v.append(
            Violation(
                f"{path}.uid",
                f"must be 1-{limits.MAX_UID_LEN} characters: letters, digits, . _ : / @ -",
            )
        )
    v += text_violations(f"{path}.queue", w.queue, limits.MAX_NAME_LEN, required=True)
    v += text_violations(f"{path}.pool", w.pool, limits.MAX_NAME_LEN, required=True)
    if w.compute_units != 0.0 or w.partition_profile:
        v += _request_kind_violations(w, path)
    else:
        v += number_violations(f"{path}.pods", w.pods, 1, limits.MAX_PODS)
        v += _gpus_per_pod_violations(w, path)
        if w.min_pods is not None and not 1 <= w.min_pods <= w.pods:
            v.append(Violation(f"{path}.min_pods", "must be between 1 and pods"))
    if w.mixed_gpu_types and (w.compute_units == 0.0 or w.topology is None):
        v.append(
            Violation(
                f"{path}.mixed_gpu_types",
                "needs compute_units and a topology level (the mix stays in one domain)",
            )
        )
    elif w.mixed_gpu_types and w.gpus_per_pod not in (0.0, 1.0):
        v.append(Violation(f"{path}.gpus_per_pod", "a mix of types takes one GPU a pod: 0 or 1"))
    v += number_violations(
        f"{path}.min_gpu_memory_gib", w.min_gpu_memory_gib, 0.0, limits.MAX_GPU_MEMORY_GIB
    )
    v += number_violations(
        f"{path}.cpu_millicores_per_pod", w.cpu_millicores_per_pod, 0, limits.MAX_CPU_MILLICORES
    )
    v += number_violations(
        f"{path}.memory_mib_per_pod", w.memory_mib_per_pod, 0, limits.MAX_MEMORY_MIB
    )
    v += number_violations(f"{path}.min_runtime_s", w.min_runtime_s, 0.0, limits.MAX_DURATION_S)
    v += instant_violations(f"{path}.submit_time", w.submit_time_s)
    if w.topology is not None:
        v += text_violations(
            f"{path}.topology.level", w.topology.level, limits.MAX_LABEL_KEY_LEN, required=True
        )
    types = texts_violations(
        f"{path}.allowed_gpu_types",
        w.allowed_gpu_types,
        limits.MAX_ALLOWED_GPU_TYPES,
        limits.MAX_NAME_LEN,
    )
    v += types
    if not types and len(set(w.allowed_gpu_types)) != len(w.allowed_gpu_types):
        v.append(Violation(f"{path}.allowed_gpu_types", "lists a type twice"))
    return v


def _gpus_per_pod_violations(w: Workload, path: str) -> list[Violation]:
    gpus = number_violations(
        f"{path}.gpus_per_pod", w.gpus_per_pod, limits.MIN_GPU_FRACTION, limits.MAX_GPUS_PER_POD
    )
    if not gpus and w.gpus_per_pod > 1 and w.gpus_per_pod != int(w.gpus_per_pod):
        gpus.append(
            Violation(
                f"{path}.gpus_per_pod", "above 1 it must be whole GPUs; fractions share one GPU"
            )
        )
    return gpus


def _request_kind_violations(w: Workload, path: str) -> list[Violation]:
    """A partition request (`partition_profile`) or a compute-unit request (`compute_units`):
    they exclude each other; a CU request leaves pods to placement and asks whole GPUs."""
    v: list[Violation] = []
    if w.partition_profile:
        v += text_violations(
            f"{path}.partition_profile", w.partition_profile, limits.MAX_NAME_LEN, required=True
        )
    if w.compute_units == 0.0:  # a partition request: pods as usual, the share from the profile
        v += number_violations(f"{path}.pods", w.pods, 1, limits.MAX_PODS)
        if w.min_pods is not None and not 1 <= w.min_pods <= w.pods:
            v.append(Violation(f"{path}.min_pods", "must be between 1 and pods"))
        if w.gpus_per_pod != 0.0:
            v += number_violations(
                f"{path}.gpus_per_pod", w.gpus_per_pod, limits.MIN_GPU_FRACTION, 1.0
            )
        return v
    v += number_violations(
        f"{path}.compute_units",
        w.compute_units,
        limits.MIN_COMPUTE_UNITS,
        limits.MAX_COMPUTE_UNITS,
    )
    if w.partition_profile:
        v.append(
            Violation(
                f"{path}.compute_units", "a compute-unit request cannot ask for a partition profile"
            )
        )
    if w.pods != 0:
        v.append(Violation(f"{path}.pods", "leave it 0 with compute_units: placement sets it"))
    if w.min_pods is not None:
        v.append(Violation(f"{path}.min_pods", "leave it unset with compute_units"))
    if w.gpus_per_pod != 0.0:
        gpus = _gpus_per_pod_violations(w, path)
        if not gpus and w.gpus_per_pod < 1.0:
            gpus.append(
                Violation(
                    f"{path}.gpus_per_pod", "with compute_units: 0 (one GPU) or whole GPUs per pod"
                )
            )
        v += gpus
    return v


def resolve_submitted(
    config: ClusterConfig, batch: Sequence[Workload]
) -> tuple[list[Workload], dict[str, str]]:
    """The batch as stored (a partition request gets its profile's share as `gpus_per_pod`),
    and per uid why a well-formed workload cannot be accepted (`submit_problems`)."""
    gpu_types = {t.name: t for t in config.gpu_types}
    resolved: list[Workload] = []
    problems: dict[str, str] = {}
    for w in batch:
        found, problem = with_profile_share(w, gpu_types)
        resolved.append(found)
        if problem is not None:
            problems[w.uid] = problem
    checked = [w for w in resolved if w.uid not in problems]
    problems.update(submit_problems(config, checked))
    return resolved, problems


def submit_problems(config: ClusterConfig, batch: Sequence[Workload]) -> dict[str, str]:
    """Per uid, why a well-formed workload cannot be accepted into this cluster."""
    pools = {p.name for p in config.pools}
    queues = {q.name for q in config.queues}
    parents = {q.parent for q in config.queues if q.parent}
    nodes_by_pool: dict[str, list[Node]] = defaultdict(list)
    for node in config.nodes:
        nodes_by_pool[node.pool].append(node)
    problems: dict[str, str] = {}
    for w in batch:
        if w.pool not in pools:
            problems[w.uid] = f"unknown pool {limits.echo(w.pool)}"
        elif w.queue not in queues:
            problems[w.uid] = f"unknown queue {limits.echo(w.queue)}"
        elif w.queue in parents:
            problems[w.uid] = f"queue {w.queue!r} has child queues; submit to a leaf queue"
        else:
            rejection = never_fits(w, nodes_by_pool.get(w.pool, ()), config.gpu_types)
            if rejection is not None:
                problems[w.uid] = f"never fits pool {w.pool!r}: {rejection.message}"
    return problems
