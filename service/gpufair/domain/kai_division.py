"""Over-quota division by KAI-Scheduler's rules: the `kai` division profile (issue 22).

One sibling group's over-quota capacity — what is left after the guarantees — divided the way
KAI-Scheduler's proportion plugin divides it, so that teams moving from it find the numbers they
know (docs/kai-compatibility.md lists every difference from the `gpufair` profile):

- Priority tiers, highest first; each tier runs rounds until nothing is left or no queue of the
  tier was satisfied in the last round.
- Every round recomputes the weights over the tier's queues still unsatisfied:
  W' = w / Σ w, P = max(0, W' + k (W' − U')), and each queue is offered
  (amount at the round's start) · P / Σ P. If ΣP is 0 the tier stops (the capacity stays).
- A queue offered at least what it still needs takes exactly that and is satisfied; any other
  takes its offer floored to whole units (`unit_cu`; continuous without one) and remembers the
  fraction it could not take — the last one — for the remainder pass.
- Weight 0: never anything above the guarantee, even when the capacity stays idle.
- Remainder pass, after every tier: tier by tier, highest first, one unit at a time to the queues
  with a remembered fraction, largest first, then the older queue, then the name.

Where gpufair keeps its own rule: a queue is never given more than it needs (KAI's remainder
pass may hand a whole unit to a queue that needs a fraction of one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Float noise from the division must not cost a queue a unit (as in `rounding`).
_UNIT_SLACK = 1e-9


@dataclass(frozen=True, slots=True)
class KaiOverQuota:
    """The over-quota shares of one group, index-aligned with the queues passed in, and the
    weights of the first round each queue competed in (for the explain record; 0 for a queue
    that never competed)."""

    shares: list[float]
    competed: list[bool]
    weight_shares: list[float]  # W'
    priority_weights: list[float]  # P
    effective_weights: list[float]  # P / ΣP
    leftover: float


def kai_over_quota(
    amount: float,
    *,
    needs: Sequence[float],
    weights: Sequence[float],
    usage_shares: Sequence[float],
    tiers: Sequence[Sequence[int]],
    created_at_s: Sequence[float],
    names: Sequence[str],
    k: float,
    unit_cu: float | None,
) -> KaiOverQuota:
    """Divide `amount` over-quota among one group's queues by KAI's rounds (module docstring).

    `needs[i]` is what queue i may still take above its guarantee (allowed demand − guarantee);
    `tiers` are the positions of each priority, highest first, in index order
    (`GroupPlan.priority_tiers`).

    The weights of a queue are recorded in the round it first takes part in; a tier that finds
    nothing left to divide computes none (no queue of it competes, so nobody reads them).
    """
    count = len(needs)
    given = [0.0] * count
    competed = [False] * count
    weight_shares = [0.0] * count
    priority_weights = [0.0] * count
    effective_weights = [0.0] * count
    remainders: list[dict[int, float]] = []
    fsum = math.fsum
    floor = math.floor
    for members in tiers:
        tier_remainders: dict[int, float] = {}
        remainders.append(tier_remainders)
        while amount > 0.0:
            unsatisfied = [i for i in members if given[i] < needs[i]]
            total_weight = fsum([weights[i] for i in unsatisfied])
            if total_weight <= 0.0:
                break
            # P = max(0, W' + k (W' − U')) of every unsatisfied queue, weight 0 included.
            round_p = [
                p if p > 0.0 else 0.0
                for p in [
                    w + k * (w - usage_shares[i])
                    for w, i in zip(
                        [weights[i] / total_weight for i in unsatisfied], unsatisfied, strict=True
                    )
                ]
            ]
            total_p = fsum(round_p)
            if total_p <= 0.0:
                break
            round_amount = amount
            another_round = False
            for i, p in zip(unsatisfied, round_p, strict=True):
                if amount <= 0.0:
                    break
                if weights[i] <= 0.0:
                    continue
                if not competed[i]:
                    competed[i] = True
                    weight_shares[i] = weights[i] / total_weight
                    priority_weights[i] = p
                    effective_weights[i] = p / total_p
                offer = round_amount * (p / total_p)
                requested = needs[i] - given[i]
                if requested <= offer:
                    take = requested
                    tier_remainders.pop(i, None)
                else:
                    take = offer
                    if unit_cu is not None:
                        take = unit_cu * floor(offer / unit_cu + _UNIT_SLACK)
                        if offer - take > 0.0:
                            tier_remainders[i] = offer - take
                take = min(take, amount, requested)
                if take <= 0.0:
                    continue
                given[i] += take
                amount -= take
                if requested < offer:
                    another_round = True
            if not another_round:
                break
    if unit_cu is not None:
        for tier_remainders in remainders:
            if amount <= unit_cu * _UNIT_SLACK:
                break
            pending = sorted(
                [(-left, created_at_s[i], names[i], i) for i, left in tier_remainders.items()]
            )
            for _, _, _, i in pending:
                if amount <= unit_cu * _UNIT_SLACK:
                    break
                grant = min(unit_cu, amount, needs[i] - given[i])
                if grant > 0.0:
                    given[i] += grant
                    amount -= grant
    return KaiOverQuota(
        shares=given,
        competed=competed,
        weight_shares=weight_shares,
        priority_weights=priority_weights,
        effective_weights=effective_weights,
        leftover=max(0.0, amount),
    )
