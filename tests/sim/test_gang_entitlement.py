"""Gang entitlement in the simulator (issue 20): the two cases time-based fair share alone cannot
serve, from examples/scenarios/burst-gang.yaml and weights-3-to-1-large-gangs.yaml, each with the
pool policy `gang_entitlement` off and on.

- Burst: 16 GPUs, three equal queues, k = 1; team-c's 12-GPU gangs exceed the 2/3 of the pool
  (10.67 GPUs) the formula can give it. Without the rule they never run in the week; with it
  the first starts within 24 simulated hours of arriving, and team-a and team-b still split
  their part equally (within 5 points).
- Weights 3 : 1 with 20-GPU gangs on 64 GPUs, four weeks (cycles every 10 minutes, recomputes
  every hour instead of 5 and 15 minutes, to keep the test fast): 62.5 / 37.5 without the rule
  whatever k; with it, k = 1 gives 75 / 25 within 2 points, and k = 0 (classic) is unchanged.

Shares are of the over-quota CU-hours of the whole run.
"""

from __future__ import annotations

import dataclasses

import pytest
from sim_support import example_data, queue_metrics, run, scenario_from, with_k

from gpufair.sim.engine import SimResult
from gpufair.sim.metrics import RunMetrics
from gpufair.sim.scenario import Scenario

HOUR_S = 3600.0
DAY_S = 86_400.0


def entitlement(scenario: Scenario, on: bool) -> Scenario:
    return scenario.with_pools(lambda pool: dataclasses.replace(pool, gang_entitlement=on))


def share(metrics: RunMetrics, queue: str) -> float:
    found = queue_metrics(metrics, queue).over_quota_share
    assert found is not None
    return found


@pytest.fixture(scope="module")
def burst() -> dict[bool, tuple[SimResult, RunMetrics]]:
    scenario = scenario_from(example_data("burst-gang"))
    return {on: run(entitlement(scenario, on)) for on in (False, True)}


def test_burst_gang_never_runs_without_entitlement(
    burst: dict[bool, tuple[SimResult, RunMetrics]],
) -> None:
    result, metrics = burst[False]
    gangs = [job for job in result.jobs if job.workload.queue == "team-c"]
    assert gangs and all(job.first_start_s is None for job in gangs)
    assert share(metrics, "team-c") == 0.0
    assert metrics.pools[0].evictions == 0


def test_burst_gang_runs_within_a_day_and_the_others_stay_equal(
    burst: dict[bool, tuple[SimResult, RunMetrics]],
) -> None:
    result, metrics = burst[True]
    first = next(job for job in result.jobs if job.workload.queue == "team-c")
    assert first.workload.submit_time_s == DAY_S
    assert first.first_start_s is not None
    assert first.first_start_s - first.workload.submit_time_s <= 24 * HOUR_S
    a, b, c = (share(metrics, q) for q in ("team-a", "team-b", "team-c"))
    assert abs(a - b) <= 0.05
    assert abs(a - 1 / 3) <= 0.05 and abs(b - 1 / 3) <= 0.05
    assert c >= 0.25  # from no share at all
    jain = metrics.pools[0].jain_index[""]
    assert jain is not None and jain >= 0.99
    # Every eviction was for one of team-c's gangs, and said so.
    evictions = [d for d in result.decisions if d.event == "evict"]
    assert evictions
    assert {d.reason for d in evictions} == {"entitlement"}
    assert {d.beneficiary_queue for d in evictions} == {"team-c"}
    assert {d.queue for d in evictions} == {"team-a", "team-b"}


@pytest.fixture(scope="module")
def weights() -> dict[tuple[float, bool], RunMetrics]:
    scenario = scenario_from(example_data("weights-3-to-1-large-gangs"))
    scenario = dataclasses.replace(scenario, cycle_s=600.0, recompute_s=3600.0)
    return {
        (k, on): run(entitlement(with_k(scenario, k), on))[1]
        for k in (0.0, 1.0)
        for on in (False, True)
    }


def test_without_entitlement_the_heavy_queue_stops_at_two_gangs_whatever_k(
    weights: dict[tuple[float, bool], RunMetrics],
) -> None:
    for k in (0.0, 1.0):
        training = share(weights[(k, False)], "training")
        assert abs(training - 0.625) <= 0.01, k  # two 20-GPU gangs of 64 GPUs
    assert share(weights[(0.0, False)], "training") == share(weights[(1.0, False)], "training")


def test_with_entitlement_k1_reaches_75_25_and_classic_shows_the_difference(
    weights: dict[tuple[float, bool], RunMetrics],
) -> None:
    training = share(weights[(1.0, True)], "training")
    notebooks = share(weights[(1.0, True)], "notebooks")
    assert abs(training - 0.75) <= 0.02
    assert abs(notebooks - 0.25) <= 0.02
    assert abs(share(weights[(0.0, True)], "training") - 0.625) <= 0.01  # rule off at k = 0
    jain = weights[(1.0, True)].pools[0].jain_index[""]
    classic_jain = weights[(0.0, True)].pools[0].jain_index[""]
    assert jain is not None and classic_jain is not None
    assert jain > 0.99
    assert classic_jain < 0.95
