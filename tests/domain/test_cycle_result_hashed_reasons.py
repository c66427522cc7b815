"""The result's reasons by uid are kept in a dict whose table holds each key's hash
(`CycleState.result`: the dict starts with a key that is not a string, taken out before it is
returned), so its growths read the table, not every workload's uid string. Its keys are only the
uids, in the order they were before: reasons written while loading first, then queue order."""

from __future__ import annotations

import dataclasses
import sys

from cycle_builders import node, queue, snapshot, workload

from gpufair.domain.cycle import run_cycle
from gpufair.domain.snapshot import CycleResult, PendingCode


def _result() -> CycleResult:
    # 4 GPUs, a share of 2 each: t1-0, t1-1 and t2-0 (2 GPUs) bind; t1-2 .. t1-39 and
    # t2-1 .. t2-19 wait (57 reasons), and the workload of another pool is given its reason
    # while loading (58).
    pending = [workload(f"t1-{i}", "t1", submit_time_s=i) for i in range(40)]
    pending += [workload(f"t2-{i}", "t2", gpus=2, submit_time_s=i) for i in range(20)]
    elsewhere = dataclasses.replace(workload("x-0", "t1"), pool="other")
    return run_cycle(
        snapshot(
            [node("n", gpus=4)],
            [queue("t1", 2.0), queue("t2", 2.0)],
            {"t1": 2.0, "t2": 2.0},
            pending=[elsewhere, *pending],
        )
    )


def test_the_reasons_are_the_uids_in_their_order() -> None:
    result = _result()
    expected = ["x-0"] + [f"t1-{i}" for i in range(2, 40)] + [f"t2-{i}" for i in range(1, 20)]
    assert list(result.pending) == expected
    assert all(type(uid) is str for uid in result.pending)
    assert result.pending["x-0"].code is PendingCode.OTHER_POOL
    assert result.pending["t2-19"].code is PendingCode.OVER_FAIR_SHARE


def test_the_reasons_table_holds_the_hashes() -> None:
    pending = _result().pending
    assert len(pending) == 58
    # A dict of only string keys keeps 16 bytes per entry (key, value); one that has held
    # another key keeps 24 (hash, key, value): the same 58 reasons take more room in it.
    strings_only = dict(zip(list(pending), pending.values(), strict=True))
    assert sys.getsizeof(pending) > sys.getsizeof(strings_only)
