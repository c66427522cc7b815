"""Capacity freed for a workload stays its own until it binds (DESIGN §4.3; issue 14).

The first cycle after its victims stopped still carries the eviction (a standing claim): the
beneficiary binds first on the freed capacity even if a recompute lowered its share below its
gang since, and the victim, waiting again, is not bound beyond its queue's share meanwhile.
"""

from __future__ import annotations

from cycle_builders import bound_uids, evicted_uids, node, queue, running, snapshot, workload

from gpufair.domain.cycle import run_cycle
from gpufair.domain.snapshot import EvictionInFlight, PendingCode

NODES = [node("n1"), node("n2")]
QUEUES = [queue("a"), queue("b")]
A_GANG = workload("a-gang", "a", pods=2, gpus=8)
B_GANG = workload("b-gang", "b", pods=2, gpus=8)


def test_the_beneficiary_binds_on_freed_capacity_though_its_share_fell_below_its_gang() -> None:
    holding = [running(A_GANG, [("n1", tuple(range(8))), ("n2", tuple(range(8)))])]
    first = run_cycle(
        snapshot(NODES, QUEUES, {"a": 0.0, "b": 16.0}, running_work=holding, pending=[B_GANG])
    )
    assert evicted_uids(first) == {"a-gang"}
    # a's gang stopped and waits again; a recompute moved the shares to 9 / 7: b's 16-GPU gang
    # is beyond b's share, and a's too. Without the claim the work-conserving pass gave the 16
    # GPUs back to a (first by name); the claim binds b's gang.
    requeued = workload("a-gang", "a", pods=2, gpus=8)
    second = run_cycle(
        snapshot(
            NODES,
            QUEUES,
            {"a": 9.0, "b": 7.0},
            pending=[requeued, B_GANG],
            evicting=[EvictionInFlight("a-gang", "b-gang")],
        )
    )
    assert bound_uids(second) == {"b-gang"}
    (bind,) = second.binds
    assert bind.cu == 16.0 and bind.over_fair_share
    reason = second.pending["a-gang"]
    assert reason.code is PendingCode.OVER_FAIR_SHARE
    assert "evicted for b-gang" in reason.message


def test_a_victim_is_not_rebound_beyond_its_share_while_the_claim_stands() -> None:
    # The claim cannot be served (b's limit was lowered to 8 CU since): b's gang waits. The
    # 16 GPUs are free and nobody within their share can use them, but a's gang, evicted for b's,
    # is not bound beyond a's 9 GPU share in this cycle (before: it was, at once).
    queues = [queue("a"), queue("b", limit_cu=8)]
    requeued = workload("a-gang", "a", pods=2, gpus=8)
    shares = {"a": 9.0, "b": 7.0}
    result = run_cycle(
        snapshot(
            NODES,
            queues,
            shares,
            pending=[requeued, B_GANG],
            evicting=[EvictionInFlight("a-gang", "b-gang")],
        )
    )
    assert result.binds == ()
    assert result.pending["b-gang"].code is PendingCode.QUEUE_LIMIT
    assert result.pending["a-gang"].code is PendingCode.OVER_FAIR_SHARE
    assert "it is not re-bound beyond its queue's share" in result.pending["a-gang"].message
    # The cycle after, the claim is gone: the victim takes the idle GPUs as any workload would.
    later = run_cycle(snapshot(NODES, queues, shares, pending=[requeued, B_GANG]))
    assert bound_uids(later) == {"a-gang"}


def test_exact_ties_for_spare_capacity_are_not_decided_by_name() -> None:
    """Two queues equal in everything the order reads (tier, ratio, submit time, age) want the
    one spare GPU beyond their share: across 200 cycles each wins about half (before: a, first
    by name, won all 200); the same snapshot always decides the same way."""
    queues = [queue("a"), queue("b")]
    jobs = [workload("a-job", "a"), workload("b-job", "b")]
    wins = {"a": 0, "b": 0}
    for cycle in range(200):
        snap = snapshot(
            [node("n", gpus=1)], queues, {"a": 0.0, "b": 0.0}, pending=jobs, now_s=60.0 * cycle
        )
        (bind,) = run_cycle(snap).binds
        assert bind.over_fair_share
        assert run_cycle(snap).binds[0].queue == bind.queue
        wins[bind.queue] += 1
    assert 70 <= wins["a"] <= 130 and wins["a"] + wins["b"] == 200
