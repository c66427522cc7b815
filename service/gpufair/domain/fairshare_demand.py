"""Leaf demands as columns, in a `FairSharePlan`'s leaf order (issue 17).

A recompute of 10,000 leaves used to hand the division 10,000 `QueueDemand`s, two maps each,
which the division then read one by one: most of a call's cost. `LeafDemands` holds the same
numbers as arrays, one row per leaf in the plan's `leaf_names` order and one column per GPU type
in its `type_names` order, so the division bounds and weighs every leaf's demand in a few array
operations (`fairshare_aggregate`). The recompute and the simulator build it straight from
their rows (`demand.leaf_demand_columns`); a caller with maps may still pass maps, which the
division converts (`from_maps`, the old per-leaf cost).

The order of a leaf's types is kept too (`order`): the division sums a queue's per-type CU in
the order of its maps (allocated types, then types only pending), as it always has, and float
sums depend on their order. With it, a division on columns gives the numbers a division on the
equal maps gives, to the last bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from gpufair.domain.model import frozen_map


@dataclass(frozen=True, slots=True)
class QueueDemand:
    """A leaf queue's work in the pool, in GPUs per type (fractions allowed).

    Pending work that may run on several types is counted on the type placement would choose
    (DESIGN §4.2: the cheapest that serves it); the engine cannot guess it.
    """

    allocated_gpus_by_type: Mapping[str, float] = field(default_factory=frozen_map)
    pending_gpus_by_type: Mapping[str, float] = field(default_factory=frozen_map)


@dataclass(frozen=True, slots=True, eq=False)
class LeafDemands:
    """Every leaf's demand, a row per leaf (`leaves`), a column per GPU type (`types`).

    `allocated` and `pending` hold GPUs (0 where a leaf's map has no entry); row i's map order
    is `order[i]`: the column of each of its types, its allocated types first (the first
    `allocated_count[i]`), then the types it only waits for, `len(types)` past the end.
    Values are finite and ≥ 0 (`valid`). Build with `from_maps` or `demand.leaf_demand_columns`.
    """

    leaves: tuple[str, ...]
    types: tuple[str, ...]
    allocated: np.ndarray  # (leaves, types)
    pending: np.ndarray  # (leaves, types)
    order: np.ndarray  # (leaves, types) column numbers, len(types) past a leaf's last type
    allocated_count: np.ndarray  # (leaves,)

    @classmethod
    def from_maps(
        cls,
        leaves: tuple[str, ...],
        types: tuple[str, ...],
        demands: Mapping[str, QueueDemand],
    ) -> LeafDemands | None:
        """The columns of `demands` by leaf name, or None if any entry names a queue outside
        `leaves` or a type outside `types`, or holds a number that is not finite and ≥ 0 (the
        division then words what is wrong from the maps)."""
        width = len(types)
        column = {t: j for j, t in enumerate(types)}
        allocated = [0.0] * (len(leaves) * width)
        pending = [0.0] * (len(leaves) * width)
        order = [width] * (len(leaves) * width)
        counts = [0] * len(leaves)
        found = 0
        inf = math.inf
        try:
            for row, name in enumerate(leaves):
                demand = demands.get(name)
                if demand is None:
                    continue
                found += 1
                base = row * width
                at = base
                for type_name, gpus in demand.allocated_gpus_by_type.items():
                    j = column[type_name]
                    if not 0.0 <= gpus < inf:
                        return None
                    allocated[base + j] = gpus
                    order[at] = j
                    at += 1
                counts[row] = at - base
                for type_name, gpus in demand.pending_gpus_by_type.items():
                    j = column[type_name]
                    if not 0.0 <= gpus < inf:
                        return None
                    pending[base + j] = gpus
                    if type_name not in demand.allocated_gpus_by_type:
                        order[at] = j
                        at += 1
        except KeyError:  # an unknown type
            return None
        if found != len(demands):  # a demand for a queue that is not a leaf here
            return None
        shape = (len(leaves), width)
        return cls(
            leaves=leaves,
            types=types,
            allocated=np.array(allocated, dtype=float).reshape(shape),
            pending=np.array(pending, dtype=float).reshape(shape),
            order=np.array(order, dtype=np.intp).reshape(shape),
            allocated_count=np.array(counts, dtype=np.intp),
        )

    def valid(self) -> bool:
        """Every number finite and ≥ 0."""
        return bool(
            np.isfinite(self.allocated).all()
            and np.isfinite(self.pending).all()
            and (self.allocated >= 0.0).all()
            and (self.pending >= 0.0).all()
        )

    def as_maps(self) -> dict[str, QueueDemand]:
        """The same demands as maps (a leaf without any entry left out): for a division whose
        plan orders leaves or types otherwise, and to word what is wrong with invalid ones."""
        maps = {}
        for row, name in enumerate(self.leaves):
            allocated, demand = self.row_maps(row)
            if not demand:
                continue
            held = set(allocated)
            pending = {
                t: float(self.pending[row, self.types.index(t)])
                for t in demand
                if t not in held or self.pending[row, self.types.index(t)] != 0.0
            }
            maps[name] = QueueDemand(allocated, pending)
        return maps

    def row_maps(self, row: int) -> tuple[dict[str, float], dict[str, float]]:
        """Leaf `row`'s allocation and demand (allocated + pending) by type, in its map order."""
        types = self.types
        columns = [j for j in self.order[row].tolist() if j < len(types)]
        held = columns[: int(self.allocated_count[row])]
        allocated_row = self.allocated[row].tolist()
        pending_row = self.pending[row].tolist()
        allocated = {types[j]: allocated_row[j] for j in held}
        demand = {types[j]: allocated_row[j] + pending_row[j] for j in columns}
        return allocated, demand
