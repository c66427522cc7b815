"""The compiled division (`FairSharePlan`, issue 17) against the previous engine, on random trees.

Every number of the result — fair shares, effective weights, W' and U', who competed, idle
capacity and every field of every explain record — must equal the previous engine's
(`fairshare_previous`, kept as the oracle) to the last bit: the new engine does the same float
operations in the same order, it only reads them from columns compiled once.
"""

from __future__ import annotations

import random

import fairshare_previous
import pytest
from fairshare_support import ALL_TYPES, POOL

from gpufair.domain.errors import InvalidInputError
from gpufair.domain.fairshare import (
    FairShareInput,
    FairSharePlan,
    FairShareResult,
    QueueDemand,
    compute_fair_shares,
)
from gpufair.domain.model import Division, FairSharePolicy, Queue, QueueQuota, Rounding
from gpufair.domain.usage import UsageInputs

TYPES = list(ALL_TYPES)


def _random_quota(rng: random.Random, kai: bool) -> QueueQuota:
    deserved = rng.choice([0.0, 0.0, rng.uniform(0.0, 60.0), float(rng.randint(0, 40))])
    per_type = {}
    if rng.random() < 0.25:
        per_type = {rng.choice(TYPES): float(rng.choice([1, 2, 0.5, 3]))}
    by_type_cu = sum(g * ALL_TYPES[t].compute_weight for t, g in per_type.items())
    limit = None
    if rng.random() < 0.3:
        floor = 0.0 if kai else max(deserved, by_type_cu)
        limit = floor + rng.choice([0.0, rng.uniform(0.0, 50.0)])
        if kai and rng.random() < 0.5:
            limit = rng.uniform(0.0, deserved + 1.0)
    type_limits = {}
    if rng.random() < 0.2:
        t = rng.choice(TYPES)
        type_limits = {t: max(per_type.get(t, 0.0), float(rng.randint(0, 6)))}
    return QueueQuota(
        pool=POOL,
        deserved_cu=deserved,
        deserved_gpus_by_type=per_type,
        over_quota_weight=rng.choice([0.0, 0.5, 1.0, 1.0, 2.0, 3.0]),
        priority=rng.choice([0, 0, 1, 2]),
        limit_cu=limit,
        limit_gpus_by_type=type_limits,
    )


def _random_tree(rng: random.Random, kai: bool) -> list[Queue]:
    queues: list[Queue] = []
    frontier: list[str | None] = [None]
    count = rng.randint(1, 40)
    for n in range(count):
        parent = rng.choice(frontier)
        name = f"q{n:02d}-{rng.randint(0, 99)}"
        quotas = {} if rng.random() < 0.08 else {POOL: _random_quota(rng, kai)}
        queues.append(
            Queue(name=name, parent=parent, quotas=quotas, created_at_s=float(rng.randint(0, 5)))
        )
        if rng.random() < 0.4:
            frontier.append(name)
    rng.shuffle(queues)
    return queues


def _random_demands(rng: random.Random, queues: list[Queue]) -> dict[str, QueueDemand]:
    parents = {q.parent for q in queues}
    demands = {}
    for q in queues:
        if q.name in parents or rng.random() < 0.15:
            continue
        allocated = {t: rng.choice([0.5, 1.0, 2.0, 3.0]) for t in TYPES if rng.random() < 0.3}
        pending = {t: rng.choice([1.0, 2.0, 4.0, 0.25]) for t in TYPES if rng.random() < 0.4}
        demands[q.name] = QueueDemand(
            allocated_gpus_by_type=allocated, pending_gpus_by_type=pending
        )
    return demands


def _random_input(
    rng: random.Random, queues: list[Queue], policy: FairSharePolicy
) -> FairShareInput:
    capacity = {t: float(rng.choice([0, 2, 4, 8, 16, 3.5])) for t in TYPES if rng.random() < 0.8}
    names = [q.name for q in queues]
    usage = {n: rng.uniform(0.0, 1e5) for n in names if rng.random() < 0.7}
    group_capacity: dict[str | None, float] = {
        p: rng.uniform(1.0, 2e5) for p in {q.parent for q in queues} if rng.random() < 0.8
    }
    previous = {n: rng.uniform(0.0, 1.0) for n in names if rng.random() < 0.5}
    return FairShareInput(
        pool=POOL,
        policy=policy,
        gpu_types=ALL_TYPES,
        capacity_gpus_by_type=capacity,
        queues=queues,
        demands=_random_demands(rng, queues),
        usage=UsageInputs(usage_cu_s=usage, group_capacity_cu_s=group_capacity),
        previous_effective_weights=previous,
    )


def _random_policy(rng: random.Random) -> FairSharePolicy:
    return FairSharePolicy(
        k=rng.choice([0.0, 0.5, 1.0, 2.0]),
        rounding=rng.choice([Rounding.CONTINUOUS, Rounding.WHOLE_GPUS]),
        division=rng.choice([Division.GPUFAIR, Division.KAI]),
        dead_band=rng.choice([0.0, 0.01, 0.05]),
    )


def _assert_same(inp: FairShareInput, plan: FairSharePlan | None = None) -> None:
    assert_same_result(compute_fair_shares(inp, plan), fairshare_previous.compute_fair_shares(inp))


def assert_same_result(new: FairShareResult, old: FairShareResult) -> None:
    """Every output field equal, floats to the last bit, maps in the same order."""
    assert new.capacity_cu == old.capacity_cu
    assert new.whole_gpu_unit_cu == old.whole_gpu_unit_cu
    # The same pre-order and the same values.
    assert list(new.fair_share_cu.items()) == list(old.fair_share_cu.items())
    assert new.effective_weights == old.effective_weights
    assert new.standing == old.standing
    assert new.competing == old.competing
    assert new.idle_cu == old.idle_cu
    assert list(new.shares) == list(old.shares)
    for name in old.shares:
        # Dataclass equality compares every float with ==: equal to the last bit (no NaN here).
        assert new.shares[name] == old.shares[name], name


@pytest.mark.parametrize("seed", range(250))
def test_random_trees_divide_as_the_previous_engine(seed: int) -> None:
    rng = random.Random(seed)
    policy = _random_policy(rng)
    queues = _random_tree(rng, policy.division == Division.KAI)
    _assert_same(_random_input(rng, queues, policy))


@pytest.mark.parametrize("seed", range(40))
def test_one_plan_reused_over_changing_demands_and_history(seed: int) -> None:
    """The recompute's case: one compiled plan, new demands, capacity and history every call."""
    rng = random.Random(1000 + seed)
    policy = _random_policy(rng)
    queues = _random_tree(rng, policy.division == Division.KAI)
    plan = FairSharePlan.compile(POOL, policy, ALL_TYPES, queues)
    for _ in range(5):
        inp = _random_input(rng, queues, policy)
        assert plan.fits(inp.pool, inp.policy, inp.gpu_types, inp.queues)
        _assert_same(inp, plan)


def test_a_plan_of_another_configuration_is_not_used() -> None:
    rng = random.Random(5)
    policy = FairSharePolicy(k=1.0)
    queues = _random_tree(rng, kai=False)
    other = [*queues[1:], Queue(name="extra", quotas={POOL: QueueQuota(pool=POOL, deserved_cu=5)})]
    stale = FairSharePlan.compile(POOL, policy, ALL_TYPES, other)
    inp = _random_input(rng, queues, policy)
    assert not stale.fits(inp.pool, inp.policy, inp.gpu_types, inp.queues)
    _assert_same(inp, stale)
    # Equal queues built anew fit: the plan is compared by value, not only by identity.
    rebuilt = [Queue(q.name, q.parent, dict(q.quotas), q.created_at_s) for q in queues]
    plan = FairSharePlan.compile(POOL, policy, ALL_TYPES, queues)
    assert plan.fits(POOL, policy, ALL_TYPES, rebuilt)
    assert not plan.fits(POOL, FairSharePolicy(k=2.0), ALL_TYPES, queues)


def test_invalid_inputs_are_refused_with_the_previous_messages() -> None:
    queues = [
        Queue("a", quotas={POOL: QueueQuota(pool=POOL, deserved_cu=10.0)}),
        Queue("b", quotas={POOL: QueueQuota(pool=POOL, deserved_cu=-1.0)}),
    ]
    bad_capacity = FairShareInput(
        pool=POOL,
        policy=FairSharePolicy(),
        gpu_types=ALL_TYPES,
        capacity_gpus_by_type={"h100": 4.0, "a100": float("nan")},
        queues=queues,
        usage=UsageInputs(usage_cu_s={"a": -3.0}),
    )
    messages = []
    for engine in (fairshare_previous.compute_fair_shares, compute_fair_shares):
        with pytest.raises(InvalidInputError) as raised:
            engine(bad_capacity)
        messages.append([(v.field_path, v.message) for v in raised.value.violations])
    assert messages[0] == messages[1]
    assert [path for path, _ in messages[1]] == [
        'capacity_gpus_by_type["h100"]',
        'capacity_gpus_by_type["a100"]',
        'queues[1].quotas["pool"].deserved_cu',
        'usage.usage_cu_s["a"]',
    ]
    with pytest.raises(InvalidInputError):
        FairSharePlan.compile(POOL, FairSharePolicy(), ALL_TYPES, queues)

    good = [queues[0], Queue("c", parent="a", quotas={POOL: QueueQuota(pool=POOL)})]
    plan = FairSharePlan.compile(POOL, FairSharePolicy(), ALL_TYPES, good)
    bad_demands = FairShareInput(
        pool=POOL,
        policy=FairSharePolicy(),
        gpu_types=ALL_TYPES,
        capacity_gpus_by_type={"a100": 4.0},
        queues=good,
        demands={
            "a": QueueDemand(pending_gpus_by_type={"a100": 1.0}),
            "c": QueueDemand(pending_gpus_by_type={"a100": -1.0, "h100": 2.0}),
            "zz": QueueDemand(),
        },
    )
    for plan_given in (None, plan):
        with pytest.raises(InvalidInputError) as raised:
            compute_fair_shares(bad_demands, plan_given)
        assert [(v.field_path, v.message) for v in raised.value.violations] == [
            ('demands["a"]', "demand is given for leaf queues only"),
            ('demands["c"].pending_gpus_by_type["a100"]', "must be a finite number ≥ 0, got -1.0"),
            ('demands["c"].pending_gpus_by_type["h100"]', "unknown GPU type 'h100'"),
            ('demands["zz"]', "unknown queue 'zz'"),
        ]
