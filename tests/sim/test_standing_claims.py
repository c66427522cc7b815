"""The two-queue oscillation in whole GPUs: the cluster changes hands cleanly (issue 14).

examples/scenarios/two-queue-oscillation.yaml with `rounding: whole_gpus`: two equal queues, one
never-ending 16-GPU gang each, 16 GPUs, 8 days. A hand-over is one reclaim: the holder's gang is
evicted and the other gang binds at the next cycle on the freed GPUs (its standing claim), even
when the recompute in between lowered its share below 16. Before standing claims the freed GPUs
went back to the victim by name: at k = 10, 83 evictions (61 of team-a, 22 of team-b); with
`dead_band: 0`, 376 evictions of team-a and team-b never ran.
"""

from __future__ import annotations

from typing import Any

from sim_support import example_data, run, scenario_from, with_k

from gpufair.domain.model import Rounding
from gpufair.sim.engine import SimResult


def _run(k: float, **policy: Any) -> tuple[SimResult, int]:
    scenario = scenario_from(example_data("two-queue-oscillation"))
    result, metrics = run(with_k(scenario, k, rounding=Rounding.WHOLE_GPUS, **policy))
    (pool,) = metrics.pools
    return result, pool.evictions


def _check_clean_handovers(result: SimResult) -> None:
    """Allocation is always all or nothing, and every change of hands takes one cycle: the
    queue that lost the cluster at t, the other gets it at t + 60 s (no eviction wasted)."""
    (pool,) = result.pools
    a, b = (next(q for q in pool.queues if q.name == name) for name in ("team-a", "team-b"))
    assert {gpus for _, gpus in a.changes + b.changes} == {0.0, 16.0}
    losses = sorted(t for queue in (a, b) for t, gpus in queue.changes if gpus == 0.0 and t > 0)
    gains = sorted(t for queue in (a, b) for t, gpus in queue.changes if gpus == 16.0 and t > 0)
    assert [gain - loss for loss, gain in zip(losses, gains, strict=True)] == [60.0] * len(gains)


def test_dead_band_zero_hands_over_ten_times_instead_of_starving_team_b() -> None:
    result, evictions = _run(1.0, dead_band=0.0)
    jobs = {j.workload.uid: j for j in result.jobs}
    assert evictions == 10
    assert (jobs["team-a-training"].evictions, jobs["team-b-training"].evictions) == (5, 5)
    # Both start within the first two cycles (which one first is the spare-capacity tie).
    assert {jobs[uid].first_start_s for uid in jobs} == {0.0, 120.0}
    _check_clean_handovers(result)


def test_k_ten_splits_the_hand_overs_evenly() -> None:
    result, evictions = _run(10.0)
    jobs = {j.workload.uid: j for j in result.jobs}
    assert evictions == 56
    assert (jobs["team-a-training"].evictions, jobs["team-b-training"].evictions) == (28, 28)
    _check_clean_handovers(result)
