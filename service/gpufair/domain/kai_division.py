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
    weights of the first round each queue competed in (for the explain record)."""

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
    priorities: Sequence[int],
    created_at_s: Sequence[float],
    names: Sequence[str],
    k: float,
    unit_cu: float | None,
) -> KaiOverQuota:
    """Divide `amount` over-quota among one group's queues by KAI's rounds (module docstring).

    `needs[i]` is what queue i may still take above its guarantee (allowed demand − guarantee).
    """
    count = len(needs)
    given = [0.0] * count
    competed = [False] * count
    weight_shares = [0.0] * count
    priority_weights = [0.0] * count
    effective_weights = [0.0] * count
    remainders: dict[int, dict[int, float]] = {}
    tiers: dict[int, list[int]] = {}
    for i in range(count):
        tiers.setdefault(priorities[i], []).append(i)
    order = sorted(tiers, reverse=True)
    for priority in order:
        tier_remainders = remainders.setdefault(priority, {})
        members = tiers[priority]
        while True:
            unsatisfied = [i for i in members if given[i] < needs[i]]
            total_weight = math.fsum(weights[i] for i in unsatisfied)
            if total_weight <= 0.0:
                break
            round_p: dict[int, float] = {}
            for i in unsatisfied:
                share_w = weights[i] / total_weight
                round_p[i] = max(0.0, share_w + k * (share_w - usage_shares[i]))
                if not competed[i] and weights[i] > 0.0:
                    weight_shares[i] = share_w
                    priority_weights[i] = round_p[i]
            total_p = math.fsum(round_p.values())
            if total_p <= 0.0:
                break
            round_amount = amount
            another_round = False
            for i in unsatisfied:
                if amount <= 0.0:
                    break
                if weights[i] <= 0.0:
                    continue
                if not competed[i]:
                    competed[i] = True
                    effective_weights[i] = round_p[i] / total_p
                offer = round_amount * (round_p[i] / total_p)
                requested = needs[i] - given[i]
                if requested <= offer:
                    take = requested
                    tier_remainders.pop(i, None)
                else:
                    take = offer
                    if unit_cu is not None:
                        take = unit_cu * math.floor(offer / unit_cu + _UNIT_SLACK)
                        if offer - take > 0.0:
                            tier_remainders[i] = offer - take
                take = min(take, amount, requested)
                if take <= 0.0:
                    continue
                given[i] += take
                amount -= take
                another_round = another_round or requested < offer
            if not another_round or amount <= 0.0:
                break
    if unit_cu is not None:
        for priority in order:
            if amount <= unit_cu * _UNIT_SLACK:
                break
            pending = sorted(
                remainders.get(priority, {}).items(),
                key=lambda item: (-item[1], created_at_s[item[0]], names[item[0]]),
            )
            for i, _ in pending:
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
