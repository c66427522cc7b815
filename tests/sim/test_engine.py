"""The event loop: reclaim, eviction and requeue as the simulated batch system plays them, and
pools kept apart."""

from __future__ import annotations

from typing import Any

import pytest
from sim_support import queue_metrics, run, scenario_from, unit_cluster

from gpufair.sim.outputs import run_summary


def reclaim_scenario(on_evict: str) -> dict[str, Any]:
    """4 GPUs. b (no quota) starts a 3-hour job on all of them at 0; at 1 h, a (deserved 4)
    submits a 1-hour job on all of them, so the cycle reclaims b's job for it."""
    return {
        "name": "reclaim",
        "duration_s": "6h",
        "cycle_s": 60,
        "on_evict": on_evict,
        "cluster": unit_cluster([("n1", 4)], [{"name": "a", "deserved_cu": 4}, {"name": "b"}]),
        "workloads": [
            {"uid": "b1", "queue": "b", "gpus_per_pod": 4, "duration_s": "3h"},
            {"uid": "a1", "queue": "a", "gpus_per_pod": 4, "submit_s": "1h", "duration_s": "1h"},
        ],
    }


@pytest.mark.parametrize(("on_evict", "b_end_s"), [("resume", 14_460.0), ("restart", 18_060.0)])
def test_an_evicted_job_waits_again_and_resumes_or_restarts(on_evict: str, b_end_s: float) -> None:
    result, metrics = run(scenario_from(reclaim_scenario(on_evict)))
    jobs = {j.workload.uid: j for j in result.jobs}
    a1, b1 = jobs["a1"], jobs["b1"]
    # Evicted at 3600 (the victim stops at once), a1 binds at the next cycle, runs an hour; b1
    # starts again at the cycle where a1 ended.
    assert (a1.first_start_s, a1.end_s, a1.wait_s) == (3660.0, 7260.0, 60.0)
    assert (b1.first_start_s, b1.evictions, b1.end_s) == (0.0, 1, b_end_s)
    assert b1.wait_s == 7260.0 - 3600.0
    assert queue_metrics(metrics, "b").evictions == 1
    (pool,) = metrics.pools
    assert pool.evictions == 1
    # Idle while a1 waited for the capacity freed for it: 4 GPUs for one cycle.
    assert pool.idle_gpu_hours_while_pending == pytest.approx(4 * 60 / 3600)


@pytest.mark.parametrize(("on_evict", "lost_gpu_hours"), [("resume", 0.0), ("restart", 4.0)])
def test_work_thrown_away_by_an_eviction_is_counted_as_lost_gpu_hours(
    on_evict: str, lost_gpu_hours: float
) -> None:
    """b1 (3 hours on 4 GPUs) had run an hour when it was reclaimed: with `restart` those 4
    GPU-hours are done again (b1 holds 4 + 12 GPU-hours, not 12), with `resume` nothing is lost
    (4 + 8). a1 adds 4."""
    result, metrics = run(scenario_from(reclaim_scenario(on_evict)))
    assert queue_metrics(metrics, "b").lost_gpu_hours == lost_gpu_hours
    assert queue_metrics(metrics, "a").lost_gpu_hours == 0.0
    (pool,) = metrics.pools
    assert pool.lost_gpu_hours == lost_gpu_hours
    assert pool.allocated_gpu_hours == 4.0 + 4.0 + (8.0 if on_evict == "resume" else 12.0)
    summary = run_summary(result, metrics)
    assert summary["pools"][0]["lost_gpu_hours"] == lost_gpu_hours
    assert [q["lost_gpu_hours"] for q in summary["queues"]] == [0.0, lost_gpu_hours]


def test_pools_are_scheduled_apart_with_their_own_policies() -> None:
    cluster = unit_cluster([("n1", 4)], [{"name": "a"}, {"name": "b"}])
    cluster["pools"].append({"name": "batch", "policy": {"window_s": "2d", "k": 0}})
    cluster["nodes"].append({**cluster["nodes"][0], "name": "m1", "pool": "batch"})
    cluster["queues"][1]["quotas"].append({"pool": "batch", "deserved_cu": 4})
    data = {
        "name": "pools",
        "duration_s": "3h",
        "cluster": cluster,
        "workloads": [
            {"uid": "a1", "queue": "a", "pool": "default", "gpus_per_pod": 4, "duration_s": "1h"},
            {"uid": "b1", "queue": "b", "pool": "batch", "gpus_per_pod": 4, "duration_s": "1h"},
        ],
    }
    result, metrics = run(scenario_from(data))
    assert [p.pool for p in metrics.pools] == ["batch", "default"]
    assert [p.k for p in metrics.pools] == [0.0, 1.0]
    runs = {j.workload.uid: (j.first_start_s, j.end_s) for j in result.jobs}
    assert runs == {"a1": (0.0, 3600.0), "b1": (0.0, 3600.0)}  # each on its own pool's GPUs
    by_pool = {(q.pool, q.queue): q.allocated_cu_hours for q in metrics.queues}
    assert by_pool[("default", "a")] == 4 and by_pool[("batch", "b")] == 4
    assert by_pool[("default", "b")] == 0 and by_pool[("batch", "a")] == 0


def test_a_department_limit_holds_its_teams_in_the_simulator() -> None:
    """8 GPUs; department d (limit 4 CU) over teams t1 and t2, each submitting four 1-GPU,
    1-hour jobs at 0. The simulator passes the tree to the cycle: d never holds more than 4."""
    cluster = unit_cluster([("n1", 8)], [{"name": "t1"}, {"name": "t2"}])
    cluster["queues"].insert(
        0, {"name": "d", "quotas": [{"pool": "default", "deserved_cu": 0, "limit_cu": 4}]}
    )
    for team in cluster["queues"][1:]:
        team["parent"] = "d"
    data = {
        "name": "department-limit",
        "duration_s": "4h",
        "cycle_s": 60,
        "cluster": cluster,
        "workloads": [
            {"uid": f"{team}-{i}", "queue": team, "gpus_per_pod": 1, "duration_s": "1h"}
            for team in ("t1", "t2")
            for i in range(4)
        ],
    }
    result, _ = run(scenario_from(data))
    starts = sorted((j.first_start_s, j.end_s) for j in result.jobs)
    # Four run from 0 to 1 h (two per team), the other four from 1 h to 2 h: never 5 at once.
    assert starts == [(0.0, 3600.0)] * 4 + [(3600.0, 7200.0)] * 4
    first = {j.workload.uid for j in result.jobs if j.first_start_s == 0.0}
    assert sum(uid.startswith("t1") for uid in first) == 2


@pytest.mark.parametrize(("max_borrow_s", "a_start_s"), [(None, 21_660.0), ("2h", 7_260.0)])
def test_a_pool_calls_a_loan_back_after_max_borrow(
    max_borrow_s: str | None, a_start_s: float
) -> None:
    """4 GPUs. b (no quota) starts a 10-hour job on all of them at 0 that may not be reclaimed
    for 6 h (min_runtime_s); a (deserved 4) submits at 1 h. With the pool's max_borrow_s of 2 h
    the loan is called back at 2 h, not 6 h."""
    cluster = unit_cluster([("n1", 4)], [{"name": "a", "deserved_cu": 4}, {"name": "b"}])
    if max_borrow_s is not None:
        cluster["pools"][0]["max_borrow_s"] = max_borrow_s
    data = {
        "name": "loan",
        "duration_s": "12h",
        "cycle_s": 60,
        "cluster": cluster,
        "workloads": [
            {
                "uid": "b1",
                "queue": "b",
                "gpus_per_pod": 4,
                "duration_s": "10h",
                "min_runtime_s": "6h",
            },
            {"uid": "a1", "queue": "a", "gpus_per_pod": 4, "submit_s": "1h", "duration_s": "1h"},
        ],
    }
    result, _ = run(scenario_from(data))
    jobs = {j.workload.uid: j for j in result.jobs}
    assert jobs["a1"].first_start_s == a_start_s
    assert jobs["b1"].evictions == 1
