"""Invariants of the fair-share division (DESIGN §3), checked on generated queue trees."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from fairshare_support import divide, queue, wants
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufair.domain.fairshare import QueueDemand, QueueShare
from gpufair.domain.model import FairSharePolicy, Queue, Rounding
from gpufair.domain.usage import UsageInputs

EXAMPLES = settings(max_examples=200, deadline=None)
TOLERANCE_CU = 1e-6


@dataclass(frozen=True)
class Case:
    queues: list[Queue]
    demands: dict[str, QueueDemand]
    capacity_gpus: float
    usage: UsageInputs
    policy: FairSharePolicy

    def divide(self, **changes: object) -> dict[str, QueueShare]:
        case = replace(self, **changes)  # type: ignore[arg-type]
        return divide(
            case.queues,
            case.demands,
            capacity_gpus=case.capacity_gpus,
            policy=case.policy,
            usage=case.usage,
        )


amounts = st.integers(min_value=0, max_value=60).map(float)


@st.composite
def cases(
    draw: st.DrawFn,
    *,
    history: bool = True,
    rounding: bool = True,
    guarantees_fit: bool = False,
) -> Case:
    """A one- or two-level tree with consistent quotas (children within their parent's).

    With `guarantees_fit`, the pool holds at least the top level's deserved quotas.
    """
    queues: list[Queue] = []
    demands: dict[str, QueueDemand] = {}
    usage: dict[str, float] = {}
    group_capacity: dict[str | None, float] = {}
    top_deserved = 0.0

    def terms(name: str, deserved_cu: float, parent: str | None) -> Queue:
        limit_extra = draw(st.none() | st.integers(0, 80).map(float))
        return queue(
            name,
            deserved_cu=deserved_cu,
            weight=draw(st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.0, 3.0])),
            parent=parent,
            priority=draw(st.integers(0, 2)),
            limit_cu=None if limit_extra is None else deserved_cu + limit_extra * 10,
            created_at_s=float(draw(st.integers(0, 3))),
        )

    for d in range(draw(st.integers(1, 4))):
        name = f"d{d}"
        child_count = draw(st.sampled_from([0, 0, 1, 2, 3]))
        children_deserved = [draw(amounts) * 10 for _ in range(child_count)]
        deserved = sum(children_deserved) + draw(amounts) * 10
        queues.append(terms(name, deserved, None))
        top_deserved += deserved
        leaves = [f"{name}c{c}" for c in range(child_count)] or [name]
        for c, child_deserved in enumerate(children_deserved):
            queues.append(terms(leaves[c], child_deserved, name))
        for leaf in leaves:
            demands[leaf] = wants(draw(amounts) * 2)
        if history:
            for member in [name, *leaves]:
                usage[member] = float(draw(st.integers(0, 100)))
            group_capacity[name] = float(draw(st.integers(0, 100)))
    if history:
        group_capacity[None] = float(draw(st.integers(0, 100)))
    capacity_gpus = float(draw(st.integers(0, 300)))
    if guarantees_fit:
        capacity_gpus += top_deserved / 10
    policy = FairSharePolicy(
        k=draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])) if history else 1.0,
        rounding=draw(st.sampled_from(list(Rounding))) if rounding else Rounding.CONTINUOUS,
    )
    return Case(
        queues=queues,
        demands=demands,
        capacity_gpus=capacity_gpus,
        usage=UsageInputs(usage_cu_s=usage, group_capacity_cu_s=group_capacity),
        policy=policy,
    )


def _children(shares: Mapping[str, QueueShare], parent: str | None) -> list[QueueShare]:
    return [s for s in shares.values() if s.parent == parent]


@EXAMPLES
@given(cases())
def test_shares_fill_capacity_up_to_allowed_demand_and_never_exceed_it(case: Case) -> None:
    shares = case.divide()
    top = _children(shares, None)
    capacity_cu = case.capacity_gpus * 10
    total = math.fsum(s.fair_share_cu for s in top)
    wanted = math.fsum(s.allowed_demand_cu for s in top)
    assert math.isclose(total, min(capacity_cu, wanted), abs_tol=TOLERANCE_CU)
    for share in shares.values():
        assert share.fair_share_cu <= share.allowed_demand_cu + TOLERANCE_CU
        assert share.allowed_demand_cu <= share.demand_cu + TOLERANCE_CU
        if share.limit_cu is not None:
            assert share.fair_share_cu <= share.limit_cu + TOLERANCE_CU
        children = _children(shares, share.queue)
        if children:
            # A department's share is fully handed on: nothing is idle inside it either.
            given_on = math.fsum(c.fair_share_cu for c in children)
            assert math.isclose(given_on, share.fair_share_cu, abs_tol=TOLERANCE_CU)


@EXAMPLES
@given(cases(guarantees_fit=True))
def test_every_queue_gets_its_deserved_share_of_what_it_wants(case: Case) -> None:
    shares = case.divide()
    for share in shares.values():
        if share.is_leaf:
            limit_cu = math.inf if share.limit_cu is None else share.limit_cu
            expected = min(share.demand_cu, limit_cu, case.capacity_gpus * 10)
            assert share.allowed_demand_cu == expected
        # A department's allowed demand is also bounded by what its teams may hold.
        floor_cu = min(share.deserved_cu, share.allowed_demand_cu)
        assert share.fair_share_cu >= floor_cu - TOLERANCE_CU
        assert share.guaranteed_cu >= floor_cu - TOLERANCE_CU


@EXAMPLES
@given(cases())
def test_lower_tier_gets_over_quota_only_when_higher_tiers_are_satisfied(case: Case) -> None:
    """Tiers go highest first, and best effort (weight 0) after every weighted queue of every
    tier: a weighted lower tier may take over-quota capacity a best-effort higher tier wants."""
    shares = case.divide()
    for parent in [None, *shares]:
        siblings = _children(shares, parent)
        for higher in siblings:
            if higher.fair_share_cu >= higher.allowed_demand_cu - TOLERANCE_CU:
                continue
            for lower in siblings:
                if lower.over_quota_weight > 0.0 and higher.over_quota_weight <= 0.0:
                    continue
                if lower.priority < higher.priority:
                    assert lower.over_quota_share_cu <= TOLERANCE_CU


@EXAMPLES
@given(cases())
def test_best_effort_gets_over_quota_only_when_every_weighted_sibling_is_satisfied(
    case: Case,
) -> None:
    shares = case.divide()
    for parent in [None, *shares]:
        siblings = _children(shares, parent)
        weighted_short = any(
            s.over_quota_weight > 0.0 and s.fair_share_cu < s.allowed_demand_cu - TOLERANCE_CU
            for s in siblings
        )
        if weighted_short:
            for sibling in siblings:
                if sibling.over_quota_weight <= 0.0:
                    assert sibling.over_quota_share_cu <= TOLERANCE_CU


def _classic_rounds(amount: float, weights: list[float], caps: list[float]) -> list[float]:
    """The rounds of DESIGN §3.2 run literally, with fixed weights, to compare against."""
    got = [0.0] * len(caps)
    active = [i for i in range(len(caps)) if weights[i] > 0 and caps[i] > 0]
    while amount > 1e-12 and active:
        total_weight = sum(weights[i] for i in active)
        still_wanting = []
        spent = 0.0
        for i in active:
            grant = min(amount * weights[i] / total_weight, caps[i] - got[i])
            got[i] += grant
            spent += grant
            if caps[i] - got[i] > 1e-12:
                still_wanting.append(i)
        amount -= spent
        if len(still_wanting) == len(active):
            break
        active = still_wanting
    return got


def _classic_division(shares: Mapping[str, QueueShare], capacity_cu: float) -> dict[str, float]:
    """Memoryless weighted fair share: deserved, then tiers by weight, then best effort
    (weight 0) of every tier."""
    result: dict[str, float] = {}
    budgets: dict[str | None, float] = {None: capacity_cu}
    for parent in [None, *shares]:
        members = _children(shares, parent)
        if not members:
            continue
        budget = budgets[parent]
        bases = [min(m.deserved_cu, m.allowed_demand_cu) for m in members]
        if sum(bases) > budget:
            got = _classic_rounds(budget, [m.deserved_cu for m in members], bases)
            budget = 0.0
        else:
            got = list(bases)
            budget -= sum(bases)
        # Weighted queues tier by tier, then best effort (weight 0, equal among them) likewise.
        for best_effort in (False, True):
            for priority in sorted({m.priority for m in members}, reverse=True):
                tier = [
                    i
                    for i, m in enumerate(members)
                    if m.priority == priority and (m.over_quota_weight <= 0.0) is best_effort
                ]
                caps = [members[i].allowed_demand_cu - got[i] for i in tier]
                weights = [1.0 if best_effort else members[i].over_quota_weight for i in tier]
                extra = _classic_rounds(budget, weights, caps)
                for i, amount in zip(tier, extra, strict=True):
                    got[i] += amount
                budget -= sum(extra)
        for member, amount in zip(members, got, strict=True):
            result[member.queue] = amount
            budgets[member.queue] = amount
    return result


@EXAMPLES
@given(cases(history=False, rounding=False))
def test_without_history_the_division_is_classic_weighted_fair_share(case: Case) -> None:
    shares = case.divide()
    expected = _classic_division(shares, case.capacity_gpus * 10)
    for name, share in shares.items():
        assert math.isclose(share.fair_share_cu, expected[name], rel_tol=1e-9, abs_tol=1e-6)


@EXAMPLES
@given(cases(), st.sampled_from([0.0, 0.5, 1.0, 3.0]))
def test_k_zero_ignores_any_history(case: Case, k: float) -> None:
    with_history = case.divide(policy=replace(case.policy, k=0.0))
    without = case.divide(policy=replace(case.policy, k=k), usage=UsageInputs())
    for name, share in with_history.items():
        assert math.isclose(share.fair_share_cu, without[name].fair_share_cu, abs_tol=1e-6)


@EXAMPLES
@given(cases(), st.data())
def test_more_usage_never_raises_a_queues_share(case: Case, data: st.DataObject) -> None:
    names = [q.name for q in case.queues]
    name = data.draw(st.sampled_from(names))
    extra = float(data.draw(st.integers(1, 200)))
    before = case.divide()
    usage = dict(case.usage.usage_cu_s)
    usage[name] = usage.get(name, 0.0) + extra
    after = case.divide(
        usage=UsageInputs(usage_cu_s=usage, group_capacity_cu_s=case.usage.group_capacity_cu_s)
    )
    assert after[name].fair_share_cu <= before[name].fair_share_cu + TOLERANCE_CU
    assert after[name].usage_share >= before[name].usage_share


@EXAMPLES
@given(cases())
def test_whole_gpu_shares_are_whole_unless_demand_or_guarantee_is_fractional(case: Case) -> None:
    shares = case.divide(policy=replace(case.policy, rounding=Rounding.WHOLE_GPUS))
    for share in shares.values():
        over = share.over_quota_share_cu
        satisfied = share.fair_share_cu >= share.allowed_demand_cu - TOLERANCE_CU
        if not satisfied and share.parent is None:
            # Top-level queues divide the whole pool: their over-quota part is whole GPUs.
            assert abs(over / 10 - round(over / 10)) < 1e-6
