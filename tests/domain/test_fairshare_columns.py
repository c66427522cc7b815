"""Demands as columns (`LeafDemands`, issue 17) divide as the same demands as maps, and as the
previous engine: every number of every record equal to the last bit."""

from __future__ import annotations

import dataclasses
import math
import random

import fairshare_previous
import pytest
from fairshare_support import ALL_TYPES, POOL
from test_fairshare_plan import (
    _assert_same,
    _random_input,
    _random_policy,
    _random_tree,
    assert_same_result,
)

from gpufair.domain.demand import leaf_demand_columns, queue_demands
from gpufair.domain.errors import InvalidInputError
from gpufair.domain.fairshare import (
    FairShareInput,
    FairSharePlan,
    LeafDemands,
    QueueDemand,
    compute_fair_shares,
)
from gpufair.domain.fairshare_plan import LONG_GROUP
from gpufair.domain.model import Division, FairSharePolicy, Queue, QueueQuota, Workload
from gpufair.domain.usage import UsageInputs

TYPES = list(ALL_TYPES)


def _as_columns(
    inp: FairShareInput, plan: FairSharePlan, leaves: tuple[str, ...] | None = None
) -> FairShareInput:
    assert not isinstance(inp.demands, LeafDemands)
    columns = LeafDemands.from_maps(leaves or plan.leaf_names, plan.type_names, inp.demands)
    assert columns is not None
    return dataclasses.replace(inp, demands=columns)


def _assert_columns_same(inp: FairShareInput, plan: FairSharePlan) -> None:
    """`inp` (maps) divided by the previous engine, and as columns by this one."""
    assert_same_result(
        compute_fair_shares(_as_columns(inp, plan), plan),
        fairshare_previous.compute_fair_shares(inp),
    )


@pytest.mark.parametrize("seed", range(120))
def test_columns_divide_as_the_maps_and_the_previous_engine(seed: int) -> None:
    rng = random.Random(7000 + seed)
    policy = _random_policy(rng)
    queues = _random_tree(rng, policy.division == Division.KAI)
    plan = FairSharePlan.compile(POOL, policy, ALL_TYPES, queues)
    for _ in range(3):
        _assert_columns_same(_random_input(rng, queues, policy), plan)


def _wide_input(rng: random.Random, children: int, policy: FairSharePolicy) -> FairShareInput:
    """Two departments, one wider than `LONG_GROUP`; leaves with all three types in every map
    order and fractional amounts, so that the order of each sum shows in its last bit."""
    queues = [
        Queue("wide", quotas={POOL: QueueQuota(pool=POOL, deserved_cu=30.0)}),
        Queue("narrow", quotas={POOL: QueueQuota(pool=POOL, deserved_cu=20.0, limit_cu=90.0)}),
    ]
    demands = {}
    for n in range(children + 5):
        name = f"leaf-{n:03d}"
        per_type = {TYPES[0]: 0.1} if n % 7 == 0 else {}
        queues.append(
            Queue(
                name,
                parent="wide" if n < children else "narrow",
                quotas={
                    POOL: QueueQuota(
                        pool=POOL,
                        deserved_cu=rng.uniform(0.0, 3.0),
                        deserved_gpus_by_type=per_type,
                        over_quota_weight=rng.choice([0.5, 1.0, 2.0]),
                        limit_gpus_by_type={TYPES[1]: 1.3} if n % 5 == 0 else {},
                    )
                },
            )
        )
        held = rng.sample(TYPES, rng.randint(0, 3))
        waited = rng.sample(TYPES, rng.randint(0, 3))
        demands[name] = QueueDemand(
            {t: rng.uniform(0.01, 3.3) for t in held},
            {t: rng.uniform(0.01, 7.7) for t in waited},
        )
    return FairShareInput(
        pool=POOL,
        policy=policy,
        gpu_types=ALL_TYPES,
        capacity_gpus_by_type={TYPES[0]: 7.3, TYPES[1]: 19.9, TYPES[2]: 41.1},
        queues=queues,
        demands=demands,
        usage=UsageInputs(usage_cu_s={q.name: rng.uniform(0.0, 1e4) for q in queues}),
    )


@pytest.mark.parametrize("children", [LONG_GROUP - 1, LONG_GROUP + 17])
def test_a_group_wider_than_the_side_by_side_sums(children: int) -> None:
    rng = random.Random(children)
    for policy in (FairSharePolicy(k=1.0), FairSharePolicy(k=0.5, division=Division.KAI)):
        inp = _wide_input(rng, children, policy)
        plan = FairSharePlan.compile(POOL, policy, ALL_TYPES, inp.queues)
        assert any(level.long for level in plan.inner_levels) == (children > LONG_GROUP)
        _assert_same(inp)
        _assert_columns_same(inp, plan)


def test_columns_in_another_leaf_order_are_read_by_name() -> None:
    rng = random.Random(3)
    inp = _wide_input(rng, 6, FairSharePolicy(k=1.0))
    plan = FairSharePlan.compile(POOL, inp.policy, ALL_TYPES, inp.queues)
    assert not isinstance(inp.demands, LeafDemands)
    backwards = LeafDemands.from_maps(plan.leaf_names[::-1], plan.type_names[::-1], inp.demands)
    assert backwards is not None
    old = fairshare_previous.compute_fair_shares(inp)
    new = compute_fair_shares(dataclasses.replace(inp, demands=backwards), plan)
    for name in old.shares:
        assert new.shares[name] == old.shares[name], name


def test_invalid_columns_are_refused_with_the_messages_of_maps() -> None:
    queues = [Queue("a", quotas={POOL: QueueQuota(pool=POOL, deserved_cu=10.0)})]
    plan = FairSharePlan.compile(POOL, FairSharePolicy(), ALL_TYPES, queues)
    columns = LeafDemands.from_maps(
        plan.leaf_names, plan.type_names, {"a": QueueDemand(pending_gpus_by_type={"a100": 1.0})}
    )
    assert columns is not None
    columns.pending[0, plan.type_names.index("a100")] = math.nan
    inp = FairShareInput(
        pool=POOL,
        policy=FairSharePolicy(),
        gpu_types=ALL_TYPES,
        capacity_gpus_by_type={"a100": 4.0},
        queues=queues,
        demands=columns,
    )
    with pytest.raises(InvalidInputError) as raised:
        compute_fair_shares(inp, plan)
    assert [(v.field_path, v.message) for v in raised.value.violations] == [
        ('demands["a"].pending_gpus_by_type["a100"]', "must be a finite number ≥ 0, got nan")
    ]


def _workload(rng: random.Random, uid: int, queue: str) -> Workload:
    return Workload(
        uid=f"w{uid}",
        queue=queue,
        pool=POOL,
        pods=rng.choice([1, 2]),
        gpus_per_pod=rng.choice([1.0, 2.0, 0.5]),
        submit_time_s=0.0,
    )


@pytest.mark.parametrize("seed", range(30))
def test_demand_columns_from_rows_divide_as_the_maps_from_rows(seed: int) -> None:
    """The recompute's and the simulator's path: columns built from held rows and waiting
    workloads give each leaf the maps `queue_demands` gives, and the same division."""
    rng = random.Random(9000 + seed)
    policy = _random_policy(rng)
    queues = _random_tree(rng, policy.division == Division.KAI)
    plan = FairSharePlan.compile(POOL, policy, ALL_TYPES, queues)
    leaves = plan.leaf_names
    held = [
        (rng.choice(leaves), rng.choice(TYPES), rng.choice([0.5, 1.0, 2.0, 0.3]))
        for _ in range(rng.randint(0, 60))
    ]
    held.append(("not-a-queue", TYPES[0], 1.0))
    waiting = [_workload(rng, n, rng.choice(leaves)) for n in range(rng.randint(0, 60))]
    serving = {w.uid: rng.choice([*TYPES, None]) for w in waiting}
    weights = {t: g.compute_weight for t, g in ALL_TYPES.items()}

    def serving_type(w: Workload) -> str | None:
        return serving[w.uid]

    maps = queue_demands(leaves, held, waiting, serving_type, weights)
    columns = leaf_demand_columns(leaves, plan.type_names, held, waiting, serving_type, weights)
    assert isinstance(columns, LeafDemands)
    for row, name in enumerate(leaves):
        allocated, demand = columns.row_maps(row)
        assert allocated == maps[name].allocated_gpus_by_type
        merged = dict(maps[name].allocated_gpus_by_type)
        for t, gpus in maps[name].pending_gpus_by_type.items():
            merged[t] = merged.get(t, 0.0) + gpus
        assert list(demand.items()) == list(merged.items())  # the same order too
    inp = _random_input(rng, queues, policy)
    by_maps = compute_fair_shares(dataclasses.replace(inp, demands=maps), plan)
    by_columns = compute_fair_shares(dataclasses.replace(inp, demands=columns), plan)
    oracle = fairshare_previous.compute_fair_shares(dataclasses.replace(inp, demands=maps))
    assert by_columns.fair_share_cu == by_maps.fair_share_cu == oracle.fair_share_cu
    for name in oracle.shares:
        assert by_columns.shares[name] == by_maps.shares[name] == oracle.shares[name], name


def test_work_on_an_unknown_type_falls_back_to_maps_and_is_refused() -> None:
    queues = [Queue("a", quotas={POOL: QueueQuota(pool=POOL, deserved_cu=10.0)})]
    plan = FairSharePlan.compile(POOL, FairSharePolicy(), ALL_TYPES, queues)
    demands = leaf_demand_columns(
        plan.leaf_names, plan.type_names, [("a", "h100", 2.0)], [], lambda w: None
    )
    assert demands == {"a": QueueDemand({"h100": 2.0}, {})}
