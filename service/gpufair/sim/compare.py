"""Classic against time-based fair share on one scenario (`gpufair simulate --compare`).

`classic`: every pool's k set to 0, so history has no effect (DESIGN §3.3: P = W').
`time-based`: the scenario's own policies; a pool the scenario itself sets to k = 0 gets the
default k = 1, so the comparison always sets the two behaviours side by side. Everything else
(window, half-life, usage basis, workloads, seed) is the same in both runs. Explicit, trace and
Poisson jobs arrive identically in both; a backlog stream draws the same sequence of jobs, each
submitted when the scheduler first starts one of the stream's earlier jobs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from gpufair.domain.model import FairSharePolicy
from gpufair.sim.scenario import Scenario

CLASSIC = "classic"
TIME_BASED = "time-based"
DEFAULT_K = FairSharePolicy().k


def classic(scenario: Scenario) -> Scenario:
    return scenario.with_policy(lambda policy: dataclasses.replace(policy, k=0.0))


def time_based(scenario: Scenario) -> Scenario:
    return scenario.with_policy(
        lambda policy: policy if policy.k > 0 else dataclasses.replace(policy, k=DEFAULT_K)
    )


VARIANTS: tuple[tuple[str, Callable[[Scenario], Scenario]], ...] = (
    (CLASSIC, classic),
    (TIME_BASED, time_based),
)
