"""`Kind.memo_key` names its fields (`cycle_state.MemoKey`): the type contention's demand
(`cycle_contention.exclusive_demand`) reads the gang minimum by name, not by its place in the
key, and the key still compares and hashes as the plain tuple the memos were keyed by."""

from __future__ import annotations

from cycle_builders import node, queue, snapshot, workload

from gpufair.domain.cycle_contention import exclusive_demand
from gpufair.domain.cycle_load import load
from gpufair.domain.cycle_state import CycleState
from gpufair.domain.model import GpuType

T4 = GpuType("t4", memory_gib=16, compute_weight=1)


def test_a_kind_names_its_gang_minimum_and_the_demand_reads_it() -> None:
    # A gang of 4 pods of 2 GPUs that starts with 3, the only type T4: 6 GPUs of demand.
    gang = workload("gang", "a", pods=4, min_pods=3, gpus=2.0, types=("t4",))
    one = workload("one", "a", types=("t4",))
    state = CycleState(
        snapshot(
            [node("t4-1", T4, gpus=8)],
            [queue("a", 100)],
            {"a": 100.0},
            pending=[gang, one],
            gpu_types=(T4,),
        )
    )
    load(state)
    keys = {kind.memo_key.gang_min_pods: kind.memo_key for kind in state.kinds.values()}
    assert sorted(keys) == [1, 3]
    key = keys[3]
    assert (key.gpus_per_pod, key.gang_min_pods, key.topology, key.one_per_node) == (
        2.0,
        3,
        None,
        False,
    )
    plain = tuple(key)
    assert key == plain and hash(key) == hash(plain)
    demand = exclusive_demand(state.queue_pending.values(), state.kinds.values(), state.capacity)
    assert demand == {"t4": 3 * 2.0 + 1.0}
