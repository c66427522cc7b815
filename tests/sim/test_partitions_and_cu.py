"""Partition requests and compute-unit requests in simulator scenario files."""

from __future__ import annotations

from typing import Any

import pytest
from sim_support import queue_metrics, run, scenario_from

from gpufair.sim.scenario import ScenarioError

MIG_1G = {
    "name": "1g.10gb",
    "gpu_fraction": 1 / 7,
    "memory_gib": 10,
    "memory_slices": 1,
    "starts": [0, 1, 2, 3, 4, 5, 6],
}


def scenario(workloads: list[dict[str, Any]]) -> dict[str, Any]:
    """One A100 (10 CU, MIG 1g.10gb) and eight RTX 4090s (2 CU); one queue deserving 30 CU."""
    node = {"pool": "default", "cpu_millicores": 64000, "memory_mib": 512000}
    return {
        "name": "mig-and-cu",
        "duration_s": "4h",
        "cycle_s": 60,
        "cluster": {
            "gpu_types": [
                {
                    "name": "a100-80gb",
                    "memory_gib": 80,
                    "compute_weight": 10,
                    "partition_profiles": [MIG_1G],
                },
                {"name": "rtx4090-24gb", "memory_gib": 24, "compute_weight": 2},
            ],
            "pools": [{"name": "default", "policy": {"window_s": "1d"}}],
            "queues": [{"name": "team", "quotas": [{"pool": "default", "deserved_cu": 30}]}],
            "nodes": [
                {**node, "name": "a1", "gpu_type": "a100-80gb", "gpu_count": 1},
                {**node, "name": "r1", "gpu_type": "rtx4090-24gb", "gpu_count": 8},
            ],
        },
        "workloads": workloads,
    }


def test_eight_1g_jobs_share_one_a100_seven_at_a_time_and_a_cu_job_takes_4090s() -> None:
    jobs = [
        {"uid": f"m{i}", "queue": "team", "partition_profile": "1g.10gb", "duration_s": "1h"}
        for i in range(1, 9)
    ]
    jobs.append({"uid": "cu", "queue": "team", "compute_units": 8, "duration_s": "1h"})
    result, metrics = run(scenario_from(scenario(jobs)))
    by_uid = {j.workload.uid: j for j in result.jobs}
    # Seven instances fill the A100's seven compute slices at once; the eighth waits for one.
    assert [by_uid[f"m{i}"].first_start_s for i in range(1, 8)] == [0.0] * 7
    assert by_uid["m8"].first_start_s == 3600.0
    assert {by_uid[f"m{i}"].gpu_type for i in range(1, 9)} == {"a100-80gb"}
    assert by_uid["m1"].gpus == pytest.approx(1 / 7)
    # 8 CU: four RTX 4090s (8 CU) before one A100 (10 CU), which the partitions hold anyway.
    cu = by_uid["cu"]
    assert (cu.gpu_type, cu.gpus, cu.first_start_s) == ("rtx4090-24gb", 4.0, 0.0)
    # Usage counts what was given: 8 partitions of 10/7 CU for an hour, plus 8 CU for an hour.
    assert queue_metrics(metrics, "team").allocated_cu_hours == pytest.approx(8 * 10 / 7 + 8)


def test_an_unknown_profile_in_a_scenario_is_a_problem_with_its_path() -> None:
    jobs = [{"uid": "x", "queue": "team", "partition_profile": "2g.20gb", "duration_s": "1h"}]
    with pytest.raises(ScenarioError) as caught:
        scenario_from(scenario(jobs))
    assert "workloads[0].partition_profile" in str(caught.value)
    assert "no GPU type declares partition profile '2g.20gb'" in str(caught.value)


def test_a_mixed_cu_job_runs_on_an_a100_and_4090s_of_one_rack() -> None:
    data = scenario([])
    for item in data["cluster"]["nodes"]:
        item["labels"] = {"rack": "r1"}
    data["workloads"] = [
        {
            "uid": "mix",
            "queue": "team",
            "compute_units": 20,
            "mixed_gpu_types": True,
            "topology": {"level": "rack", "required": True},
            "duration_s": "1h",
        }
    ]
    result, metrics = run(scenario_from(data))
    (job,) = result.jobs
    # Ten 4090s or two A100s are not there (8 and 1): one A100 and five 4090s give 20 CU.
    assert (job.first_start_s, job.gpus, job.cu) == (0.0, 6.0, 20.0)
    assert queue_metrics(metrics, "team").allocated_cu_hours == pytest.approx(20.0)


def test_a_mixed_cu_job_counts_its_gpus_on_each_type_it_holds() -> None:
    """`mix` (20 CU, one rack) holds one A100 and five 4090s for an hour from 0; `four` wants
    four 4090s from 60 s and waits for them, beside the three 4090s `mix` left free. As the
    ledger does, each type's GPUs count on that type: demand, idle GPUs, events."""
    data = scenario([])
    for item in data["cluster"]["nodes"]:
        item["labels"] = {"rack": "r1"}
    data["timeline_s"] = "30m"
    data["workloads"] = [
        {
            "uid": "mix",
            "queue": "team",
            "compute_units": 20,
            "mixed_gpu_types": True,
            "topology": {"level": "rack", "required": True},
            "duration_s": "1h",
        },
        {
            "uid": "four",
            "queue": "team",
            "gpus_per_pod": 4,
            "gpu_types": ["rtx4090-24gb"],
            "submit_s": 60,
            "duration_s": "1h",
        },
    ]
    result, metrics = run(scenario_from(data))
    binds = [(d.uid, d.time_s, d.gpus, d.cu) for d in result.decisions]
    assert binds == [("mix", 0.0, 6.0, 20.0), ("four", 3600.0, 4.0, 8.0)]
    # At 30 min the queue holds 10 + 10 CU and waits for four 4090s (8 CU); only eight 4090s
    # exist, so its demand is one A100 and eight 4090s: 26 CU, the whole pool.
    (at_30m,) = [r for r in result.timeline if r.time_s == 1800.0]
    assert (at_30m.allocated_cu, at_30m.fair_share_cu) == (20.0, 26.0)
    # `four` waited 59 minutes beside three free 4090s (the A100 is not of its type).
    (pool,) = metrics.pools
    assert pool.idle_gpu_hours_while_pending == pytest.approx(3 * 3540 / 3600)
