"""A leaf queue's demand (DESIGN §3.1): what it holds now plus what waits, per GPU type.

The one statement of the rule, used by the server's recompute and by the simulator alike:

- held: the GPUs of what runs (or is bound), on the type it really holds;
- waiting: each workload's whole request, counted on the GPU type placement would choose for it
  (the cheapest present type that serves it, `placement.adequate_types`); work that no present
  type serves is no demand at all (it cannot use anything this pool could give it);
- a compute-unit request (`domain/cu_request.py`) waits for the GPUs of its first option:
  `ceil(compute_units / weight)` on the serving type (which `adequate_types` gives first);
- every leaf gets an entry (empty when it has no work), sums are exact (`math.fsum`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

from gpufair.domain import cu_request
from gpufair.domain.fairshare import QueueDemand
from gpufair.domain.model import Workload


def queue_demands(
    leaves: Iterable[str],
    held: Iterable[tuple[str, str, float]],
    waiting: Iterable[Workload],
    serving_type: Callable[[Workload], str | None],
    weights: Mapping[str, float] | None = None,
) -> dict[str, QueueDemand]:
    """Demand of each leaf queue. `held` is (queue, GPU type, GPUs) of what holds GPUs now;
    `serving_type(w)` the type a waiting workload would be placed on, None when none serves it;
    `weights` the CU per GPU of each type (needed for compute-unit requests only).
    Entries for queues outside `leaves` are ignored."""
    names = tuple(leaves)
    allocated: dict[str, dict[str, list[float]]] = {q: {} for q in names}
    pending: dict[str, dict[str, list[float]]] = {q: {} for q in names}
    for queue, gpu_type, gpus in held:
        if queue in allocated:
            allocated[queue].setdefault(gpu_type, []).append(gpus)
    for workload in waiting:
        if workload.queue not in pending:
            continue
        serving = serving_type(workload)
        if serving is None:
            continue
        gpus = workload.total_gpus
        if workload.compute_units > 0.0:
            weight = (weights or {}).get(serving, 0.0)
            if weight <= 0.0:
                continue
            per_pod = cu_request.pod_gpus(workload)
            gpus = per_pod * math.ceil(workload.compute_units / weight / per_pod - 1e-9)
        pending[workload.queue].setdefault(serving, []).append(gpus)
    return {q: QueueDemand(_sums(allocated[q]), _sums(pending[q])) for q in names}


def _sums(parts: dict[str, list[float]]) -> dict[str, float]:
    """By type name, so every later walk over the types (and its float sums) is deterministic."""
    return {name: math.fsum(values) for name, values in sorted(parts.items())}
