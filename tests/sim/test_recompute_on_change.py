"""The server recomputes a pool's fair shares before a cycle when a workload of the pool was
submitted or changed state since the last recompute (`services.schedule.fair_shares`), not
only on the periodic job's cadence. The simulator must do the same, or a queue's new work
counts as demand only at the next periodic recompute and reclaim comes minutes late.

Hand-computed case: one node of 4 GPUs (1 CU each); queues a and b deserve 2 CU each, weight 1.
At 0 s `a` submits two 2-GPU jobs and takes the whole node (its fair share is 4: nobody else
wants anything). At 30 s `b` submits a 2-GPU job. The pool's recompute interval is 300 s, a
cycle runs every 60 s. The server's cycle at 60 s sees the submission newer than the last
recompute (0 s), recomputes (a: 2, b: 2), and reclaims a's younger job for b, which binds on
the freed GPUs at the next cycle, 120 s (a wait of 90 s). Without the change rule the fair
shares of 0 s hold until 300 s: the eviction at 300 s, the bind at 360 s (a wait of 330 s).
"""

from __future__ import annotations

from sim_support import run, scenario_from, unit_cluster


def _scenario() -> dict[str, object]:
    cluster = unit_cluster(
        [("n1", 4)],
        [{"name": "a", "deserved_cu": 2}, {"name": "b", "deserved_cu": 2}],
        recompute_interval_s=300,
    )
    return {
        "name": "recompute-on-change",
        "duration_s": "1h",
        "cycle_s": 60,
        "cluster": cluster,
        "workloads": [
            {"uid": "a1", "queue": "a", "submit_s": 0, "duration_s": "2h", "gpus_per_pod": 2},
            {"uid": "a2", "queue": "a", "submit_s": 0, "duration_s": "2h", "gpus_per_pod": 2},
            {"uid": "b1", "queue": "b", "submit_s": 30, "duration_s": "2h", "gpus_per_pod": 2},
        ],
    }


def test_a_submission_is_demand_at_the_next_cycle() -> None:
    result, metrics = run(scenario_from(_scenario()))
    events = [(d.time_s, d.event, d.queue, d.reason) for d in result.decisions]
    assert events == [
        (0.0, "bind", "a", "within_share"),
        (0.0, "bind", "a", "within_share"),
        (60.0, "evict", "a", "reclaim"),
        (120.0, "bind", "b", "claim:reclaim"),
    ]
    jobs = {job.workload.uid: job for job in result.jobs}
    assert jobs["b1"].wait_s == 90.0
    assert jobs["a1"].evictions + jobs["a2"].evictions == 1
    # a: 4 CU over [0, 60), 2 CU after; b: 2 CU from 120 s. Hours of a 1-hour run.
    by_queue = {q.queue: q.allocated_cu_hours for q in metrics.queues}
    assert by_queue["a"] == (4 * 60 + 2 * 3540) / 3600
    assert by_queue["b"] == 2 * 3480 / 3600
    (pool,) = metrics.pools
    assert pool.allocated_gpu_hours == by_queue["a"] + by_queue["b"]


def test_the_periodic_recompute_alone_when_nothing_changes() -> None:
    """Nothing submitted or changed between periodic recomputes: no extra recompute."""
    data = _scenario()
    data["workloads"] = [
        {"uid": "a1", "queue": "a", "submit_s": 0, "duration_s": "2h", "gpus_per_pod": 2}
    ]
    result, _ = run(scenario_from(data))
    (pool,) = result.pools
    # Periodic at 0, 300, ..., 3300 (12); the bind at 0 changes a1's state: one more at 60.
    assert pool.recomputes == 13
