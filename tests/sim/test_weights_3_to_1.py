"""Weights 3 : 1, large gangs against many small jobs, over four weeks (DESIGN §1.1).

examples/scenarios/weights-3-to-1.yaml as written (28 days, 7-day window, k = 1), with cycles
every 10 minutes and recomputes every hour instead of every 5 and 15 minutes, to keep the test
fast. The shares are of the over-quota CU-hours of the whole run.
"""

from __future__ import annotations

import dataclasses

import pytest
from sim_support import example_data, queue_metrics, run, scenario_from, with_k

from gpufair.sim.metrics import RunMetrics


@pytest.fixture(scope="module")
def runs() -> dict[float, RunMetrics]:
    scenario = scenario_from(example_data("weights-3-to-1"))
    scenario = dataclasses.replace(scenario, cycle_s=600.0, recompute_s=3600.0)
    return {k: run(with_k(scenario, k))[1] for k in (0.0, 1.0)}


def shares(metrics: RunMetrics) -> tuple[float, float]:
    training = queue_metrics(metrics, "training").over_quota_share
    notebooks = queue_metrics(metrics, "notebooks").over_quota_share
    assert training is not None and notebooks is not None
    return training, notebooks


def test_time_based_fair_share_brings_the_split_within_5_points_of_75_25(
    runs: dict[float, RunMetrics],
) -> None:
    training, notebooks = shares(runs[1.0])
    assert abs(training - 0.75) <= 0.05
    assert abs(notebooks - 0.25) <= 0.05
    assert queue_metrics(runs[1.0], "training").weight_share == 0.75


def test_classic_fair_share_leaves_the_small_job_queue_well_above_its_25_percent(
    runs: dict[float, RunMetrics],
) -> None:
    training, notebooks = shares(runs[0.0])
    # One 40-GPU gang fits training's 78-GPU share, two do not: notebooks fill the rest.
    assert notebooks >= 0.5
    assert training <= 0.5
    jain = runs[0.0].pools[0].jain_index[""]
    time_based_jain = runs[1.0].pools[0].jain_index[""]
    assert jain is not None and time_based_jain is not None
    assert time_based_jain > 0.95 > jain
