"""Reclaim ping-pong: a reclaimed pod re-bound beyond its share and reclaimed again (DESIGN §3.6,
§4.1, §4.3).

The Alibaba replay's last day (bench/results/defrag.md, round 29) in small: queue a holds one
GPU beyond its fair share; queue b, below its share, gets a short pod every 5 minutes, each
running 2 minutes. Each arrival reclaims a's most recently started pod (the one beyond the
share), b's pod binds on the claim the cycle after, and when it ends the work-conserving pass
gives the GPU back to a's pod, which the next arrival reclaims again. No rule is broken in any
one cycle: every reclaim is of a queue above its share for a queue below it, every re-bind is of
a GPU nobody within their share can use. The pool stays full (no GPU idle); what it costs is
restarts of one pod, 12 an hour. The design's guard is `min_runtime_s`, which the trace
reader sets to 0: with 10 minutes, no pod is evicted more than 4 times an hour, but a's pods are
reclaimed in turn, 10 times in the hour.

The driver runs 60-s cycles as the simulator does: an evicted workload still holds its GPUs in
the cycle that evicts it, has stopped by the next, where it waits again and its claim stands
(`EvictionInFlight`), and is free of the claim the cycle after.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cycle_builders import assert_no_oversubscription, node, queue, snapshot, workload

from gpufair.domain.cycle import run_cycle
from gpufair.domain.model import Allocation, Workload
from gpufair.domain.snapshot import EvictionInFlight, EvictReason

CYCLE_S = 60.0
HOUR_S = 3_600.0
NODES = [node("n1", gpus=4)]
QUEUES = [queue("a"), queue("b")]
SHARES = {"a": 2.0, "b": 2.0}  # 4 GPUs of 1 CU; a runs 3, b 1 and a short pod now and then


@dataclass
class Replay:
    evictions: list[tuple[float, str, str]] = field(default_factory=list)  # time, victim, for
    binds: list[tuple[float, str, bool]] = field(default_factory=list)  # time, uid, beyond
    idle_gpu_s: float = 0.0  # free GPUs after each cycle's binds, times the cycle
    waited_s: dict[str, float] = field(default_factory=dict)  # b's short pods: arrival to bind

    def evictions_of(self, uid: str) -> int:
        return sum(1 for _, victim, _ in self.evictions if victim == uid)


def _replay(min_runtime_s: float, hours: float = 1.0) -> Replay:
    """One queue-a pod beyond the share, b's 2-minute pods arriving every 5 minutes."""
    a_jobs = [
        workload(f"a-{n}", "a", submit_time_s=0.0, min_runtime_s=min_runtime_s) for n in (1, 2, 3)
    ]
    b_long = workload("b-long", "b")
    live: dict[str, Allocation] = {}
    ends: dict[str, float] = {}  # uid → when it finishes (b's short pods)
    arrivals: dict[str, float] = {}
    waiting: dict[str, Workload] = {}
    replay = Replay()
    # Start: a's first two pods and b's long pod at 0 s, a-3 (beyond a's share) a cycle later:
    # the pool is full.
    jobs = {job.uid: job for job in [*a_jobs, b_long]}
    for now_s, batch in ((0.0, [*a_jobs[:2], b_long]), (CYCLE_S, [a_jobs[2]])):
        start = run_cycle(
            snapshot(NODES, QUEUES, SHARES, running_work=live.values(), pending=batch, now_s=now_s)
        )
        for bind in start.binds:
            job = jobs[bind.workload_uid]
            live[job.uid] = Allocation(job, bind.bindings, now_s, bind.gpu_type)
    assert set(live) == {"a-1", "a-2", "a-3", "b-long"}
    in_flight: list[EvictionInFlight] = []
    claims: list[EvictionInFlight] = []  # victims stopped: their claims stand this cycle
    cycles = int(hours * HOUR_S / CYCLE_S)
    for cycle in range(2, cycles + 1):
        now_s = cycle * CYCLE_S
        if cycle % 5 == 0:  # a short pod of b every 5 minutes
            short = workload(f"b-short-{cycle}", "b", submit_time_s=now_s)
            waiting[short.uid] = short
            arrivals[short.uid] = now_s
        for uid in [uid for uid, end in ends.items() if end <= now_s]:
            del live[uid], ends[uid]
        for stopped in in_flight:  # stopped since the last cycle: waiting again
            allocation = live.pop(stopped.victim_uid)
            waiting[stopped.victim_uid] = allocation.workload
        snap = snapshot(
            NODES,
            QUEUES,
            SHARES,
            running_work=live.values(),
            pending=waiting.values(),
            now_s=now_s,
            evicting=[*in_flight, *claims],
        )
        result = run_cycle(snap)
        assert_no_oversubscription(snap, result)
        for bind in result.binds:
            job = waiting.pop(bind.workload_uid)
            live[job.uid] = Allocation(job, bind.bindings, now_s, bind.gpu_type)
            replay.binds.append((now_s, job.uid, bind.over_fair_share))
            if job.uid in arrivals:
                ends[job.uid] = now_s + 120.0
                replay.waited_s[job.uid] = now_s - arrivals[job.uid]
        for evict in result.evicts:
            assert evict.reason is EvictReason.RECLAIM
            replay.evictions.append((now_s, evict.workload_uid, evict.beneficiary_uid))
        claims = in_flight
        in_flight = [EvictionInFlight(e.workload_uid, e.beneficiary_uid) for e in result.evicts]
        used = sum(len(b.gpu_indices) for a in live.values() for b in a.bindings)
        replay.idle_gpu_s += (4 - used) * CYCLE_S
    return replay


def test_a_pod_beyond_its_share_is_reclaimed_by_every_short_arrival() -> None:
    replay = _replay(min_runtime_s=0.0)
    # 12 arrivals in the hour, 12 reclaims, all of a-3: the most recently started of a's pods,
    # since each time it is the one re-bound last.
    assert len(replay.evictions) == 12
    assert replay.evictions_of("a-3") == 12
    assert {beneficiary for _, _, beneficiary in replay.evictions} == {
        f"b-short-{cycle}" for cycle in range(5, 61, 5)
    }
    # The cycle of each: arrival t reclaims at t, b's pod binds on the claim at t+60 (within
    # b's share), ends at t+180, and that cycle a-3 is bound again beyond a's share.
    first = [(t, uid, beyond) for t, uid, beyond in replay.binds if 300.0 <= t < 600.0]
    assert first == [(360.0, "b-short-5", False), (480.0, "a-3", True)]
    rebinds = [t for t, uid, beyond in replay.binds if uid == "a-3" and beyond]
    assert len(rebinds) == 11  # the 12th eviction's pod waits past the hour
    # Each re-bind of a-3 is reclaimed 2 minutes later and stops a cycle after that: it runs 3
    # of every 5 minutes; b's pods wait 1 cycle each (the victim's stop).
    runs = [t - start for (t, _, _), start in zip(replay.evictions[1:], rebinds, strict=False)]
    assert set(runs) == {120.0}
    assert set(replay.waited_s.values()) == {60.0}
    # No GPU is left idle after any cycle (the claimant binds in the cycle its victim has
    # stopped, a-3 in the cycle b's pod has ended): the cost is 12 restarts of one pod an hour.
    assert replay.idle_gpu_s == 0.0


def test_min_runtime_spreads_the_reclaims_over_the_queue_rather_than_ending_them() -> None:
    """The designed guard (DESIGN §3.6; KAI-Scheduler's reclaim-min-runtime, 0 by default there
    too): a pod that has not run 10 minutes is not reclaimed. It caps each pod's evictions (4
    an hour, not 12) but not the queue's: a's pods that have run 10 minutes qualify in turn, so
    10 of the 12 arrivals still reclaim, the first three waiting for a pod to qualify (up to 6
    minutes)."""
    replay = _replay(min_runtime_s=600.0)
    assert len(replay.evictions) == 10
    per_pod = {uid: replay.evictions_of(uid) for uid in ("a-1", "a-2", "a-3")}
    assert per_pod == {"a-1": 4, "a-2": 3, "a-3": 3}
    assert [replay.waited_s[f"b-short-{n}"] for n in (5, 10, 15)] == [360.0, 180.0, 0.0]
    assert replay.idle_gpu_s == 0.0
