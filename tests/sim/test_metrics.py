"""Metrics: the formulas on plain numbers, and a tiny run computed by hand."""

from __future__ import annotations

import pytest
from sim_support import queue_metrics, run, scenario_from, unit_cluster

from gpufair.sim.metrics import jain_index, percentile, step_integral


def test_jain_index_is_1_for_equal_shares_and_1_over_n_for_one_taker() -> None:
    assert jain_index([1.0, 1.0]) == 1.0
    assert jain_index([1.0, 0.0]) == 0.5
    assert jain_index([3.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert jain_index([]) is None


def test_percentiles_interpolate_between_order_statistics() -> None:
    waits = [40.0, 0.0, 10.0, 30.0, 20.0]
    assert percentile(waits, 50) == 20.0
    assert percentile(waits, 99) == pytest.approx(39.6)
    assert percentile(waits, 100) == 40.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_step_integral_counts_only_the_part_above_the_threshold() -> None:
    changes = [(0.0, 4.0), (10.0, 1.0), (20.0, 3.0)]
    assert step_integral(changes, 30.0) == 80.0
    assert step_integral(changes, 30.0, minus=2.0) == 2 * 10 + 1 * 10
    assert step_integral(changes, 15.0) == 45.0


def test_a_tiny_run_computed_by_hand() -> None:
    """4 GPUs. Queue a (deserved 2) runs 2 GPUs for an hour from 0; queue b (deserved 0) wants
    all 4 at once from 0, so it waits an hour beside 2 idle GPUs, then runs an hour. 3 hours."""
    data = {
        "name": "tiny",
        "duration_s": "3h",
        "cycle_s": 60,
        "cluster": unit_cluster(
            [("n1", 4)], [{"name": "a", "deserved_cu": 2}, {"name": "b"}], k=1.0
        ),
        "workloads": [
            {"uid": "a1", "queue": "a", "pods": 1, "gpus_per_pod": 2, "duration_s": "1h"},
            {"uid": "b1", "queue": "b", "pods": 1, "gpus_per_pod": 4, "duration_s": "1h"},
        ],
    }
    result, metrics = run(scenario_from(data))
    jobs = {j.workload.uid: j for j in result.jobs}
    assert (jobs["a1"].first_start_s, jobs["a1"].end_s, jobs["a1"].wait_s) == (0, 3600, 0)
    assert (jobs["b1"].first_start_s, jobs["b1"].end_s, jobs["b1"].wait_s) == (3600, 7200, 3600)
    a, b = queue_metrics(metrics, "a"), queue_metrics(metrics, "b")
    assert (a.allocated_cu_hours, a.over_quota_cu_hours) == (2, 0)
    assert (b.allocated_cu_hours, b.over_quota_cu_hours) == (4, 4)
    # a never wanted more than its quota: it is owed none of the over-quota pool.
    assert (a.competed, a.over_quota_share, a.share_error_pp) == (False, None, None)
    assert (b.weight_share, b.over_quota_share, b.share_error_pp) == (1.0, 1.0, 0.0)
    assert (b.wait_p50_s, b.wait_p99_s, b.wait_max_s) == (3600, 3600, 3600)
    assert (a.wait_max_s, b.jobs_completed, b.evictions) == (0, 1, 0)
    (pool,) = metrics.pools
    assert pool.utilisation == 0.5  # (2 + 4) CU-hours of 4 CU x 3 h
    assert pool.allocated_gpu_hours == 6
    assert pool.idle_gpu_hours_while_pending == 2  # b waited an hour beside 2 free GPUs
    assert pool.fragmented_gpus_max == 2  # node n1 half used
    assert pool.jain_index[""] == 1.0
    assert pool.evictions_per_100_gpu_hours == 0
