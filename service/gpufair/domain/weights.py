"""Time-based effective weights (DESIGN §3.3): W', U', P and the dead band."""

from __future__ import annotations

import math


def usage_share(usage_cu_s: float, group_capacity_cu_s: float) -> float:
    """U' = decayed usage / decayed capacity the group competed for; 0 without any capacity.

    Both integrals come from the same window and decay (`usage.usage_inputs`), so U' is the
    fraction of what the group divided that this queue took — the unit W' is in. It may exceed 1
    under the over-quota basis when siblings left their deserved quota unused.
    """
    if group_capacity_cu_s <= 0.0:
        return 0.0
    return usage_cu_s / group_capacity_cu_s


def priority_weight(weight_share: float, usage_share: float, k: float) -> float:
    """P = max(0, W' + k · (W' - U')): below-share users gain, above-share users give way."""
    return max(0.0, weight_share + k * (weight_share - usage_share))


def stage_weights(
    over_quota_weights: list[float],
    usage_shares: list[float],
    k: float,
    previous_effective_weights: list[float | None] | None,
    dead_band: float,
) -> tuple[list[float], list[float], list[float]]:
    """The weights of the queues competing in one over-quota stage, index-aligned with the
    queues passed in: (W', P, effective weight).

    W'_q = w_q / Σ w over the competing queues; when every configured weight is 0 (best-effort
    queues only) they share equally, so leftover capacity is still used. If every P is 0 the
    division falls back to W' (DESIGN §3.3). Effective weights are P normalised to sum to 1.

    Dead band (absolute, on the normalised weight): a queue whose new effective weight is within
    `dead_band` of its previous one keeps the previous value, so shares do not jitter between
    recomputes (`previous_effective_weights` None: no queue has one, as in every stage after a
    tier's first). A previous weight is one the queue had while competing: a queue that did not
    compete at the last computation has none (`FairShareResult.effective_weights`) and gets its
    new weight at once, while one that competed and gave way entirely keeps its 0 within the
    band. Should that leave every weight at 0, the unbanded weights are used instead —
    stability must never idle capacity. A queue whose weight falls to 0 (P = 0: it is to give
    way entirely) always moves: keeping a sliver of its old weight would keep the others a sliver
    short for as long as its P stays pinned at 0, so a gang needing all they are due would wait
    forever.

    This runs for every competing queue of every group: lists only, `priority_weight` inline.
    """
    count = len(over_quota_weights)
    total_weight = math.fsum(over_quota_weights)
    if total_weight > 0.0:
        weight_shares = list(map(total_weight.__rtruediv__, over_quota_weights))  # w / Σw
    else:
        weight_shares = [1.0 / count] * count
    priority_weights = [
        p if p > 0.0 else 0.0
        for p in [w + k * (w - u) for w, u in zip(weight_shares, usage_shares, strict=True)]
    ]
    total_priority = math.fsum(priority_weights)
    if total_priority > 0.0:
        unbanded = list(map(total_priority.__rtruediv__, priority_weights))  # P / ΣP
    else:
        unbanded = weight_shares
    if previous_effective_weights is None:
        return weight_shares, priority_weights, unbanded
    banded = [
        previous if previous is not None and new > 0.0 and abs(new - previous) < dead_band else new
        for new, previous in zip(unbanded, previous_effective_weights, strict=True)
    ]
    for weight in banded:
        if weight > 0.0:
            return weight_shares, priority_weights, banded
    return weight_shares, priority_weights, unbanded
