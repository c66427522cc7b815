"""KAI-Scheduler's own fair-share table cases, run through both division profiles (issue 22).

Each case is one of KAI-Scheduler's resource-division test cases (its GPU tables), written again
as gpufair input: a KAI queue's Deserved is `deserved_cu`, OverQuotaWeight the weight, MaxAllowed
`limit_cu`, Request the demand, Priority the tier; KAI's queue creation order is `created_at_s`.
One GPU type of 1 CU, so CU are GPUs. Every case runs under `usage_basis: total`, `whole_gpus`
and KAI's k = 0 unless it says otherwise, and is checked against KAI's expected fair shares:

- `division: kai` must agree on every case except where the guarantees exceed the capacity
  (KAI then gives every queue its min(deserved, request) regardless; gpufair scales them to fit,
  docs/kai-compatibility.md);
- `division: gpufair` agrees except on the cases listed in `GPUFAIR_DIFFERS`, each for a rule
  gpufair chose on purpose (weight 0 is best effort; weights fixed per tier).

Agreement: 38 of KAI's GPU cases and 2 time-aware cases worked from its round rule; `kai` agrees
on 38 of the 40 (not the 2 over-capacity cases), `gpufair` on 29 (differing: 6 weight 0, 1 limit
below the quota, 2 over capacity, the 2 time-aware cases).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from gpufair.domain.fairshare import FairShareInput, QueueDemand, compute_fair_shares
from gpufair.domain.model import (
    Division,
    FairSharePolicy,
    GpuType,
    Queue,
    QueueQuota,
    Rounding,
    UsageBasis,
    WindowKind,
    frozen_map,
)
from gpufair.domain.usage import UsageInputs, window_bounds

POOL = "pool"
GPU = GpuType("gpu", memory_gib=80.0, compute_weight=1.0)


@dataclass(frozen=True)
class Q:
    """One KAI queue: Deserved, OverQuotaWeight, MaxAllowed (None: unlimited), Request."""

    deserved: float
    weight: float
    request: float
    limit: float | None = None
    priority: int = 0
    usage: float = 0.0  # KAI's normalised usage: usage / cluster capacity


@dataclass(frozen=True)
class Case:
    capacity: float
    queues: tuple[Q, ...]
    kai: tuple[float, ...]  # KAI's expected fair shares, queue by queue
    k: float = 0.0
    same_creation_time: bool = False  # KAI's table cases that share one creation time
    over_capacity: bool = False  # Σ min(deserved, request) > capacity: gpufair's rule stays


def _within_quota(capacity: float, **changes: float) -> Case:
    base = {"deserved": 3.0, "weight": 0.0, "request": 2.0}
    base.update({k: v for k, v in changes.items() if k != "expected"})
    return Case(capacity, (Q(**base),), (changes["expected"],))  # type: ignore[arg-type]


def _two(capacity: float, kai: tuple[float, float], **per_queue: tuple[float, float]) -> Case:
    """KAI's "two queues" table: deserved 2, weight 2, request 6 each, queue 1 created first."""
    queues = []
    for i in range(2):
        fields: dict[str, float] = {"deserved": 2.0, "weight": 2.0, "request": 6.0}
        fields.update({name: values[i] for name, values in per_queue.items()})
        queues.append(Q(**fields))  # type: ignore[arg-type]
    return Case(capacity, tuple(queues), kai)


CASES: dict[str, Case] = {
    # setResourceShare - GPU / single queue within quota (sanity): deserved 3, weight 0, request 2
    "within quota: gives requested GPUs - no remaining": _within_quota(2, expected=2),
    "within quota: gives requested GPUs with remaining": _within_quota(3, expected=2),
    "within quota: doesn't give more GPUs than allowed": _within_quota(3, limit=2, expected=2),
    "within quota: gives up to deserved when over subscribed": Case(
        1, (Q(3, 0, 2),), (2,), over_capacity=True
    ),
    "within quota: gives up to full quota": _within_quota(7, request=5, expected=3),
    "within quota: gives with fraction, if stated in deserved": _within_quota(
        2, deserved=1.5, expected=1.5
    ),
    "within quota: gives with fraction, if stated in request": _within_quota(
        2, request=1.5, expected=1.5
    ),
    "within quota: doesn't give if deserved is zero": _within_quota(2, deserved=0, expected=0),
    # single queue over quota (sanity): deserved 3 (already given), weight 1, request 5; the
    # over-quota amount KAI divides is the capacity beyond the 3.
    "over quota: gives requested GPUs no remaining": Case(5, (Q(3, 1, 5),), (5,)),
    "over quota: gives requested GPUs with remaining": Case(6, (Q(3, 1, 5),), (5,)),
    "over quota: doesn't give more GPUs than allowed": Case(5, (Q(3, 1, 5, limit=4),), (4,)),
    "over quota: doesn't give when over quota weight is zero": Case(5, (Q(3, 0, 5),), (3,)),
    "over quota: gives with fraction if requested": Case(5, (Q(3, 1, 4.5),), (4.5,)),
    "over quota: gives remainder fraction": Case(3.5, (Q(3, 1, 5),), (3.5,)),
    "over quota: gives when deserved is zero": Case(6, (Q(0, 1, 5),), (5,)),
    "over quota: doesn't break when there are zero resources to divide": Case(
        3, (Q(3, 1, 5),), (3,)
    ),
    "over quota: doesn't give when over quota weight is zero (10 left)": Case(
        13, (Q(3, 0, 5),), (3,)
    ),
    "two queues over quota: doesn't give when over quota weight is zero": Case(
        16, (Q(3, 0, 5), Q(3, 1, 3)), (3, 3)
    ),
    # "two queues" table
    "two queues: allocates many available gpus": _two(15, (6, 6)),
    "two queues: allocates exact requested amount gpus": _two(12, (6, 6)),
    "two queues: allocates GPUs proportionally": _two(8, (3, 5), weight=(1, 3)),
    "two queues: doesn't allocate more than allowed": _two(12, (5, 6), limit=(5, 1e9)),
    "two queues: distributes remainder based on largest remaining": _two(
        11, (3, 8), weight=(1, 4), request=(10, 10)
    ),
    "two queues: distributes remainder based on creation time": _two(11, (6, 5)),
    "two queues: priority doesn't affect deserved": _two(4, (2, 2), priority=(1, 2)),
    "two queues: priority does affect over-quota": _two(6, (2, 4), priority=(1, 2)),
    "two queues: priority affects over-quota, even when overQuotaWeight is set": _two(
        6, (2, 4), priority=(1, 2), weight=(100, 1)
    ),
    "divides the remainder even when using priorities": Case(
        5, (Q(2, 2, 5, priority=2), Q(2, 2, 5, priority=2), Q(1, 2, 0, priority=1)), (3, 2, 0)
    ),
    # SetResourcesShare (queues created at one instant: ties go by name)
    "one queue: enough resources - gets all request": Case(
        10, (Q(1, 1, 1),), (1,), same_creation_time=True
    ),
    "one queue: not enough resources - gets all cluster": Case(
        1, (Q(2, 1, 3),), (2,), same_creation_time=True, over_capacity=True
    ),
    "two queues: enough resources - gets all request": Case(
        10, (Q(1, 1, 1), Q(1, 1, 1)), (1, 1), same_creation_time=True
    ),
    "two queues: same over quota and deserved - divide evenly": Case(
        10, (Q(1, 1, 8), Q(1, 1, 8)), (5, 5), same_creation_time=True
    ),
    "two queues: different over quota": Case(
        1000, (Q(250, 1, 5000), Q(150, 2, 5000)), (450, 550), same_creation_time=True
    ),
    "two queues: different over quota and max allowed": Case(
        1000,
        (Q(250, 1, 5000), Q(150, 2, 5000, limit=400)),
        (600, 400),
        same_creation_time=True,
    ),
    "three queues: divide resource evenly": Case(
        9999, (Q(1000, 1, 10000),) * 3, (3333, 3333, 3333), same_creation_time=True
    ),
    "three queues: different over quota": Case(
        9999,
        (Q(0, 6, 10000), Q(0, 2, 10000), Q(0, 1, 10000)),
        (6666, 2222, 1111),
        same_creation_time=True,
    ),
    "advanced: fractional fair share": Case(
        45,
        (Q(12, 12, 32.54999999999996), Q(7, 7, 9.5), Q(2, 2, 1.65, limit=2)),
        (32.54999999999996, 9.5, 1.65),
        same_creation_time=True,
    ),
    "advanced: divide last remaining GPU based on similar queues": Case(
        5, (Q(2, 2, 3), Q(2, 2, 3)), (3, 2), same_creation_time=True
    ),
    # Time-aware cases (KAI's rule: W' and P recomputed every round over the unsatisfied).
    "time-aware: usage 0.5/0/0, k = 1, requests 100/5/100": Case(
        30,
        (Q(0, 1, 100, usage=0.5), Q(0, 1, 5), Q(0, 1, 100)),
        (6, 5, 19),
        k=1.0,
    ),
    # Round 1: W' = 1/3 each, P = (0, 1, 1): offers 0 / 10 / 10, q2 takes its 2, q3 10. Round 2
    # over q1 and q3: W' = 1/2, P = (0.5, 1.5): offers 2 / 6 of the 8 left.
    "time-aware: heavy user recovers weight once a light one is satisfied": Case(
        20,
        (Q(0, 1, 100, usage=0.5), Q(0, 1, 2), Q(0, 1, 100)),
        (2, 2, 16),
        k=2.0,
    ),
}

# The cases `division: gpufair` answers differently, and its answers: weight 0 is best effort
# (takes what nobody with a weight wants); weights are fixed per tier, so a satisfied queue's
# departure does not lift a heavy user's weight; guarantees are scaled to the capacity. A limit
# below the deserved quota caps the guarantee in both (DESIGN §3.1: min(deserved, demand, limit)).
GPUFAIR_DIFFERS: dict[str, tuple[float, ...]] = {
    "within quota: gives up to deserved when over subscribed": (1,),
    "within quota: gives up to full quota": (5,),
    "within quota: gives with fraction, if stated in deserved": (2,),
    "within quota: doesn't give if deserved is zero": (2,),
    "over quota: doesn't give when over quota weight is zero": (5,),
    "over quota: doesn't give when over quota weight is zero (10 left)": (5,),
    "two queues over quota: doesn't give when over quota weight is zero": (5, 3),
    "one queue: not enough resources - gets all cluster": (1,),
    "time-aware: usage 0.5/0/0, k = 1, requests 100/5/100": (5, 5, 20),
    "time-aware: heavy user recovers weight once a light one is satisfied": (0, 2, 18),
}


def _shares(case: Case, division: Division) -> tuple[float, ...]:
    names = [f"q{i + 1}" for i in range(len(case.queues))]
    queues = [
        Queue(
            name=name,
            quotas=frozen_map(
                {
                    POOL: QueueQuota(
                        pool=POOL,
                        deserved_cu=q.deserved,
                        over_quota_weight=q.weight,
                        limit_cu=q.limit,
                        priority=q.priority,
                    )
                }
            ),
            created_at_s=0.0 if case.same_creation_time else float(i),
        )
        for i, (name, q) in enumerate(zip(names, case.queues, strict=True))
    ]
    result = compute_fair_shares(
        FairShareInput(
            pool=POOL,
            policy=FairSharePolicy(
                k=case.k,
                usage_basis=UsageBasis.TOTAL,
                rounding=Rounding.WHOLE_GPUS,
                division=division,
                dead_band=0.0,
            ),
            gpu_types={GPU.name: GPU},
            capacity_gpus_by_type={GPU.name: case.capacity},
            queues=queues,
            demands={
                name: QueueDemand(pending_gpus_by_type={GPU.name: q.request})
                for name, q in zip(names, case.queues, strict=True)
                if q.request > 0
            },
            usage=UsageInputs(
                usage_cu_s={
                    name: q.usage * 1000.0 for name, q in zip(names, case.queues, strict=True)
                },
                group_capacity_cu_s={None: 1000.0},
            ),
        )
    )
    return tuple(result.shares[name].fair_share_cu for name in names)


@pytest.mark.parametrize("name", list(CASES))
def test_kai_profile_gives_kai_numbers(name: str) -> None:
    case = CASES[name]
    got = _shares(case, Division.KAI)
    if case.over_capacity:
        # gpufair scales guarantees to the capacity in both profiles (docs/kai-compatibility.md).
        assert sum(got) == pytest.approx(case.capacity)
        assert sum(case.kai) > case.capacity
    else:
        assert got == pytest.approx(case.kai, abs=1e-9)


@pytest.mark.parametrize("name", list(CASES))
def test_gpufair_profile_differs_only_where_it_chose_to(name: str) -> None:
    case = CASES[name]
    expected = GPUFAIR_DIFFERS.get(name, case.kai)
    assert _shares(case, Division.GPUFAIR) == pytest.approx(expected, abs=1e-9)


def _gpufair_agrees(case: Case) -> bool:
    return bool(_shares(case, Division.GPUFAIR) == pytest.approx(case.kai, abs=1e-9))


def test_agreement_counts_under_each_profile() -> None:
    kai_agree = sum(
        1
        for case in CASES.values()
        if _shares(case, Division.KAI) == pytest.approx(case.kai, abs=1e-9)
    )
    gpufair_agree = sum(1 for case in CASES.values() if _gpufair_agrees(case))
    assert (len(CASES), kai_agree, gpufair_agree) == (40, 38, 30)


def test_limit_below_deserved_caps_the_guarantee_in_both_profiles() -> None:
    # 10 GPUs; q1 deserves 4 with a limit of 2 and wants 10, q2 has no quota and wants 10.
    case = Case(10, (Q(4, 1, 10, limit=2), Q(0, 1, 10)), (2, 8))
    assert _shares(case, Division.KAI) == (2, 8)
    assert _shares(case, Division.GPUFAIR) == (2, 8)


def test_kai_weight_zero_leaves_capacity_idle_that_gpufair_gives_as_best_effort() -> None:
    case = Case(10, (Q(2, 0, 10), Q(2, 1, 4)), (2, 4))
    assert _shares(case, Division.KAI) == (2, 4)  # 4 GPUs stay idle
    assert _shares(case, Division.GPUFAIR) == (6, 4)  # best effort takes them


def test_kai_explain_record_shows_the_first_round_weights() -> None:
    case = CASES["time-aware: usage 0.5/0/0, k = 1, requests 100/5/100"]
    names = ["q1", "q2", "q3"]
    queues = [
        Queue(name, quotas=frozen_map({POOL: QueueQuota(pool=POOL)}), created_at_s=i)
        for i, name in enumerate(names)
    ]
    result = compute_fair_shares(
        FairShareInput(
            pool=POOL,
            policy=FairSharePolicy(k=1.0, usage_basis=UsageBasis.TOTAL, division=Division.KAI),
            gpu_types={GPU.name: GPU},
            capacity_gpus_by_type={GPU.name: case.capacity},
            queues=queues,
            demands={n: QueueDemand(pending_gpus_by_type={"gpu": 100.0}) for n in names},
            usage=UsageInputs(usage_cu_s={"q1": 500.0}, group_capacity_cu_s={None: 1000.0}),
        )
    )
    q1 = result.shares["q1"]
    # Round 1: W' = 1/3 each; P = 1/3 + (1/3 − 1/2) = 1/6 for q1, 2/3 for the others.
    assert (q1.weight_share, q1.priority_weight, q1.effective_weight) == pytest.approx(
        (1 / 3, 1 / 6, 1 / 9)
    )
    assert q1.competes_over_quota
    # Continuous: round 1 offers 30/9, 120/9, 120/9; nobody is satisfied, so that is all.
    shares = [result.shares[n].fair_share_cu for n in names]
    assert shares == pytest.approx([30 / 9, 120 / 9, 120 / 9])


@pytest.mark.parametrize(
    ("now_s", "gpufair_lo_s", "kai_lo_s"),
    [
        (
            1000.0 + 7 * 86400,
            1000.0 + 7 * 86400,
            1000.0,
        ),  # on a boundary: KAI keeps the last period
        (1000.0 + 7 * 86400 + 1, 1000.0 + 7 * 86400, 1000.0 + 7 * 86400),  # just after: both new
        (1000.0 + 3 * 86400, 1000.0, 1000.0),  # inside the first period: both from the anchor
        (1000.0, 1000.0, 1000.0),  # at the anchor: an empty window in both
        (500.0, 1000.0 - 7 * 86400, 500.0),  # before the anchor: KAI counts nothing yet
    ],
)
def test_tumbling_window_boundary(now_s: float, gpufair_lo_s: float, kai_lo_s: float) -> None:
    week = FairSharePolicy(
        window_kind=WindowKind.TUMBLING, window_s=7 * 86400.0, window_anchor_unix_s=1000.0
    )
    assert window_bounds(now_s, week) == (gpufair_lo_s, now_s)
    assert window_bounds(now_s, replace(week, division=Division.KAI)) == (kai_lo_s, now_s)


def test_guarantees_above_capacity_shrink_in_proportion_in_both_profiles() -> None:
    # KAI: 6 / 2 on 4 GPUs (first come, first served); gpufair keeps 6 : 2 within the 4.
    case = Case(4, (Q(6, 1, 10), Q(2, 1, 10)), (6, 2), over_capacity=True)
    assert _shares(case, Division.KAI) == (3, 1)
    assert _shares(case, Division.GPUFAIR) == (3, 1)


def test_kai_profile_ignores_the_dead_band() -> None:
    """The previous weights would keep q1 at 0.5 under gpufair's band; KAI has no band."""
    queues = [Queue(n, quotas=frozen_map({POOL: QueueQuota(pool=POOL)})) for n in ("q1", "q2")]
    inputs = {
        "pool": POOL,
        "gpu_types": {GPU.name: GPU},
        "capacity_gpus_by_type": {GPU.name: 10.0},
        "queues": queues,
        "demands": {n: QueueDemand(pending_gpus_by_type={"gpu": 10.0}) for n in ("q1", "q2")},
        "usage": UsageInputs(usage_cu_s={"q1": 100.0}, group_capacity_cu_s={None: 1000.0}),
        "previous_effective_weights": {"q1": 0.5, "q2": 0.5},
    }
    banded = FairSharePolicy(k=1.0, usage_basis=UsageBasis.TOTAL, dead_band=0.2)
    # P = (0.5 + 0.5 − 0.1, 1) = (0.9, 1): effective 0.47 / 0.53, within 0.2 of 0.5.
    gpufair = compute_fair_shares(FairShareInput(policy=banded, **inputs))  # type: ignore[arg-type]
    kai = compute_fair_shares(
        FairShareInput(policy=replace(banded, division=Division.KAI), **inputs)  # type: ignore[arg-type]
    )
    assert gpufair.shares["q1"].fair_share_cu == pytest.approx(5.0)
    assert kai.shares["q1"].fair_share_cu == pytest.approx(10 * 0.9 / 1.9)
