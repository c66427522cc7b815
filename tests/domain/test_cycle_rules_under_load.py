"""DESIGN §4's rules on every cycle of large random runs (`load_world`): 200-500 nodes of two
or three GPU types, 20-60 teams in a three-level tree, work of every shape, fair shares from the
fair-share engine each cycle, work ending and victims requeued between cycles.

After every cycle (`load_checks`, `load_share_checks`):

- no GPU (whole, shared or partition slice), CPU or memory is oversubscribed, now and once the
  victims have stopped and the holds are taken;
- every pending workload is bound or has a reason; only preemptible work past `min_runtime_s`
  (or on loan past `max_borrow_s`) is evicted, once; non-preemptible work is never bound beyond
  the share, and a queue's non-preemptible work stays within its deserved quota;
- a reclaim victim's queue keeps max(deserved, fair share) (its deserved quota, for reclaim
  for a per-type guarantee), and the reclaimer ends no higher in allocated/fair-share ratio;
- reclaim and preemption evict no victim their beneficiary could do without;
- no lower-tier bind takes capacity a higher tier's waiting workload could use.

Across the quiet cycles at the end (nothing arrives or ends, so the shares stay put), no queue
reclaims from a queue that reclaimed from it in an earlier one (no ping-pong).
"""

from __future__ import annotations

import pytest
from load_checks import (
    check_capacity,
    check_non_preemptible_within_deserved,
    check_reasons_and_evictions,
)
from load_share_checks import (
    check_no_needless_victim,
    check_reclaim_floor_and_ratio,
    check_tiers,
)
from load_world import cycles, make_world

from gpufair.domain.snapshot import EvictReason

# (seed, nodes, teams): seeds checked while this was written: 0-59 at these sizes.
RUNS = [(1, 260, 28), (8, 320, 36), (16, 500, 60), (21, 200, 20), (33, 440, 52)]


@pytest.mark.parametrize(("seed", "nodes", "teams"), RUNS)
def test_cycle_rules_hold_on_every_cycle_of_a_large_pool(seed: int, nodes: int, teams: int) -> None:
    world = make_world(seed, nodes, teams)
    reclaimed: set[tuple[str, str]] = set()  # (reclaimer, victim) queues in the quiet cycles
    evictions = 0
    for cycle, snap, result in cycles(world):
        check_capacity(snap, result)
        check_reasons_and_evictions(snap, result)
        check_non_preemptible_within_deserved(snap, result)
        check_reclaim_floor_and_ratio(snap, result)
        check_no_needless_victim(snap, result)
        assert check_tiers(snap, result) == []
        evictions += len(result.evicts)
        if cycle < world.cycles - world.quiet:
            continue
        pending = {w.uid: w for w in snap.pending}
        for evict in result.evicts:
            if evict.reason is EvictReason.RECLAIM:
                pair = (pending[evict.beneficiary_uid].queue, evict.queue)
                assert pair[::-1] not in reclaimed, ("ping-pong", pair, cycle)
                reclaimed.add(pair)
    assert evictions > 0  # the run is not vacuous
