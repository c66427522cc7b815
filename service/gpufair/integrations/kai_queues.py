"""KAI-Scheduler Queue objects to a gpufair cluster config (`gpufair convert kai-queues`).

Reads `scheduling.run.ai/v2` Queue objects (one per YAML document, or the `items` of a `List` /
`QueueList` as `kubectl get queues -o yaml` prints them) and writes the `ClusterConfig` that
divides one pool the way KAI-Scheduler did (docs/kai-compatibility.md):

- a queue is a gpufair queue of the same name; `spec.parentQueue` its parent;
- `spec.resources.gpu.quota` GPUs are `deserved_cu` (GPUs × the GPU type's compute weight);
  a quota of -1 ("unlimited": KAI gives such a queue everything it asks for first) becomes the
  whole pool, so the pool's GPU count must be given;
- `spec.resources.gpu.limit` GPUs are `limit_cu`; -1 is no limit;
- `spec.resources.gpu.overQuotaWeight` is `over_quota_weight` (KAI's default 1);
- `spec.priority` is the quota's `priority` (KAI's default 100);
- the pool's policy is KAI's: `division: kai`, `usage_basis: total`, `rounding: whole_gpus`,
  k = 1, a sliding window of 7 days, no half-life (KAI's defaults; set your own after).

CPU and memory quotas are not converted: gpufair divides GPUs only. Nodes are not in Queue
objects: add them, or let the node agent report them, before the pool has capacity.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

KAI_API_VERSION = "scheduling.run.ai/v2"
KAI_DEFAULT_PRIORITY = 100
KAI_UNLIMITED = -1


class KaiQueueError(ValueError):
    """Queue objects that cannot be converted; the message names the object and the field."""


@dataclass(frozen=True, slots=True)
class KaiConversion:
    """Where the converted queues go: one pool, one GPU type."""

    pool: str = "default"
    gpu_type: str = "gpu"
    compute_weight: float = 1.0
    memory_gib: float = 80.0
    pool_gpus: float | None = None  # needed only for quota -1


def queues_from_yaml(texts: Iterable[tuple[str, str]]) -> list[Mapping[str, Any]]:
    """Every Queue object in the given (source name, YAML text) pairs, lists unpacked."""
    found: list[Mapping[str, Any]] = []
    for source, text in texts:
        try:
            documents = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            raise KaiQueueError(f"{source}: not YAML: {exc}") from exc
        for index, document in enumerate(documents):
            if document is None:
                continue
            where = f"{source} document {index + 1}"
            if not isinstance(document, Mapping):
                raise KaiQueueError(f"{where}: expected a Kubernetes object, got {document!r}")
            if document.get("kind") in ("List", "QueueList"):
                items = document.get("items") or []
                found.extend(_checked(item, f"{where} items[{i}]") for i, item in enumerate(items))
            else:
                found.append(_checked(document, where))
    return found


def _checked(obj: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping) or obj.get("kind") != "Queue":
        kind = obj.get("kind") if isinstance(obj, Mapping) else obj
        raise KaiQueueError(f"{where}: expected kind Queue, got {kind!r}")
    if obj.get("apiVersion") != KAI_API_VERSION:
        raise KaiQueueError(
            f"{where}: apiVersion {obj.get('apiVersion')!r}; only {KAI_API_VERSION} is read"
        )
    name = (obj.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        raise KaiQueueError(f"{where}: metadata.name is missing")
    return obj


def cluster_file(queues: list[Mapping[str, Any]], options: KaiConversion) -> dict[str, Any]:
    """The cluster config file (a `ClusterConfig` in the YAML shape `gpufair apply` reads)."""
    names = [q["metadata"]["name"] for q in queues]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise KaiQueueError(f"queue {duplicates[0]!r} is defined more than once")
    converted = []
    for queue in queues:
        name = queue["metadata"]["name"]
        spec = queue.get("spec") or {}
        parent = spec.get("parentQueue") or None
        if parent is not None and parent not in names:
            raise KaiQueueError(f"queue {name!r}: spec.parentQueue {parent!r} is not among them")
        gpu = (spec.get("resources") or {}).get("gpu") or {}
        quota = _number(gpu, "quota", 0.0, name)
        limit = _number(gpu, "limit", KAI_UNLIMITED, name)
        weight = _number(gpu, "overQuotaWeight", 1.0, name)
        priority = spec.get("priority", KAI_DEFAULT_PRIORITY)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise KaiQueueError(f"queue {name!r}: spec.priority must be an integer")
        if quota == KAI_UNLIMITED:
            if options.pool_gpus is None:
                raise KaiQueueError(
                    f"queue {name!r}: gpu quota -1 (unlimited) needs the pool's GPU count "
                    "(--pool-gpus) to become a deserved quota"
                )
            quota = options.pool_gpus
        entry: dict[str, Any] = {
            "pool": options.pool,
            "deserved_cu": quota * options.compute_weight,
            "over_quota_weight": weight,
            "priority": priority,
        }
        if limit != KAI_UNLIMITED:
            entry["limit_cu"] = limit * options.compute_weight
        item: dict[str, Any] = {"name": name}
        if parent is not None:
            item["parent"] = parent
        item["quotas"] = [entry]
        converted.append(item)
    return {
        "gpu_types": [
            {
                "name": options.gpu_type,
                "memory_gib": options.memory_gib,
                "compute_weight": options.compute_weight,
            }
        ],
        "pools": [
            {
                "name": options.pool,
                "policy": {
                    "division": "kai",
                    "usage_basis": "total",
                    "rounding": "whole_gpus",
                    "k": 1.0,
                    "window_kind": "sliding",
                    "window_s": "7d",
                },
            }
        ],
        "queues": converted,
    }


def _number(gpu: Mapping[str, Any], key: str, default: float, queue: str) -> float:
    value = gpu.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise KaiQueueError(f"queue {queue!r}: spec.resources.gpu.{key} must be a number")
    if value < 0 and value != KAI_UNLIMITED:
        raise KaiQueueError(
            f"queue {queue!r}: spec.resources.gpu.{key} must be ≥ 0 or -1, got {value}"
        )
    if key == "overQuotaWeight" and value < 0:
        raise KaiQueueError(f"queue {queue!r}: spec.resources.gpu.overQuotaWeight must be ≥ 0")
    return float(value)
