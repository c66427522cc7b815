"""What the store infers from a record (`fairshare_repo.competed_weights`): a queue competed for
over-quota capacity exactly when its stored W' is above 0. Records keep no flag of their own;
this holds the division to what the inference needs, on the random trees of both divisions
(`test_fairshare_plan.py`): a competing queue's W' is w / Σw over a tier of positive weights,
or an equal share among best-effort queues, and every other queue's is 0."""

from __future__ import annotations

import random

import pytest
from test_fairshare_plan import _random_input, _random_policy, _random_tree

from gpufair.domain.fairshare import compute_fair_shares
from gpufair.domain.model import Division
from gpufair.store.fairshare_repo import StoredRun, StoredShare, competed_weights


@pytest.mark.parametrize("seed", range(300))
def test_a_queue_competed_exactly_when_its_stored_weight_share_is_above_zero(seed: int) -> None:
    rng = random.Random(7000 + seed)
    policy = _random_policy(rng)
    result = compute_fair_shares(
        _random_input(rng, _random_tree(rng, policy.division == Division.KAI), policy)
    )
    records = dict(result.shares)
    assert {name for name, r in records.items() if r.weight_share > 0.0} == result.competing
    assert all((r.weight_share > 0.0) is r.competes_over_quota for r in records.values())
    stored = StoredRun(
        1,
        result.pool,
        0.0,
        result.capacity_cu,
        tuple(
            StoredShare(
                0.0,
                name,
                r.parent,
                r.priority,
                r.deserved_cu,
                r.demand_cu,
                r.limit_cu,
                r.allocated_cu,
                r.weight_share,
                r.usage_share,
                r.priority_weight,
                r.effective_weight,
                r.fair_share_cu,
                r.decayed_usage_cu_s,
                dict(r.fair_share_gpus_by_type),
            )
            for name, r in records.items()
        ),
    )
    assert competed_weights(stored) == dict(result.effective_weights)
