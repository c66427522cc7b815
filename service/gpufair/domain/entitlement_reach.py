"""What gang entitlement can do for one workload (docs/GANG_ENTITLEMENT.md): the largest share
time-based fair share can ever give its queue, and, for `gpufair explain`, whether the rule of
`cycle_entitlement` may admit it and what it still waits for.

A gang that fits below its queue's reachable share is left to fair share: it runs once the
others' usage decays. A gang above it never runs as a share; gang entitlement admits it when the
pool has the rule on (with k > 0, a decay window and `gang_reservation_after_s`), the gang is
preemptible and has waited that long, its queue has received less than its weight over the
window (U' < W') and holds less than its weight's part of the over-quota capacity now, and its
queue is the most under-served of its tier (lowest U'/W' among the tier's waiting queues).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gpufair.domain.capacity import EPS
from gpufair.domain.model import NodePool, WindowKind, Workload
from gpufair.domain.number_text import number_text as _num
from gpufair.domain.snapshot import QueueSummary, UsageStanding


def reachable_share_cu(
    weight_share: float, held_over_quota_cu: float, over_quota_cu: float, k: float
) -> float:
    """The largest over-quota share the formula can ever give a queue that keeps holding
    `held_over_quota_cu` of a group dividing `over_quota_cu` (DESIGN §3.3).

    Kept for a window, what it holds makes its usage share at least u = held / capacity, so its
    P is at most W'(1 + k) - k u. The others' usage shares add up to at most 1 - u, so their Ps
    add up to at least (1 + k)(1 - W') - k (1 - u) (each P is W' + k (W' - U'), floored at 0).
    The share is the group's capacity times P over the sum of Ps: at most
    capacity × P / (P + max(0, that least sum)).

    With three equal queues at k = 1 and nothing held: 2/3 of the group, the burst case's
    10.67 of 16 GPUs; with weights 3 : 1 holding 40 of 64: 0.875 × 64 = 56.
    """
    if over_quota_cu <= EPS:
        return 0.0
    usage = min(1.0, max(0.0, held_over_quota_cu / over_quota_cu))
    own = max(0.0, weight_share * (1.0 + k) - k * usage)
    others = max(0.0, (1.0 + k) * (1.0 - weight_share) - k * (1.0 - usage))
    if own + others <= EPS:
        return over_quota_cu
    return over_quota_cu * own / (own + others)


@dataclass(frozen=True, slots=True)
class EntitlementOutlook:
    """One workload against its queue's reachable share. `reachable_cu` is the queue's deserved
    quota plus the largest over-quota share the formula can reach while the queue keeps what it
    holds; `sentence` says what follows for the workload (for `explain`'s message)."""

    reachable_cu: float
    sentence: str


def outlook(
    pool: NodePool,
    standing: Mapping[str, UsageStanding],
    queues: Mapping[str, QueueSummary],
    workload: Workload,
    needed_cu: float,
    now_s: float,
) -> EntitlementOutlook | None:
    """Where `workload` (needing `needed_cu`) stands against its queue's reachable share, from
    the cycle's queue summaries (`queues`, allocations as the cycle left them) and the standing
    W', U' of the recompute its shares came from. None when no standing is known for its queue
    or the queue does not compete for over-quota capacity (W' = 0)."""
    found = standing.get(workload.queue)
    summary = queues.get(workload.queue)
    if found is None or summary is None or found.weight_share <= EPS:
        return None
    over_quota_cu = math.fsum(
        max(0.0, other.fair_share_cu - other.deserved_cu)
        for other in queues.values()
        if other.priority == summary.priority
        and (mate := standing.get(other.queue)) is not None
        and mate.weight_share > EPS
    )
    allocated = summary.allocated_cu_after + summary.reserved_cu
    held_cu = max(0.0, allocated - summary.deserved_cu)
    reachable = summary.deserved_cu + reachable_share_cu(
        found.weight_share, held_cu, over_quota_cu, pool.policy.k
    )
    reach = (
        f"Time-based fair share can give queue {workload.queue} at most {_num(reachable)} CU "
        f"while it keeps the {_num(allocated)} CU it holds (W' {_num(found.weight_share)}, "
        f"U' {_num(found.usage_share)}, k {_num(pool.policy.k)})"
    )
    if allocated + needed_cu <= reachable + EPS:
        return EntitlementOutlook(
            reachable, f"{reach}: enough for it once the others' usage decays."
        )
    return EntitlementOutlook(
        reachable,
        f"{reach}: less than it needs, so it never runs as a share; "
        + _rule_for(pool, found, workload, held_cu, over_quota_cu, summary.priority, now_s)
        + ".",
    )


def _rule_for(
    pool: NodePool,
    found: UsageStanding,
    workload: Workload,
    held_cu: float,
    over_quota_cu: float,
    tier: int,
    now_s: float,
) -> str:
    """What gang entitlement does for a gang larger than its queue's reachable share."""
    after_s = pool.gang_reservation_after_s
    if not pool.gang_entitlement:
        return "the pool's gang_entitlement is off, which would admit such a gang beyond its share"
    if pool.policy.k <= 0.0 or pool.policy.window_kind is WindowKind.NONE:
        return "gang entitlement needs k > 0 and a decay window, and this pool has neither"
    if after_s is None:
        return "gang entitlement needs the pool's gang_reservation_after_s, which is unset"
    if not workload.preemptible:
        return "gang entitlement admits only preemptible gangs"
    if found.usage_share >= found.weight_share - EPS:
        return (
            "gang entitlement does not apply: its queue has received its weight's part over the "
            f"window (U' {_num(found.usage_share)} >= W' {_num(found.weight_share)})"
        )
    if held_cu >= found.weight_share * over_quota_cu - EPS:
        return (
            "gang entitlement does not apply now: its queue holds its weight's part of the "
            f"over-quota capacity ({_num(held_cu)} of {_num(over_quota_cu)} CU) already"
        )
    waited_s = now_s - workload.submit_time_s
    if waited_s < after_s:
        return (
            f"gang entitlement may admit it once it has waited {after_s:.0f} s "
            f"({after_s - waited_s:.0f} s more), if its queue is then the most under-served of "
            f"tier {tier}"
        )
    return (
        "gang entitlement admits it beyond its share while its queue is the most under-served "
        f"of tier {tier} (lowest U'/W' among the tier's waiting queues) and it is the queue's "
        "first such gang"
    )
