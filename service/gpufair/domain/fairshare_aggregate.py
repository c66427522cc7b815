"""Every queue's allowed demand, on arrays: the demand pass of a division (issue 17).

A leaf's allowed demand is, per GPU type, min(demand, the pool's GPUs of the type, its limit of
the type), dropped at 0, worth its CU, summed and capped by its CU limit; an inner queue's is
the same bound applied to its children's per-type sums, also capped by the sum of their allowed
demand in CU (`fairshare` module docstring). Here every leaf is bounded in a few array
operations on `LeafDemands`, then the inner queues height by height (`InnerLevel`): all inner
queues of one height at once, their children's rows added child by child.

The numbers are the ones the loop over maps gave, to the last bit, because every float operation
is the same one in the same order: a queue's per-type CU is summed in the order of its map (a
leaf's types as its demand lists them, an inner queue's as they first appear among its children),
a type missing from a map contributing an exact 0.0; children are added in name order, each sum
starting from 0.0. Minimums are exact in any order. numpy's sums (`np.sum`, `add.reduceat`)
are pairwise, not sequential, so none is used; `add.accumulate` is sequential.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from gpufair.domain.fairshare_demand import LeafDemands
from gpufair.domain.fairshare_plan import FairSharePlan, InnerLevel
from gpufair.domain.fairshare_result import NO_GPUS, ShareColumns

_ABSENT = np.iinfo(np.intp).max  # the position of a type a queue's allowed map does not hold


def aggregate_demand(
    plan: FairSharePlan,
    demands: LeafDemands,
    capacity_by_type: Mapping[str, float],
    columns: ShareColumns,
) -> None:
    """Every queue's allowed demand (per type and in CU) and per-type claims into `columns`."""
    types = plan.type_names
    width = len(types)
    count = len(plan.names)
    capacity = np.array([capacity_by_type.get(t, 0.0) for t in types], dtype=float)
    type_cu = plan.type_cu
    type_limits = plan.type_limit_array
    limit_cu = plan.limit_cu_array
    allowed = np.zeros((count, width))
    allowed_cu = np.zeros(count)
    # A queue's types in the order of its allowed map, as one sortable number per type: its
    # own number, then the type's place in its map; the first child to hold a type, then its
    # place there, orders a parent's map.
    first_key = np.full((count, width), _ABSENT, dtype=np.intp)

    leaves = plan.leaf_numbers
    demand = demands.allocated + demands.pending
    bound = np.minimum(np.minimum(demand, capacity), type_limits[leaves])
    positive = bound > 0.0
    bound = np.where(positive, bound, 0.0)
    total = _ordered_sum(bound * type_cu, demands.order)
    allowed_cu[leaves] = np.where(limit_cu[leaves] < total, limit_cu[leaves], total)
    allowed[leaves] = bound
    first_key[leaves] = _keys(leaves, demands.order, positive)

    for level in plan.inner_levels:
        parents, holds, first, children_cu = _children_sums(level, allowed, first_key, allowed_cu)
        bound = np.minimum(np.minimum(capacity, holds), type_limits[parents])
        positive = bound > 0.0
        bound = np.where(positive, bound, 0.0)
        order = np.argsort(first, axis=1, kind="stable")
        total = _ordered_sum(bound * type_cu, order)
        total = np.where(children_cu < total, children_cu, total)
        allowed_cu[parents] = np.where(limit_cu[parents] < total, limit_cu[parents], total)
        allowed[parents] = bound
        first_key[parents] = _keys(parents, order, positive)

    columns.allowed_gpus = allowed
    columns.allowed_cu = allowed_cu.tolist()
    if plan.typed_leaves or plan.typed_inner:
        _claim_types(plan, allowed, columns)


def _ordered_sum(cu: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Each row's CU summed in its map's order (`order`: columns, `width` past the end), from
    0.0, a column at a time."""
    rows, width = cu.shape
    padded = np.concatenate([cu, np.zeros((rows, 1))], axis=1)
    picked = np.take_along_axis(padded, order, axis=1)
    total = np.zeros(rows)
    for place in range(width):
        total = total + picked[:, place]
    return total


def _keys(numbers: np.ndarray, order: np.ndarray, positive: np.ndarray) -> np.ndarray:
    """Each queue's sortable key of each type it holds (`first_key`), `_ABSENT` elsewhere."""
    rows, width = order.shape
    place = np.full((rows, width + 1), _ABSENT, dtype=np.intp)
    np.put_along_axis(place, order, np.arange(width, dtype=np.intp)[None, :], axis=1)
    place = place[:, :width]
    keys = numbers[:, None] * (width + 1) + np.where(positive, place, 0)
    return np.where(positive & (place < _ABSENT), keys, _ABSENT)


def _children_sums(
    level: InnerLevel,
    allowed: np.ndarray,
    first_key: np.ndarray,
    allowed_cu: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For every inner queue of one height: its children's per-type sums and CU sum, child by
    child in name order from 0.0, and the first key of each type among them."""
    starts = level.starts
    holds = 0.0 + allowed[starts]
    first = first_key[starts]
    children_cu = 0.0 + allowed_cu[starts]
    for k in range(1, len(level.live)):
        live = level.live[k]
        rows = starts[:live] + k
        holds[:live] += allowed[rows]
        np.minimum(first[:live], first_key[rows], out=first[:live])
        children_cu[:live] += allowed_cu[rows]
    if not level.long:
        return level.parents, holds, first, children_cu
    parents = [level.parents]
    all_holds, all_first, all_cu = [holds], [first], [children_cu]
    for parent, start, size in level.long:
        end = start + size
        parents.append(np.array([parent], dtype=np.intp))
        all_holds.append(np.add.accumulate(0.0 + allowed[start:end], axis=0)[-1:])
        all_first.append(first_key[start:end].min(axis=0, keepdims=True))
        all_cu.append(np.add.accumulate(0.0 + allowed_cu[start:end])[-1:])
    return (
        np.concatenate(parents),
        np.concatenate(all_holds),
        np.concatenate(all_first),
        np.concatenate(all_cu),
    )


def _claim_types(plan: FairSharePlan, allowed: np.ndarray, columns: ShareColumns) -> None:
    """Per-type claims of the queues whose subtree declares a per-type guarantee: a leaf's
    min(deserved GPUs, allowed demand) of each type it declares (dropped at 0); an inner
    queue's, its children's summed in name order, its own declarations replacing theirs.

    A queue's claims are worth at most its allowed demand in CU: a CU limit below the worth of
    its per-type quotas caps them too (the limit caps everything, DESIGN §3.1), each type
    shrunk in the same proportion."""
    column = {t: j for j, t in enumerate(plan.type_names)}
    compute_weights = plan.compute_weights
    allowed_cu = columns.allowed_cu

    def within_limit(i: int, claims: dict[str, float]) -> dict[str, float]:
        worth = math.fsum(gpus * compute_weights[t] for t, gpus in claims.items())
        if worth <= allowed_cu[i]:
            return claims
        scale = allowed_cu[i] / worth
        return {t: gpus * scale for t, gpus in claims.items()}

    claims_col = columns.claims_by_type
    deserved_of = plan.deserved_gpus_by_type
    leaves = plan.typed_leaves
    for i, row in zip(leaves, allowed[list(leaves)].tolist(), strict=True):
        deserved = deserved_of[i]
        assert deserved is not None
        own: dict[str, float] = {}
        for type_name, deserved_gpus in deserved.items():
            claim = min(deserved_gpus, row[column[type_name]])
            if claim > 0.0:
                own[type_name] = claim
        claims_col[i] = within_limit(i, own)
    inner = plan.typed_inner
    children = plan.children
    for i, row in zip(inner, allowed[list(inner)].tolist(), strict=True):
        claimed: dict[str, float] = {}
        for child in children[i] or ():
            child_claims = claims_col[child]
            if child_claims is not NO_GPUS:
                for type_name, gpus in child_claims.items():
                    claimed[type_name] = claimed.get(type_name, 0.0) + gpus
        for type_name, deserved_gpus in (deserved_of[i] or {}).items():
            claim = min(deserved_gpus, row[column[type_name]])
            if claim > 0.0:
                claimed[type_name] = claim
            else:
                claimed.pop(type_name, None)
        claims_col[i] = within_limit(i, claimed)
