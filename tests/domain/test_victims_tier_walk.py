"""The walk for pods of several GPUs (`VictimIndex.walk_order(k)`), which a search takes only on
an index of many nodes (`victim_greedy._TIER_WALK_NODES`), judged on the small random pools of
the comparisons with the documented greedy by taking it on every index: the same verdicts, case
for case tallied, as the walk for one GPU with its nodes passed and tightened one by one."""

from __future__ import annotations

import pytest
import test_victims_against_reference as against_reference
import test_victims_with_leaving as with_leaving

from gpufair.domain import victim_greedy


@pytest.mark.parametrize("partitions", [False, True], ids=["plain", "partitions"])
def test_the_walk_for_several_gpus_decides_as_designed(
    partitions: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(victim_greedy, "_TIER_WALK_NODES", 0)
    against_reference.test_victims_are_needed_and_as_designed(partitions)


@pytest.mark.parametrize("partitions", [False, True], ids=["plain", "partitions"])
def test_the_walk_for_several_gpus_beside_leaving_capacity(
    partitions: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(victim_greedy, "_TIER_WALK_NODES", 0)
    with_leaving.test_victims_beside_leaving_capacity_are_needed_and_as_designed(partitions)
