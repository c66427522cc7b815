"""`explain` of a gang waiting beyond its queue's fair share: the largest share time-based fair
share can give its queue (`entitlement_reach`), and what gang entitlement does about a gang larger
than that, in the burst case of docs/GANG_ENTITLEMENT.md.

16 GPUs (two 8-GPU nodes of 1 CU each), queues a and b hold 8 each with 1-GPU jobs, c waits. At
k = 1 with W' = 1/3 each and c holding nothing, the most c can ever get is 2/3 of the pool:
10.667 CU. A 12-GPU gang is larger; an 8-GPU one is not.
"""

from __future__ import annotations

import pytest
from cycle_builders import node, queue, running, snapshot, workload

from gpufair.domain.cycle import run_cycle
from gpufair.domain.explain import Explanation, explain
from gpufair.domain.model import Allocation, Workload
from gpufair.domain.snapshot import PendingCode, UsageStanding

NOW_S = 100_000.0
THIRD = 1.0 / 3.0
STANDING = {
    "a": UsageStanding(THIRD, 0.5),
    "b": UsageStanding(THIRD, 0.5),
    "c": UsageStanding(THIRD, 0.0),
}


def _full() -> list[Allocation]:
    return [
        running(workload(f"{owner}{i}", owner), [(host, (i,))], started_at_s=NOW_S - 3600 + i)
        for owner, host in (("a", "n1"), ("b", "n2"))
        for i in range(8)
    ]


def _explain(
    gang: Workload,
    shares: dict[str, float] | None = None,
    standing: dict[str, UsageStanding] | None = None,
    **pool: object,
) -> Explanation:
    snap = snapshot(
        [node("n1"), node("n2")],
        [queue("a"), queue("b"), queue("c")],
        shares or {"a": 16 / 6, "b": 16 / 6, "c": 16 * 2 / 3},
        running_work=_full(),
        pending=[gang],
        now_s=NOW_S,
        gang_reservation_after_s=600.0,
        standing=STANDING if standing is None else standing,
        **pool,  # type: ignore[arg-type]
    )
    result = run_cycle(snap)
    assert result.pending[gang.uid].code is PendingCode.OVER_FAIR_SHARE
    return explain(snap, result, gang.uid)


def _gang(pods: int = 3, waited_s: float = 3600.0) -> Workload:
    return workload("c-gang", "c", pods=pods, gpus=4, submit_time_s=NOW_S - waited_s)


REACH = (
    "Time-based fair share can give queue c at most 10.667 CU while it keeps the 0 CU it holds "
    "(W' 0.333, U' 0, k 1): less than it needs, so it never runs as a share; "
)


def test_a_gang_larger_than_any_reachable_share_is_told_why_entitlement_does_not_admit_it() -> None:
    off = _explain(_gang(), gang_entitlement=False)
    assert off.needed_cu == 12.0
    assert off.reachable_share_cu == pytest.approx(32 / 3)
    assert off.message.endswith(
        REACH + "the pool's gang_entitlement is off, which would admit such a gang beyond its "
        "share."
    )
    early = _explain(_gang(waited_s=500.0), gang_entitlement=True)
    assert early.message.endswith(
        REACH + "gang entitlement may admit it once it has waited 600 s (100 s more), if its "
        "queue is then the most under-served of tier 0."
    )
    served = _explain(
        _gang(),
        standing={**STANDING, "c": UsageStanding(THIRD, 0.4)},
        gang_entitlement=True,
    )
    assert (
        "gang entitlement does not apply: its queue has received its weight's part over the "
        "window (U' 0.4 >= W' 0.333)." in served.message
    )


def test_a_gang_within_the_reachable_share_is_left_to_fair_share() -> None:
    # c's share is 2 now (the others have used little lately), but with U' = 0 it can reach
    # 10.667: an 8-GPU gang runs once a's and b's usage decays.
    within = _explain(_gang(pods=2), shares={"a": 7.0, "b": 7.0, "c": 2.0})
    assert within.needed_cu == 8.0 and within.fair_share_cu == 2.0
    assert within.reachable_share_cu == pytest.approx(32 / 3)
    assert within.message.endswith(
        "Time-based fair share can give queue c at most 10.667 CU while it keeps the 0 CU it "
        "holds (W' 0.333, U' 0, k 1): enough for it once the others' usage decays."
    )


def test_without_a_standing_nothing_is_claimed() -> None:
    unknown = _explain(_gang(), standing={})
    assert unknown.reachable_share_cu is None
    assert "Time-based fair share can give" not in unknown.message
