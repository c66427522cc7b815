"""The simulator divides by the pool's division profile, as the service does (issue 22).

10 GPUs; `lab` deserves 2 with over-quota weight 0 and submits eight 1-GPU jobs, `team` (no
quota, weight 1) four. gpufair treats weight 0 as best effort: lab's fair share is its 2 plus the
4 nobody else wants. KAI-Scheduler gives a weight-0 queue nothing above its quota: lab's fair
share stays 2 and 4 GPUs are in no queue's share.
"""

from __future__ import annotations

import pytest
from sim_support import run, scenario_from, unit_cluster


def _fair_shares_at_start(division: str) -> dict[str, float]:
    cluster = unit_cluster(
        [("n1", 10)],
        [{"name": "lab", "deserved_cu": 2, "weight": 0}, {"name": "team"}],
        division=division,
        usage_basis="total",
        rounding="whole_gpus",
    )
    workloads = [
        {"uid": f"{queue}-{i}", "queue": queue, "gpus_per_pod": 1, "duration_s": "2h"}
        for queue, count in (("lab", 8), ("team", 4))
        for i in range(count)
    ]
    data = {"name": "kai", "duration_s": "1h", "cluster": cluster, "workloads": workloads}
    result, _ = run(scenario_from(data))
    first = min(row.time_s for row in result.timeline)
    return {row.queue: row.fair_share_cu for row in result.timeline if row.time_s == first}


@pytest.mark.parametrize(
    ("division", "shares"),
    [("gpufair", {"lab": 6.0, "team": 4.0}), ("kai", {"lab": 2.0, "team": 4.0})],
)
def test_weight_zero_gets_over_quota_capacity_only_under_gpufair(
    division: str, shares: dict[str, float]
) -> None:
    assert _fair_shares_at_start(division) == shares
