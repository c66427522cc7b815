"""Topology levels with fallback (DESIGN §4.2, rule 4): which domains a gang may go into, from
the smallest up.

A pool may declare an ordered list of node-label keys, smallest domain first, e.g.
`nvlink-domain` → `rack` → `zone` (`NodePool.topology_levels`). A gang goes into the smallest
domain that holds it: every level is tried in turn, and inside a level the domain that holds the
gang with the least room to spare (binpack) or the most (spread). When no domain of any level
holds it, it is placed on the pool as a whole. A workload's own `TopologyConstraint(level)`:

- `required`: the levels up to and including `level` are tried, and no further: a gang that no
  such domain holds is not placed (its `level` bounds how far it may go);
- preferred: as without a constraint (the pool's ladder, then the pool); the constraint only
  names a level the gang would like to stay within, which the ladder reaches anyway.

A constraint on a level the pool does not list is a ladder of that one level (the behaviour of a
pool without levels). Nodes without a level's label belong to no domain of that level.

Before splitting a multi-pod gang over several nodes, binpack placement puts it on one node that
holds it whole, the one with the least room to spare (`one_node`): a node is the smallest domain
of all. Spread placement spreads by design and skips this.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufair.domain.model import TopologyConstraint


@dataclass(frozen=True, slots=True)
class Ladder:
    """The levels to try, smallest first, and whether the gang may go wider than the last."""

    levels: tuple[str, ...]
    bounded: bool


UNCONSTRAINED = Ladder((), False)


def ladder(pool_levels: tuple[str, ...], constraint: TopologyConstraint | None) -> Ladder:
    """The levels a gang tries in a pool with `pool_levels` (see the module docstring)."""
    if constraint is None:
        return Ladder(pool_levels, False) if pool_levels else UNCONSTRAINED
    if constraint.level not in pool_levels:
        return Ladder((constraint.level,), constraint.required)
    if not constraint.required:
        return Ladder(pool_levels, False)
    return Ladder(pool_levels[: pool_levels.index(constraint.level) + 1], True)
