"""Loading gathers the carried claimants in the order of the evictions (`leaving_for`), then
the standing claims with no victim leaving (`cycle_load_pending._in_eviction_order`): each
claimant once, even one with a victim still leaving and one stopped, and the claims phase
decides as without carried records."""

from __future__ import annotations

from cycle_builders import A100, node, queue, running, snapshot, workload

from gpufair.domain.cycle import load, run_cycle
from gpufair.domain.cycle_memory import CarriedLoad
from gpufair.domain.cycle_state import CycleState
from gpufair.domain.snapshot import EvictionInFlight


def test_each_carried_claimant_is_gathered_once_in_eviction_order() -> None:
    nodes = [node(f"n{index}", A100, 8) for index in range(3)]
    work = [
        running(workload(f"b{index}-{gpu}", "b", gpus=1), [(f"n{index}", (gpu,))], A100)
        for index in range(3)
        for gpu in range(8)
    ]
    pending = [workload(f"a{number}", "a", 1, 1.0, float(number)) for number in range(6)]
    pending.append(workload("a-both", "a", 2, 1.0, 10.0))
    evicting = [EvictionInFlight(f"b2-{gpu}", f"a{5 - gpu}") for gpu in range(6)]
    # One victim still running, one stopped (b9-0 is not running): leaving and standing.
    evicting += [EvictionInFlight("b1-7", "a-both"), EvictionInFlight("b9-0", "a-both")]
    evicting.append(EvictionInFlight("b9-1", "a0"))  # a0 stands too, its other victim leaves
    queues = [queue("a", 40.0), queue("b", 40.0)]
    snap = snapshot(
        nodes, queues, {"a": 40.0, "b": 40.0}, running_work=work, pending=pending, evicting=evicting
    )
    carried = CarriedLoad()
    first = run_cycle(snap, carried)
    state = CycleState(snap, carried)
    load(state)
    assert "a-both" in state.standing_claims and "a-both" in state.leaving_for
    uids = [item.uid for item in state.claimants]
    assert uids == ["a5", "a4", "a3", "a2", "a1", "a0", "a-both"]  # as `evicting` lists them
    assert run_cycle(snap, carried) == first == run_cycle(snap)
