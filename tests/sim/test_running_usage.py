"""The simulator keeps each pool's decayed usage as the run goes (`running_usage.PoolUsage`)
instead of integrating the whole history at every recompute. At every recompute of these runs
it must give what `usage.usage_inputs` gives over the allocation history so far, queue by queue
and group by group, to float precision: a department over two teams beside a top-level team, jobs
of random sizes and lengths arriving at random, under each window kind, with and without a
half-life, both usage bases."""

from __future__ import annotations

from typing import Any

import pytest
from sim_support import scenario_from, unit_cluster

from gpufair.domain.usage import Segment, usage_inputs
from gpufair.sim.engine import Simulation

POLICIES: list[dict[str, Any]] = [
    {"window_kind": "sliding", "window_s": "2h", "half_life_s": "30m"},
    {"window_kind": "sliding", "window_s": "90m"},
    {"window_kind": "tumbling", "window_s": "3h", "window_anchor_unix_s": 1800},
    {"window_kind": "tumbling", "window_s": "2h", "half_life_s": "1h", "division": "kai"},
    {"window_kind": "none", "half_life_s": "40m"},
    {"window_kind": "sliding", "window_s": "2h", "half_life_s": "1h", "usage_basis": "total"},
    # A half-life of 1 minute over 12 hours: the running sums' reference instant moves 11 times.
    {"window_kind": "sliding", "window_s": "3h", "half_life_s": "1m"},
]


def _scenario(policy: dict[str, Any]) -> dict[str, Any]:
    cluster = unit_cluster(
        [("n1", 8), ("n2", 8)],
        [
            {"name": "t1", "deserved_cu": 3},
            {"name": "t2", "deserved_cu": 2},
            {"name": "solo", "deserved_cu": 4},
        ],
        recompute_interval_s=600,
        **policy,
    )
    cluster["pools"][0]["policy"].pop("window_s", None) if policy["window_kind"] == "none" else None
    cluster["queues"].insert(0, {"name": "dept", "quotas": [{"pool": "default", "deserved_cu": 6}]})
    for team in cluster["queues"][1:3]:
        team["parent"] = "dept"
    generators = [
        {
            "name": f"{queue}-jobs",
            "queue": queue,
            "rate_per_h": rate,
            "pods": 1,
            "gpus_per_pod": {"choice": [1, 2, 4]},
            "duration_s": {"uniform": ["10m", "3h"]},
        }
        for queue, rate in (("t1", 3.0), ("t2", 2.0), ("solo", 4.0))
    ]
    return {
        "name": "running-usage",
        "seed": 5,
        "duration_s": "12h",
        "cycle_s": 60,
        "cluster": cluster,
        "generators": generators,
    }


class _Checked(Simulation):
    """A run that compares, before every recompute, the kept usage with the full integral."""

    compared = 0
    most_usage = 0.0  # the largest leaf usage compared, CU·s

    def _recompute(self, pool: Any, now_s: float) -> None:
        kept = pool.usage.inputs(now_s)
        leaves = {}
        for queue in pool.leaves:
            changes = pool.histories[queue.name].changes
            ends = [at_s for at_s, _ in changes[1:]] + [now_s]
            leaves[queue.name] = [
                Segment(at_s, end_s, value)
                for (at_s, value), end_s in zip(changes, ends, strict=True)
                if value != 0.0 and end_s > at_s
            ]
        capacity = [Segment(0.0, now_s, pool.capacity_cu)] if now_s > 0.0 else []
        full = usage_inputs(
            pool=pool.name,
            policy=pool.policy,
            queues=pool.queues,
            gpu_types=pool.types_by_name,
            leaf_allocations=leaves,
            capacity=capacity,
            now_s=now_s,
        )
        assert list(kept.usage_cu_s) == list(full.usage_cu_s)
        assert list(kept.group_capacity_cu_s) == list(full.group_capacity_cu_s)
        pairs = [
            *((kept.usage_cu_s[q], v, q) for q, v in full.usage_cu_s.items()),
            *((kept.group_capacity_cu_s[g], v, g) for g, v in full.group_capacity_cu_s.items()),
        ]
        for found, value, key in pairs:
            assert found == pytest.approx(value, rel=1e-9, abs=1e-9), (now_s, key)
        leaf_usage = (full.usage_cu_s[q.name] for q in pool.leaves)
        self.most_usage = max(self.most_usage, *leaf_usage)
        self.compared += 1
        super()._recompute(pool, now_s)


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: "-".join(map(str, p.values())))
def test_the_kept_usage_is_the_full_integral_at_every_recompute(policy: dict[str, Any]) -> None:
    simulation = _Checked(scenario_from(_scenario(policy)))
    result = simulation.run()
    (pool,) = result.pools
    # 72 periodic recomputes over 12 hours, and one before each cycle after a change.
    assert simulation.compared == pool.recomputes > 72
    assert sum(1 for d in result.decisions if d.event == "bind") > 40
    assert simulation.most_usage > 500.0  # some queue ran above its quota (CU·s, decayed)
