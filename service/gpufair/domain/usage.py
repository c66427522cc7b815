"""Decayed usage and capacity integrals over piecewise-constant timelines (DESIGN §3.3).

A timeline is a collection of `Segment(start_s, end_s, value)`: `value` CU held over
[start_s, end_s). Segments may overlap and then add up, so a leaf queue's allocation timeline can
be its workloads' allocation intervals as they are, and a pool's capacity timeline its nodes'.

The decayed integral of a timeline a(t) at instant `now` is

    I = ∫ a(t) · 2^(-(now - t) / h) dt   over   [lo, hi) = window_bounds(now, policy),

with weight 1 instead of the power when the policy has no half-life. Every integral here is the
closed form of that expression on each constant piece — never sampled — so a recompute every
minute and a report a month later agree to float precision.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias, TypeVar

from gpufair.domain.errors import InvalidInputError, Violation
from gpufair.domain.model import (
    Division,
    FairSharePolicy,
    GpuType,
    Queue,
    UsageBasis,
    WindowKind,
    frozen_map,
)
from gpufair.domain.policy import deserved_cu_with_types
from gpufair.domain.tree import QueueTree

_LN2 = math.log(2.0)


@dataclass(frozen=True, slots=True)
class Segment:
    """`value` (CU) held over [start_s, end_s); `end_s` may be math.inf for an open interval."""

    start_s: float
    end_s: float
    value: float


Timeline: TypeAlias = Sequence[Segment]
K = TypeVar("K")

Piece: TypeAlias = tuple[float, float, float]  # (start_s, end_s, value): one constant stretch


@dataclass(frozen=True, slots=True)
class UsageInputs:
    """What the fair-share engine needs from history, for one pool at one instant.

    `usage_cu_s[q]` is queue q's decayed usage (CU·s, weighted by the decay); a missing queue has
    none. `group_capacity_cu_s[parent]` is the decayed capacity the children of `parent` (None:
    the top level) competed for; missing or 0 means no history, and U' = 0 for that group.
    """

    usage_cu_s: Mapping[str, float] = field(default_factory=frozen_map)
    group_capacity_cu_s: Mapping[str | None, float] = field(default_factory=frozen_map)


def _finite_entries(name: str, entries: Mapping[K, float], dropped: list[str]) -> dict[K, float]:
    kept: dict[K, float] = {}
    for key, value in entries.items():
        if math.isfinite(value) and value >= 0.0:
            kept[key] = value
        else:
            dropped.append(f"{name}[{key!r}] = {value!r}")
    return kept


def finite_usage(usage: UsageInputs) -> tuple[UsageInputs, list[str]]:
    """`usage` without the entries that are not finite numbers >= 0, and what was dropped, in
    words. The engine refuses such input outright; history stored before the input limits may
    still hold it, and must not make the pool unschedulable: a dropped entry counts as no
    history (U' = 0 for that queue or group)."""
    dropped: list[str] = []
    usage_cu_s = _finite_entries("usage_cu_s", usage.usage_cu_s, dropped)
    capacity = _finite_entries("group_capacity_cu_s", usage.group_capacity_cu_s, dropped)
    if not dropped:
        return usage, []
    cleaned = UsageInputs(
        usage_cu_s=frozen_map(usage_cu_s), group_capacity_cu_s=frozen_map(capacity)
    )
    return cleaned, [f"decayed usage not finite, treated as no history: {', '.join(dropped)}"]


def window_bounds(now_s: float, policy: FairSharePolicy) -> tuple[float, float]:
    """The stretch of history that counts at `now_s`, as (lo_s, hi_s) with hi_s = now_s.

    Sliding: the last `window_s`. Tumbling: from the latest boundary `window_anchor_unix_s + n ·
    window_s` at or before now, so usage restarts at each boundary. None: all history
    (lo_s = -inf), which only stays finite with a half-life or finite timelines.

    The `kai` division takes KAI-Scheduler's tumbling boundary instead: the latest boundary
    strictly before now, so at the exact instant of a boundary the period that just ended still
    counts, and before (or at) the anchor the window is empty (lo_s = now_s).
    """
    if policy.window_kind == WindowKind.SLIDING:
        return now_s - policy.window_s, now_s
    if policy.window_kind == WindowKind.TUMBLING:
        if policy.division == Division.KAI:
            return _kai_tumbling_start(now_s, policy), now_s
        # Python's float modulo is non-negative for a positive period, also before the anchor.
        elapsed_s = (now_s - policy.window_anchor_unix_s) % policy.window_s
        return now_s - elapsed_s, now_s
    return -math.inf, now_s


def _kai_tumbling_start(now_s: float, policy: FairSharePolicy) -> float:
    """KAI-Scheduler's latest usage reset: the anchor, moved on by whole periods while the next
    boundary is strictly before now; now itself when the anchor is not yet past."""
    anchor_s = policy.window_anchor_unix_s
    if now_s <= anchor_s:
        return now_s
    elapsed_s = (now_s - anchor_s) % policy.window_s
    return now_s - (policy.window_s if elapsed_s == 0.0 else elapsed_s)


def decayed_segment_integral(
    start_s: float, end_s: float, value: float, now_s: float, half_life_s: float | None
) -> float:
    """∫_{start_s}^{end_s} value · 2^(-(now_s - t) / half_life_s) dt, in closed form.

    With h = half_life_s and r = ln 2 / h:

        value / r · 2^(-(now - end) / h) · (1 - 2^(-(end - start) / h))

    written with expm1 so short stretches keep full precision. Without a half-life the weight is
    1: value · (end - start). The caller clips to `window_bounds`; `start_s` may be -inf with a
    half-life. Meant for end_s ≤ now_s (later instants would weigh more than 1).
    """
    if end_s < start_s:
        raise ValueError(f"segment ends before it starts: [{start_s}, {end_s})")
    if value == 0.0 or end_s == start_s:
        return 0.0
    if half_life_s is None:
        return value * (end_s - start_s)
    rate = _LN2 / half_life_s
    return value / rate * math.exp(-rate * (now_s - end_s)) * -math.expm1(-rate * (end_s - start_s))


def _clipped_integral(pieces: Iterable[Piece], now_s: float, policy: FairSharePolicy) -> float:
    lo_s, hi_s = window_bounds(now_s, policy)
    parts = []
    for start_s, end_s, value in pieces:
        clipped_start_s = max(start_s, lo_s)
        clipped_end_s = min(end_s, hi_s)
        if clipped_start_s < clipped_end_s:
            parts.append(
                decayed_segment_integral(
                    clipped_start_s, clipped_end_s, value, now_s, policy.half_life_s
                )
            )
    return math.fsum(parts)


def decayed_integral(timeline: Timeline, now_s: float, policy: FairSharePolicy) -> float:
    """The decayed integral of `timeline` over the policy's window at `now_s` (module formula)."""
    return _clipped_integral(((s.start_s, s.end_s, s.value) for s in timeline), now_s, policy)


def keyed_step_pieces(
    segments: Iterable[tuple[float, float, K, float]],
) -> list[tuple[float, float, dict[K, float]]]:
    """Overlapping (start_s, end_s, key, value) stretches merged, per key, into the stretches
    over which every key's sum is constant: the one sweep line of the domain.

    Each stretch carries the sum of each key that has a segment covering it (keys with none are
    left out, stretches with no key at all dropped). A key whose last segment has ended is
    forgotten, so it comes back from exactly 0: adding and removing the same values leaves float
    dust.
    """
    events: list[tuple[float, K, float, int]] = []
    for start_s, end_s, key, value in segments:
        events.append((start_s, key, value, 1))
        events.append((end_s, key, -value, -1))
    events.sort(key=_at)
    level: dict[K, float] = {}
    active: dict[K, int] = {}
    pieces: list[tuple[float, float, dict[K, float]]] = []
    count = len(events)
    index = 0
    while index < count:
        at_s = events[index][0]
        while index < count and events[index][0] == at_s:
            _, key, delta, opens = events[index]
            still = active.get(key, 0) + opens
            if still:
                active[key] = still
                level[key] = level.get(key, 0.0) + delta
            else:
                del active[key]
                del level[key]
            index += 1
        if level and index < count:
            pieces.append((at_s, events[index][0], level.copy()))
    return pieces


def _at(event: tuple[float, object, float, int]) -> float:
    return event[0]


def step_pieces(segments: Iterable[Piece], lo_s: float, hi_s: float) -> list[Piece]:
    """Overlapping (start_s, end_s, value) stretches merged into the constant pieces of their sum.

    Only [lo_s, hi_s) is kept, and stretches no segment covers are dropped. The pieces are what a
    non-linear function of the sum — max(0, allocation - deserved) — must be applied to: applying
    it per input segment would be wrong whenever segments overlap.
    """
    clipped = [
        (max(start_s, lo_s), min(end_s, hi_s), None, value)
        for start_s, end_s, value in segments
        if max(start_s, lo_s) < min(end_s, hi_s) and value != 0.0
    ]
    return [(start_s, end_s, sums[None]) for start_s, end_s, sums in keyed_step_pieces(clipped)]


def _over(pieces: Iterable[Piece], threshold: float) -> list[Piece]:
    return [(s, e, max(0.0, value - threshold)) for s, e, value in pieces]


def usage_inputs(
    *,
    pool: str,
    policy: FairSharePolicy,
    queues: Sequence[Queue],
    gpu_types: Mapping[str, GpuType],
    leaf_allocations: Mapping[str, Timeline],
    capacity: Timeline,
    now_s: float,
) -> UsageInputs:
    """The usage numerators and group-capacity denominators for `compute_fair_shares`.

    `leaf_allocations[q]` is leaf q's CU allocation timeline in `pool`; an inner queue's
    allocation is the sum of its children's. `capacity` is the pool's CU capacity timeline.
    Deserved quotas are today's (`deserved_cu_with_types` in `pool`), applied to all history.

    `usage_basis: over_quota` (DESIGN §3.3): usage_q = ∫ max(0, alloc_q(t) - deserved_q); the
    top-level group competed for ∫ max(0, capacity(t) - Σ top-level deserved), the children of p
    for ∫ max(0, alloc_p(t) - Σ children's deserved). `total`: usage_q = ∫ alloc_q(t) and every
    group's capacity is ∫ capacity(t). All integrals decayed and windowed as `decayed_integral`,
    each max(0, ·) taken on the merged change points of the sum it clamps.
    """
    tree = QueueTree.build(queues)
    bad = [
        Violation(f'["{name}"]', "allocation timeline given for an unknown or inner queue")
        for name in leaf_allocations
        if name not in tree.queues or not tree.is_leaf(name)
    ]
    if bad:
        raise InvalidInputError(bad)
    lo_s, hi_s = window_bounds(now_s, policy)
    pieces_by_queue: dict[str, list[Piece]] = {}
    for name in tree.postorder():
        if tree.is_leaf(name):
            raw: Iterable[Piece] = (
                (s.start_s, s.end_s, s.value) for s in leaf_allocations.get(name, ())
            )
        else:
            raw = (p for child in tree.children_of(name) for p in pieces_by_queue[child])
        pieces_by_queue[name] = step_pieces(raw, lo_s, hi_s)
    capacity_pieces = step_pieces(((s.start_s, s.end_s, s.value) for s in capacity), lo_s, hi_s)

    usage: dict[str, float] = {}
    group_capacity: dict[str | None, float] = {}
    if policy.usage_basis == UsageBasis.TOTAL:
        pool_capacity = _clipped_integral(capacity_pieces, now_s, policy)
        for name, pieces in pieces_by_queue.items():
            usage[name] = _clipped_integral(pieces, now_s, policy)
        for group in tree.inner_groups():
            group_capacity[group] = pool_capacity
        return UsageInputs(usage_cu_s=usage, group_capacity_cu_s=group_capacity)

    compute_weights = {name: t.compute_weight for name, t in gpu_types.items()}
    deserved = {
        name: deserved_cu_with_types(queue.quota(pool), compute_weights)
        for name, queue in tree.queues.items()
    }
    for name, pieces in pieces_by_queue.items():
        usage[name] = _clipped_integral(_over(pieces, deserved[name]), now_s, policy)
    for group in tree.inner_groups():
        children_deserved = math.fsum(deserved[c] for c in tree.children_of(group))
        held = capacity_pieces if group is None else pieces_by_queue[group]
        group_capacity[group] = _clipped_integral(_over(held, children_deserved), now_s, policy)
    return UsageInputs(usage_cu_s=usage, group_capacity_cu_s=group_capacity)


# Rebase a running integral's reference instant once now is this many half-lives past it: its
# terms stay below 2^64 times their value at the reference (far from overflow).
_REBASE_HALF_LIVES = 64.0


def _add_exact(partials: list[float], x: float) -> None:
    """Add `x` to the float expansion `partials` without rounding (Shewchuk's non-overlapping
    partials, the method of `math.fsum`): the expansion's exact sum gains exactly x, so taking
    away a term added earlier leaves no residue."""
    kept = 0
    for partial in partials:
        big, small = (partial, x) if abs(x) < abs(partial) else (x, partial)
        x = big + small
        low = small - (x - big)
        if low:
            partials[kept] = low
            kept += 1
    del partials[kept:]
    partials.append(x)


class RunningIntegral:
    """The decayed integral of one step function x(t), fed as time passes and read at any later
    instant over a window [lo_s, now_s): the number `decayed_integral` gives for the same stretches
    and window, to float precision, at a cost that does not grow with the history.

    x(t) is given by `set(at_s, value)` at non-decreasing instants (a second `set` at one instant
    revises the first). Each closed stretch [start, end) of value v ≠ 0 adds one term, its integral
    weighted as at a reference instant `ref`,

        T = ∫_start^end v · 2^(-(ref - t) / h) dt      (v · (end - start) without a half-life),

    to an exact running sum (`_add_exact`); at `now` the stretches count T · 2^(-(now - ref) / h).
    `read(now_s, lo_s)` first drops the stretches that ended at or before `lo_s` (taking their
    terms away exactly), replaces the term of one that straddles `lo_s` by its clipped integral,
    and adds the open stretch [since, now) clipped to the window. Reads must come at
    non-decreasing `lo_s` (true of every window kind as now advances): a dropped stretch never
    counts again. With `windowed=False` (window kind `none`, lo_s = -inf) nothing is ever
    dropped, so stretches are folded into the sum without being kept.

    `ref` moves to the instant of a read or change once it lags by `_REBASE_HALF_LIVES` half-lives, the
    kept terms taken again against it: their size stays within 2^64 of each other.
    """

    __slots__ = (
        "_half_life_s",
        "_partials",
        "_pieces",
        "_ref_s",
        "_since_s",
        "_value",
        "_windowed",
    )

    def __init__(self, half_life_s: float | None, *, windowed: bool = True) -> None:
        self._half_life_s = half_life_s
        self._windowed = windowed
        self._since_s = -math.inf
        self._value = 0.0
        self._pieces: deque[tuple[float, float, float, float]] = deque()  # start, end, v, term
        self._partials: list[float] = []
        self._ref_s = 0.0

    @property
    def value(self) -> float:
        """x(t) now: the value of the latest `set`."""
        return self._value

    def set(self, at_s: float, value: float) -> None:
        """x(t) = `value` from `at_s` on; `at_s` is never before the latest `set`."""
        if at_s < self._since_s:
            raise ValueError(f"set at {at_s} before the latest change at {self._since_s}")
        if at_s > self._since_s:
            if value == self._value:
                return  # the stretch runs on
            self._rebase_if_due(at_s)
            if self._value != 0.0:
                term = self._term(self._since_s, at_s, self._value)
                if self._windowed:
                    self._pieces.append((self._since_s, at_s, self._value, term))
                _add_exact(self._partials, term)
            self._since_s = at_s
        self._value = value

    def _term(self, start_s: float, end_s: float, value: float) -> float:
        if self._half_life_s is None:
            return value * (end_s - start_s)
        rate = _LN2 / self._half_life_s
        return (
            value
            / rate
            * math.exp(rate * (end_s - self._ref_s))
            * -math.expm1(-rate * (end_s - start_s))
        )

    def _rebase_if_due(self, now_s: float) -> None:
        half_life_s = self._half_life_s
        if half_life_s is not None and now_s - self._ref_s > _REBASE_HALF_LIVES * half_life_s:
            self._rebase(now_s)

    def _rebase(self, now_s: float) -> None:
        if self._windowed:
            self._ref_s = now_s
            self._pieces = deque((s, e, v, self._term(s, e, v)) for s, e, v, _ in self._pieces)
            self._partials = []
            for *_, term in self._pieces:
                _add_exact(self._partials, term)
            return
        assert self._half_life_s is not None
        scale = math.exp(-_LN2 / self._half_life_s * (now_s - self._ref_s))
        self._partials = [math.fsum(self._partials) * scale]
        self._ref_s = now_s

    def read(self, now_s: float, lo_s: float) -> float:
        """∫ x(t) · 2^(-(now_s - t) / h) dt over [lo_s, now_s) (class docstring); `now_s` is not
        before the latest `set`."""
        self._rebase_if_due(now_s)
        half_life_s = self._half_life_s
        pieces = self._pieces
        partials = self._partials
        while pieces and pieces[0][1] <= lo_s:
            _add_exact(partials, -pieces.popleft()[3])
        parts = []
        closed = partials
        if pieces and pieces[0][0] < lo_s:
            start_s, end_s, value, term = pieces[0]
            closed = [*partials, -term]
            parts.append(decayed_segment_integral(lo_s, end_s, value, now_s, half_life_s))
        scale = 1.0
        if half_life_s is not None:
            scale = math.exp(-_LN2 / half_life_s * (now_s - self._ref_s))
        parts.append(math.fsum(closed) * scale)
        start_s = max(self._since_s, lo_s)
        if self._value != 0.0 and start_s < now_s:
            parts.append(decayed_segment_integral(start_s, now_s, self._value, now_s, half_life_s))
        return math.fsum(parts)
