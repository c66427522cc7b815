"""Allocation's answer for a trial whose every type already failed placement in the pass
(`cycle_allocate._code_when_full`): the reason left must be the one the general try leaves
(`_try_bind` with every placement key known failed, then `_code_left`), whatever the queue's
limits, share, deserved CU and the workload's preemptibility, gang and types. Random queues
and workloads, both passes."""

from __future__ import annotations

import random

import pytest

from gpufair.domain.cycle_allocate import _code_left, _code_when_full, _try_bind
from gpufair.domain.cycle_load import load
from gpufair.domain.cycle_state import CycleState
from gpufair.domain.placement_ask import Exclusion
from tests.domain.cycle_builders import A100, RTX4090, UNIT, V100, node, queue, snapshot, workload

_TYPES = (A100, V100, RTX4090, UNIT)


def _state(seed: int) -> CycleState:
    rng = random.Random(seed)
    nodes = [node(f"n{i}", rng.choice(_TYPES), rng.choice((2, 4, 8))) for i in range(6)]
    queues = []
    shares = {}
    for number in range(5):
        name = f"q{number}"
        limit_cu = rng.choice((None, None, rng.uniform(0.0, 60.0)))
        per_type = (
            {rng.choice(_TYPES).name: float(rng.randint(0, 8))} if rng.random() < 0.3 else None
        )
        queues.append(
            queue(
                name,
                rng.choice((0.0, rng.uniform(0.0, 40.0))),
                limit_cu=limit_cu,
                limit_gpus_by_type=per_type,
            )
        )
        shares[name] = rng.choice((0.0, rng.uniform(0.0, 80.0)))
    pending = []
    for number in range(60):
        pods = rng.randint(1, 4)
        types = tuple(sorted({rng.choice(_TYPES).name for _ in range(rng.randint(0, 3))}))
        pending.append(
            workload(
                f"w{number}",
                f"q{rng.randrange(5)}",
                pods=pods,
                gpus=rng.choice((1.0, 2.0, 4.0, 0.5)),
                submit_time_s=float(number),
                min_pods=rng.choice((None, rng.randint(1, pods))),
                types=types,
                preemptible=rng.random() < 0.7,
            )
        )
    state = CycleState(snapshot(nodes, queues, shares, pending=pending))
    load(state)
    return state


@pytest.mark.parametrize("seed", range(40))
def test_the_answer_when_full_is_the_general_one(seed: int) -> None:
    state = _state(seed)
    items = [item for items in state.queue_pending.values() for item in items]
    assert items
    for within_share in (True, False):
        exclusion = Exclusion(gang_held=state.gang_held, beyond_share=not within_share)
        for item in items:
            # Every type of the trial known to have no room in this pass.
            for gpu_type in item.kind.types:
                state.place_failed.add((within_share, gpu_type, id(item.kind.memo_key)))
            failure = _try_bind(state, item, within_share, exclusion)
            assert failure is not None  # nothing is placed: no type has room
            assert _code_when_full(state, item, within_share) is _code_left(failure, within_share)
