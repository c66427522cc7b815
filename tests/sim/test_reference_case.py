"""DESIGN §1's reference case through the simulator: LLM versus vision on 100 GPUs.

examples/scenarios/llm-vs-vision-week.yaml is the week of DESIGN §1. To keep the suite fast this
test runs it compressed: a 1-day sliding window instead of 7 days, 2 simulated days instead of 7,
the LLM's 60-GPU post-training gang submitted at 12 h instead of day 1 and running 4-6 h instead
of 12-18 h, cycles and recomputes every 2 minutes. The behaviour asserted is the week's.
"""

from __future__ import annotations

from sim_support import example_data, queue_metrics, run, scenario_from, with_k

from gpufair.sim.engine import SimResult
from gpufair.sim.scenario import Scenario

GANG_PREFIX = "llm-post-training-"


def compressed_week() -> Scenario:
    data = example_data("llm-vs-vision-week")
    data.update(duration_s="2d", cycle_s=120, recompute_s=120)
    (post_training,) = [g for g in data["generators"] if g["name"] == "llm-post-training"]
    post_training.update(start_s="12h", duration_s={"uniform": ["4h", "6h"]})
    return with_k(scenario_from(data), 1.0, window_s=86_400.0)


def gangs(result: SimResult) -> list[tuple[float, float | None]]:
    return [
        (job.workload.submit_time_s, job.first_start_s)
        for job in result.jobs
        if job.workload.uid.startswith(GANG_PREFIX)
    ]


def test_classic_fair_share_never_starts_the_60_gpu_gang() -> None:
    result, metrics = run(with_k(compressed_week(), 0.0))
    assert gangs(result) == [(43_200.0, None)]
    llm = queue_metrics(metrics, "llm")
    # 30 deserved + half of the 50-GPU shared pool = 55 < 10 inference + 60 gang.
    assert llm.over_quota_cu_hours == 0.0
    assert queue_metrics(metrics, "vision").over_quota_share == 1.0


def test_time_based_fair_share_starts_the_gang_and_the_teams_take_turns() -> None:
    result, metrics = run(compressed_week())
    started = gangs(result)
    first_submit_s, first_start_s = started[0]
    assert first_start_s is not None
    # Vision held the whole shared pool: its weight falls to 0, reclaim frees 15 whole nodes.
    assert first_start_s - first_submit_s < 2 * 3600
    assert queue_metrics(metrics, "vision").evictions > 0
    # Turns, not ownership: LLM's post-training ran several times, and vision had the shared
    # pool back in between and after.
    assert sum(1 for _, start in started if start is not None) >= 3
    llm = queue_metrics(metrics, "llm")
    vision = queue_metrics(metrics, "vision")
    assert llm.over_quota_share is not None and vision.over_quota_share is not None
    assert 0.15 <= llm.over_quota_share <= 0.5
    assert vision.over_quota_share >= 0.5
    (pool,) = result.pools
    (vision_run,) = [q for q in pool.queues if q.name == "vision"]
    after_first_turn = [v for t, v in vision_run.changes if t > first_start_s + 6 * 3600]
    assert max(after_first_turn) >= 80
