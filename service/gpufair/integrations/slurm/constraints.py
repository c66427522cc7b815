"""A job's `--constraint` in gpufair's terms: the GPU types and GPU memory it may run on (pure).

Each name in the constraint is a GRES type of `gpu_types` (that GPU type) or a rule of `features`
(GPU types, a minimum GPU memory, or both). Names are joined as Slurm joins them: `a&b` (or
`a,b`, which Slurm turns into `a&b`) asks for both, `a|b` for either, strictly from left to right
with no precedence (`a|b&c` is `(a|b)&c`, `a&b|c` is `(a&b)|c`), and one level of parentheses
groups (`a&(b|c)`). Slurm ignores one operator at the very end (`a&`); so does the bridge.

The expression becomes an OR of alternatives, each one (GPU types, minimum GPU memory): a name is
one alternative, `x|y` joins the alternatives of both sides, `x&y` pairs each alternative of `x`
with each of `y` (the types both allow, the larger memory). An alternative whose types exclude
each other (`a100&rtx4090`) admits nothing and is dropped; one that another admits wholly (`a100`
beside `a100&gpumem80`) is dropped too. A workload says one (allowed GPU types AND minimum GPU
memory), so the OR that is left becomes, in this order:

1. memory rules only, or typed rules asking at least the least memory of those: (any type, that
   least memory);
2. typed rules only, all asking one memory: (the union of their types, that memory);
3. anything else (e.g. `a100|gpumem40`): a set of GPU types and no memory rule, read off gpufair's
   own GPU types and their `memory_gib`: a type the bridge maps is allowed iff some alternative
   admits it (it names the type, or names no type, and the type's GPUs have its memory).

Forms 1 and 2 need no table, and keep admitting a GPU type gpufair declares later; form 3 is
fixed when the job is submitted. Each form admits exactly the types some alternative admits.

Refused, with the reason: brackets (`[a|b]`, `[a*2&b*2]`) and node counts (`a*2`), which ask
something of the job's nodes together where a workload asks the same of every pod; malformed
expressions (nested parentheses, `a||b`, unbalanced parentheses, a name right after `)`); names
that are in neither `gpu_types` nor `features`; an expression whose every alternative names
types that exclude each other; a form 3 that no GPU type meets (an empty type list would mean any
type); one that lists more types than a workload may (64).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpufair.integrations.slurm.config import BridgeConfig

MAX_ALLOWED_GPU_TYPES = 64  # a workload's allowed_gpu_types (gpufair's input limit)
MAX_ALTERNATIVES = 256  # after dropping the redundant ones; beyond, the job is refused
_EPS = 1e-9  # as gpufair compares GPU memory
_TOKEN = re.compile(r"[&|,()]|[^&|,()]+")

GpuMemory = Callable[[], Mapping[str, float]]  # gpufair GPU type -> memory of one GPU, GiB


@dataclass(frozen=True)
class GpuChoice:
    """What a workload says of GPUs: allowed types (empty = any) and minimum GPU memory."""

    types: frozenset[str] = frozenset()
    min_memory_gib: float = 0.0


@dataclass(frozen=True)
class _Alternative:
    types: frozenset[str] | None  # None = any type; empty = no type at all
    min_memory_gib: float

    def admits(self, gpu_type: str, memory_gib: float) -> bool:
        typed = self.types is None or gpu_type in self.types
        return typed and memory_gib >= self.min_memory_gib - _EPS

    def both(self, other: _Alternative) -> _Alternative:
        """What a node must meet to meet both."""
        if self.types is None:
            types = other.types
        elif other.types is None:
            types = self.types
        else:
            types = self.types & other.types
        return _Alternative(types, max(self.min_memory_gib, other.min_memory_gib))

    def covers(self, other: _Alternative) -> bool:
        """Every GPU type `other` admits, whatever its memory, this one admits too."""
        typed = self.types is None or (other.types is not None and other.types <= self.types)
        return typed and self.min_memory_gib <= other.min_memory_gib


_Alternatives = list[_Alternative]


def _reduced(alternatives: _Alternatives) -> _Alternatives:
    """The same OR without alternatives that admit nothing or that another one covers (of equal
    ones, the first stays)."""
    live = [a for a in alternatives if a.types is None or a.types]
    kept: _Alternatives = []
    for i, a in enumerate(live):
        if any(b.covers(a) and (not a.covers(b) or j < i) for j, b in enumerate(live) if j != i):
            continue
        kept.append(a)
    return kept


def _joined(left: _Alternatives | None, op: str, right: _Alternatives) -> _Alternatives:
    if left is None:
        return right
    if op == "|":
        return _reduced(left + right)
    return _reduced([a.both(b) for a in left for b in right])


def _name(config: BridgeConfig, name: str) -> _Alternatives | str:
    if name in config.gpu_types:
        return [_Alternative(frozenset({config.gpu_types[name]}), 0.0)]
    rule = config.features.get(name)
    if rule is None:
        return f"constraint {name!r} is not in the bridge's features or gpu_types"
    return [_Alternative(frozenset(rule.gpu_types) or None, rule.min_gpu_memory_gib)]


def _alternatives(config: BridgeConfig, features: str) -> _Alternatives | str:
    """The OR of alternatives `features` asks for (left to right, as Slurm reads it), or why
    there is none a workload can say."""
    if "[" in features or "]" in features:
        return (
            f"constraint {features!r}: brackets are not supported: they ask for one alternative "
            "shared by all the job's nodes or a count of nodes per feature, and a workload asks "
            "the same GPUs of every pod"
        )
    if "*" in features:
        return (
            f"constraint {features!r}: node counts ('*N') are not supported: they ask for a mix "
            "of nodes, and a workload asks the same GPUs of every pod"
        )

    def bad(why: str) -> str:
        return f"constraint {features!r}: not a constraint the bridge can read ({why})"

    tokens = ["&" if t == "," else t for t in _TOKEN.findall(features)]
    if tokens and tokens[-1] in ("&", "|"):
        tokens.pop()  # Slurm ignores one operator at the very end
    value: _Alternatives | None = None
    group: _Alternatives | None = None
    op = group_op = "&"
    in_group, want_name = False, True
    for token in tokens:
        if want_name:
            if token == "(":
                if in_group:
                    return bad("nested parentheses")
                in_group, group, group_op = True, None, "&"
                continue
            if token in ("&", "|", ")"):
                return bad(f"{token!r} where a feature name belongs")
            named = _name(config, token)
            if isinstance(named, str):
                return named
            if in_group:
                group = _joined(group, group_op, named)
            else:
                value = _joined(value, op, named)
            want_name = False
        elif token == ")":
            if not in_group or group is None:
                return bad("')' without '('")
            in_group = False
            value = _joined(value, op, group)
        elif token in ("&", "|"):
            if in_group:
                group_op = token
            else:
                op = token
            want_name = True
        else:
            return bad(f"{token!r} where an operator belongs")
        for part in (value, group):
            if part is not None and len(part) > MAX_ALTERNATIVES:
                return bad(f"more than {MAX_ALTERNATIVES} alternatives")
    if in_group:
        return bad("'(' without ')'")
    if want_name or value is None:
        return bad("a feature name is missing")
    if not value:
        return (
            f"constraint {features!r}: no GPU type meets it: each alternative asks for GPU "
            "types that exclude each other"
        )
    return value


def _without_table(alternatives: _Alternatives) -> GpuChoice | None:
    """Forms 1 and 2, when they apply."""
    untyped = [a.min_memory_gib for a in alternatives if a.types is None]
    if untyped:
        least = min(untyped)
        if all(a.min_memory_gib >= least for a in alternatives):
            return GpuChoice(frozenset(), least)
        return None
    memories = {a.min_memory_gib for a in alternatives}
    if len(memories) == 1:
        return GpuChoice(
            frozenset().union(*(a.types for a in alternatives if a.types)), memories.pop()
        )
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
