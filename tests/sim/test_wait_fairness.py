"""Wait fairness per queue: P50 / P99, their ratio and the median completion time, on runs a
user can check by hand, and two equal queues that submit at different times."""

from __future__ import annotations

import pytest
from sim_support import run, scenario_from, unit_cluster

from gpufair.sim.fairness import wait_fairness
from gpufair.sim.outputs import run_summary


def test_a_tiny_run_by_hand() -> None:
    """4 GPUs, one queue: four 4-GPU jobs of 1 h at 0 run one after another, so they wait
    0, 1, 2 and 3 h and complete after 1, 2, 3 and 4 h."""
    data = {
        "name": "queue-up",
        "duration_s": "5h",
        "cycle_s": 60,
        "cluster": unit_cluster([("n1", 4)], [{"name": "a"}], k=0.0),
        "workloads": [
            {"uid": f"a{i}", "queue": "a", "gpus_per_pod": 4, "duration_s": "1h", "submit_s": i}
            for i in range(4)
        ],
    }
    result, metrics = run(scenario_from(data))
    (row,) = wait_fairness(result)
    assert (row.queue, row.jobs, row.completed) == ("a", 4, 4)
    waits = sorted(round(job.wait_s) for job in result.jobs)
    assert waits == [0, 3599, 7198, 10797]  # submitted 1 s apart, started on the hour
    assert row.wait_p50_s == pytest.approx((3599 + 7198) / 2)
    assert row.wait_p99_s == pytest.approx(10797 - 0.03 * (10797 - 7198))
    assert row.p99_over_p50 == pytest.approx((10797 - 0.03 * 3599) / ((3599 + 7198) / 2))
    assert row.completion_p50_s == pytest.approx((3599 + 7198) / 2 + 3600)
    summary = run_summary(result, metrics)["wait_fairness"]
    assert summary[0]["wait_p99_over_p50"] == pytest.approx(row.p99_over_p50)


def test_the_ratio_floors_a_zero_median_at_one_cycle() -> None:
    """Nine jobs start at once, the tenth waits an hour: P50 0 s reads as one 60 s cycle."""
    data = {
        "name": "one-late",
        "duration_s": "3h",
        "cycle_s": 60,
        "cluster": unit_cluster([("n1", 9)], [{"name": "a"}], k=0.0),
        "workloads": [
            {"uid": f"a{i}", "queue": "a", "duration_s": "1h", "submit_s": 0} for i in range(10)
        ],
    }
    result, _ = run(scenario_from(data))
    (row,) = wait_fairness(result)
    assert row.wait_p50_s == 0.0
    assert row.wait_p99_s == pytest.approx(0.91 * 3600)
    assert row.p99_over_p50 == pytest.approx(0.91 * 3600 / 60)


def test_two_equal_queues_submitting_at_different_times_wait_alike() -> None:
    """16 GPUs, queues a and b of equal weight (time-aware, k = 1), three days. Each day a sends
    1-GPU jobs of about an hour (9 an hour) from 0 h to 16 h, b the same from 8 h to 24 h: alone
    each uses 9 of 16 GPUs, in the 8 overlapping hours together they ask for 18, so a backlog
    builds and drains every day. Offset by 8 hours, the two still wait alike: P50 about a minute
    for both (46 s and 67 s), P99 6669 s and 6803 s (within 25 %)."""
    stream = {"rate_per_h": 9, "duration_s": {"exponential": "1h"}, "min_runtime_s": 0}
    generators = []
    for day in range(3):
        start_s = day * 86400
        generators += [
            {"queue": "a", "name": f"a-d{day}", "start_s": start_s, "stop_s": start_s + 16 * 3600},
            {"queue": "b", "name": f"b-d{day}", "start_s": start_s + 8 * 3600,
             "stop_s": start_s + 24 * 3600},
        ]  # fmt: skip
    data = {
        "name": "offset-queues",
        "duration_s": "3d",
        "cycle_s": 60,
        "seed": 7,
        "cluster": unit_cluster([("n1", 8), ("n2", 8)], [{"name": "a"}, {"name": "b"}], k=1.0),
        "generators": [{**generator, **stream} for generator in generators],
    }
    result, _ = run(scenario_from(data))
    a, b = wait_fairness(result)
    assert (a.queue, a.jobs, b.queue, b.jobs) == ("a", 414, "b", 464)
    assert a.wait_p50_s is not None and b.wait_p50_s is not None
    assert a.wait_p99_s is not None and b.wait_p99_s is not None
    assert a.completion_p50_s is not None and b.completion_p50_s is not None
    assert round(a.wait_p50_s) == 46 and round(b.wait_p50_s) == 67
    assert round(a.wait_p99_s) == 6669 and round(b.wait_p99_s) == 6803
    assert 1 / 1.25 <= b.wait_p99_s / a.wait_p99_s <= 1.25
    assert 1 / 1.25 <= b.completion_p50_s / a.completion_p50_s <= 1.25
