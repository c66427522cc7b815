"""Exact weighted water-filling: the closed form of DESIGN §3.2's rounds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WaterFill:
    shares: list[float]  # what each item receives
    capped: list[bool]  # True: the item received exactly its cap
    leftover: float  # amount no positive-weight item could take


def water_fill(amount: float, weights: Sequence[float], caps: Sequence[float]) -> WaterFill:
    """Divide `amount` in proportion to `weights`, nobody above their cap.

    The rounds of DESIGN §3.2 (split by weight; a satisfied item keeps its cap; the leftover goes
    round again) converge to one water level λ: item i gets min(cap_i, λ · w_i) with
    Σ_i min(cap_i, λ · w_i) = amount, or its cap when the amount covers every cap. Sorting by
    cap_i / w_i finds λ in one pass, O(n log n), with no tolerance loop: items are visited from
    the lowest ratio; one whose ratio is at or below the level the remaining items would share
    takes its cap, and the first one above it fixes λ for all the rest.

    Items with weight 0 get nothing (the caller decides what they may have of the leftover), and
    so do items with cap ≤ 0. Capped items receive their cap exactly, not a float near it.
    """
    count = len(weights)
    shares = [0.0] * count
    capped = [False] * count
    leftover = water_fill_into(amount, range(count), weights, caps, shares, capped)
    return WaterFill(shares=shares, capped=capped, leftover=leftover)


def water_fill_into(
    amount: float,
    items: Sequence[int],
    weights: Sequence[float],
    caps: Sequence[float],
    shares: list[float],
    capped: list[bool],
) -> float:
    """`water_fill` of `amount` over `items`, numbers into the caller's lists, with no list or
    record per call beyond the sort; returns the leftover.

    `weights[p]` is the weight of the p-th item; `caps`, `shares` and `capped` are indexed by
    the item (`items[p]`), so one sibling group's lists serve each of its tiers. Every item's
    share and flag are written (0 and False for an item given nothing).
    """
    # (ratio, p, ...) tuples sort as the items by ratio would, ties in item order.
    by_ratio = []
    for position, item in enumerate(items):
        weight = weights[position]
        cap = caps[item]
        shares[item] = 0.0
        capped[item] = False
        if weight > 0.0 and cap > 0.0:
            by_ratio.append((cap / weight, position, item, weight, cap))
    by_ratio.sort()
    # Suffix sums rather than a running difference: subtracting weights one by one drifts, and the
    # last few items would then share an amount divided by a float residue.
    weight_after = [0.0] * (len(by_ratio) + 1)
    total = 0.0
    for place in range(len(by_ratio) - 1, -1, -1):
        total = total + by_ratio[place][3]
        weight_after[place] = total
    remaining = amount
    for place, (_, _, item, weight, cap) in enumerate(by_ratio):
        level = remaining / weight_after[place]
        if cap <= level * weight:
            shares[item] = cap
            capped[item] = True
            remaining -= cap
            continue
        for _, _, rest, rest_weight, _ in by_ratio[place:]:
            shares[rest] = level * rest_weight
        return 0.0
    return max(0.0, remaining)
