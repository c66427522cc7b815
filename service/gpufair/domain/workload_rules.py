"""What makes a submitted workload valid, before any look at the cluster it is meant for."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Sequence

from gpufair.domain.errors import Violation
from gpufair.domain.model import ClusterConfig, Node, Workload
from gpufair.domain.placement import never_fits

UID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,252}$")
MAX_PODS = 100_000
MAX_GPUS_PER_POD = 64


def _finite_non_negative(path: str, value: float) -> list[Violation]:
    if not math.isfinite(value) or value < 0:
        return [Violation(path, f"must be a finite number >= 0, got {value}")]
    return []


def workload_violations(w: Workload, path: str) -> list[Violation]:
    """Problems with one workload's own fields; paths are prefixed with `path`."""
    v: list[Violation] = []
    if not UID_RE.match(w.uid):
        v.append(Violation(f"{path}.uid", "must be 1-253 characters: letters, digits, . _ : / @ -"))
    if not w.queue:
        v.append(Violation(f"{path}.queue", "is required"))
    if not w.pool:
        v.append(Violation(f"{path}.pool", "is required"))
    if not 1 <= w.pods <= MAX_PODS:
        v.append(Violation(f"{path}.pods", f"must be between 1 and {MAX_PODS}"))
    if not math.isfinite(w.gpus_per_pod) or not 0 < w.gpus_per_pod <= MAX_GPUS_PER_POD:
        v.append(Violation(f"{path}.gpus_per_pod", f"must be in (0, {MAX_GPUS_PER_POD}]"))
    elif w.gpus_per_pod > 1 and w.gpus_per_pod != int(w.gpus_per_pod):
        v.append(
            Violation(
                f"{path}.gpus_per_pod", "above 1 it must be whole GPUs; fractions share one GPU"
            )
        )
    if w.min_pods is not None and not 1 <= w.min_pods <= w.pods:
        v.append(Violation(f"{path}.min_pods", "must be between 1 and pods"))
    v += _finite_non_negative(f"{path}.min_gpu_memory_gib", w.min_gpu_memory_gib)
    v += _finite_non_negative(f"{path}.cpu_millicores_per_pod", w.cpu_millicores_per_pod)
    v += _finite_non_negative(f"{path}.memory_mib_per_pod", w.memory_mib_per_pod)
    v += _finite_non_negative(f"{path}.min_runtime_s", w.min_runtime_s)
    if not math.isfinite(w.submit_time_s) or w.submit_time_s <= 0:
        v.append(Violation(f"{path}.submit_time", "must be a valid instant"))
    if w.topology is not None and not w.topology.level:
        v.append(Violation(f"{path}.topology.level", "is required when a topology is given"))
    if len(set(w.allowed_gpu_types)) != len(w.allowed_gpu_types):
        v.append(Violation(f"{path}.allowed_gpu_types", "lists a type twice"))
    return v


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
            problems[w.uid] = f"unknown pool {w.pool!r}"
        elif w.queue not in queues:
            problems[w.uid] = f"unknown queue {w.queue!r}"
        elif w.queue in parents:
            problems[w.uid] = f"queue {w.queue!r} has child queues; submit to a leaf queue"
        else:
            rejection = never_fits(w, nodes_by_pool.get(w.pool, ()), config.gpu_types)
            if rejection is not None:
                problems[w.uid] = f"never fits pool {w.pool!r}: {rejection.message}"
    return problems
