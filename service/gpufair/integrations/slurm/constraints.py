"""A job's `--constraint` in gpufair's terms: the GPU types and GPU memory it may run on (pure).

Each name in the constraint is a GRES type of `gpu_types` (that GPU type) or a rule of `features`
(GPU types, a minimum GPU memory, or both); `a|b|c` asks for any one of them. A workload says one
(allowed GPU types AND minimum GPU memory), so an OR of alternatives becomes, in this order:

1. memory rules only, or typed rules asking at least the least memory of those: (any type, that
   least memory);
2. typed rules only, all asking one memory: (the union of their types, that memory);
3. anything else (e.g. `a100|gpumem40`): a set of GPU types and no memory rule, read off gpufair's
   own GPU types and their `memory_gib`: a type the bridge maps is allowed iff some alternative
   admits it (it names the type, or names no type, and the type's GPUs have its memory).

Forms 1 and 2 need no table, and keep admitting a GPU type gpufair declares later; form 3 is
fixed when the job is submitted. Each form admits exactly the types some alternative admits.

Refused, with the reason: `&`, brackets, counts and the like; names that are in neither
`gpu_types` nor `features`; a form 3 that no GPU type meets (an empty type list would mean any
type); one that lists more types than a workload may (64).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpufair.integrations.slurm.config import BridgeConfig

MAX_ALLOWED_GPU_TYPES = 64  # a workload's allowed_gpu_types (gpufair's input limit)
_EPS = 1e-9  # as gpufair compares GPU memory
_OPERATORS = "&[]*,()"

GpuMemory = Callable[[], Mapping[str, float]]  # gpufair GPU type -> memory of one GPU, GiB


@dataclass(frozen=True)
class GpuChoice:
    """What a workload says of GPUs: allowed types (empty = any) and minimum GPU memory."""

    types: frozenset[str] = frozenset()
    min_memory_gib: float = 0.0


@dataclass(frozen=True)
class _Alternative:
    types: frozenset[str]  # empty = any type
    min_memory_gib: float

    def admits(self, gpu_type: str, memory_gib: float) -> bool:
        typed = not self.types or gpu_type in self.types
        return typed and memory_gib >= self.min_memory_gib - _EPS


def _alternatives(config: BridgeConfig, features: str) -> list[_Alternative] | str:
    if any(op in features for op in _OPERATORS):
        return f"constraint {features!r}: only one feature or 'a|b' is supported"
    found: list[_Alternative] = []
    for name in features.split("|"):
        if name in config.gpu_types:
            found.append(_Alternative(frozenset({config.gpu_types[name]}), 0.0))
            continue
        rule = config.features.get(name)
        if rule is None:
            return f"constraint {name!r} is not in the bridge's features or gpu_types"
        found.append(_Alternative(frozenset(rule.gpu_types), rule.min_gpu_memory_gib))
    return found


def _without_table(alternatives: list[_Alternative]) -> GpuChoice | None:
    """Forms 1 and 2, when they apply."""
    untyped = [a.min_memory_gib for a in alternatives if not a.types]
    if untyped:
        least = min(untyped)
        if all(a.min_memory_gib >= least for a in alternatives):
            return GpuChoice(frozenset(), least)
        return None
    memories = {a.min_memory_gib for a in alternatives}
    if len(memories) == 1:
        return GpuChoice(frozenset().union(*(a.types for a in alternatives)), memories.pop())
    return None


def gpu_choice(
    config: BridgeConfig, features: str, gpu_memory: GpuMemory | None
) -> GpuChoice | str:
    """The GPUs a `--constraint` expression admits, or why no workload can say them.
    `gpu_memory` is asked only for form 3."""
    if not features:
        return GpuChoice()
    alternatives = _alternatives(config, features)
    if isinstance(alternatives, str):
        return alternatives
    simple = _without_table(alternatives)
    if simple is not None:
        return simple
    if gpu_memory is None:
        return f"constraint {features!r}: the GPU memory of each GPU type is not known"
    memory = gpu_memory()
    # Types gpufair does not declare cannot have nodes there: they are never admitted.
    mapped = sorted(t for t in set(config.gpu_types.values()) if t in memory)
    allowed = frozenset(t for t in mapped if any(a.admits(t, memory[t]) for a in alternatives))
    if not allowed:
        known = ", ".join(f"{t} {memory[t]:g} GiB" for t in mapped) or "none declared"
        return (
            f"constraint {features!r}: no GPU type the bridge maps meets any alternative "
            f"(gpufair's types: {known})"
        )
    if len(allowed) > MAX_ALLOWED_GPU_TYPES:
        return (
            f"constraint {features!r}: admits {len(allowed)} GPU types; a workload may list "
            f"{MAX_ALLOWED_GPU_TYPES}"
        )
    return GpuChoice(allowed, 0.0)
