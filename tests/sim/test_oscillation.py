"""Two equal queues on 16 GPUs that both always want the whole cluster take turns.

examples/scenarios/two-queue-oscillation.yaml, with cycles and recomputes every 5 minutes instead
of every minute to keep the test fast. Each queue has one 16-GPU gang that never ends, so the
pool changes hands only by reclaim. Steady state: the holder gives way once its usage share
over the 1-day window reaches 1/2 + 1/(2k), so each turn lasts (1/2 + 1/(2k)) windows and the
period is (1 + 1/k) windows (plus at most one cycle per turn).
"""

from __future__ import annotations

import dataclasses

from sim_support import example_data, run, scenario_from, with_k

DAY_S = 86_400.0
CYCLE_S = 300.0


def handovers(k: float) -> list[float]:
    scenario = scenario_from(example_data("two-queue-oscillation"))
    scenario = dataclasses.replace(scenario, cycle_s=CYCLE_S, recompute_s=CYCLE_S)
    result, _ = run(with_k(scenario, k))
    (pool,) = result.pools
    team_a = next(q for q in pool.queues if q.name == "team-a")
    return [t for t, _ in team_a.changes]


def steady_periods(k: float) -> list[float]:
    """Full periods (two turns) in days, after the first two days of warm-up."""
    instants = [t for t in handovers(k) if t >= 2 * DAY_S]
    return [(b - a) / DAY_S for a, b in zip(instants, instants[2:], strict=False)]


def test_classic_fair_share_never_hands_the_cluster_over() -> None:
    assert handovers(0.0) == [0.0]


def test_allocation_alternates_with_a_steady_period_that_shortens_as_k_grows() -> None:
    mean_period = {}
    for k in (1.0, 2.0, 4.0):
        periods = steady_periods(k)
        assert len(periods) >= 3, f"k={k}: too few turns"
        mean = sum(periods) / len(periods)
        assert max(periods) - min(periods) < 2 * CYCLE_S / DAY_S, f"k={k}: {periods}"
        expected = 1.0 + 1.0 / k
        assert expected <= mean <= expected + 2 * CYCLE_S / DAY_S, f"k={k}: {mean}"
        mean_period[k] = mean
    assert mean_period[1.0] > mean_period[2.0] > mean_period[4.0]
