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
    # (ratio, index) pairs sort as the indices by ratio would, ties in index order.
    by_ratio = sorted(
        [
            (c / w, i)
            for i, (w, c) in enumerate(zip(weights, caps, strict=True))
            if w > 0.0 and c > 0.0
        ]
    )
    order = [i for _, i in by_ratio]
    # Suffix sums rather than a running difference: subtracting weights one by one drifts, and the
    # last few items would then share an amount divided by a float residue.
    weight_after = [0.0] * (len(order) + 1)
    for position in range(len(order) - 1, -1, -1):
        weight_after[position] = weight_after[position + 1] + weights[order[position]]
    remaining = amount
    for position, i in enumerate(order):
        level = remaining / weight_after[position]
        if caps[i] <= level * weights[i]:
            shares[i] = caps[i]
            capped[i] = True
            remaining -= caps[i]
            continue
        for j in order[position:]:
            shares[j] = level * weights[j]
        return WaterFill(shares=shares, capped=capped, leftover=0.0)
    return WaterFill(shares=shares, capped=capped, leftover=max(0.0, remaining))
