"""Each eviction of a run carries its chain back to what placed the victim (`DecisionRow`:
`started_as`, `ran_s`, `evicted_before`), and a workload a move stopped binds where the move sent
it with reason `move`: what bench/bench_defrag.py counts to tell the evictions moves cause from
the others.

Hand-computed case: two nodes of 4 GPUs (1 CU each); queue a (deserved 0) runs a1, a2, a3 of
2 GPUs from 0 s (a1 and a2 on n1, a3 on n2); a1 ends at 600 s, leaving 2 GPUs free on each node.
At 700 s queue b (deserved 4) submits a 4-GPU pod: the pool has 4 free GPUs, only scattered, so
the cycle of 720 s moves a2 to n2 (a defragmentation move: `defragment`, for b1), and at 780 s
a2 binds there (`move`) and b1 on n1 (`claim:defragment`). At 1000 s queue c (deserved 2)
submits 2 GPUs: a holds 4 CU above its fair share of 2, and the cycle of 1020 s reclaims a2,
the most recently started of a's work because the move restarted it: its row reads
`started_as=move`, `ran_s=240` (780 -> 1020 s), `evicted_before=1` (the move). Without moves
the run has one reclaim too (of a3, for b1): the move adds itself, not the reclaim.
"""

from __future__ import annotations

import json
from pathlib import Path

from sim_support import run, scenario_from, unit_cluster

from gpufair.sim.outputs import write_run


def _scenario() -> dict[str, object]:
    cluster = unit_cluster(
        [("n1", 4), ("n2", 4)],
        [
            {"name": "a", "deserved_cu": 0},
            {"name": "b", "deserved_cu": 4},
            {"name": "c", "deserved_cu": 2},
        ],
    )
    cluster["pools"][0]["max_moved_share_per_hour"] = 0.5  # type: ignore[index]
    job = {"duration_s": "10h", "gpus_per_pod": 2}
    return {
        "name": "eviction-chain",
        "duration_s": "1h",
        "cycle_s": 60,
        "cluster": cluster,
        "workloads": [
            {"uid": "a1", "queue": "a", "submit_s": 0, **job, "duration_s": "10m"},
            {"uid": "a2", "queue": "a", "submit_s": 0, **job},
            {"uid": "a3", "queue": "a", "submit_s": 0, **job},
            {"uid": "b1", "queue": "b", "submit_s": 700, **job, "gpus_per_pod": 4},
            {"uid": "c1", "queue": "c", "submit_s": 1000, **job},
        ],
    }


def test_a_moved_workload_reclaimed_later_reads_started_as_move(tmp_path: Path) -> None:
    result, metrics = run(scenario_from(_scenario()))
    rows = [
        (d.time_s, d.event, d.uid, d.reason, d.beneficiary, d.started_as, d.ran_s, d.evicted_before)
        for d in result.decisions
        if d.time_s > 0.0
    ]
    assert rows == [
        (720.0, "evict", "a2", "defragment", "b1", "within_share", 720.0, 0),
        (780.0, "bind", "a2", "move", "", "", 0.0, 0),
        (780.0, "bind", "b1", "claim:defragment", "", "", 0.0, 0),
        (1020.0, "evict", "a2", "reclaim", "c1", "move", 240.0, 1),
        (1080.0, "bind", "c1", "claim:reclaim", "", "", 0.0, 0),
    ]
    assert (result.pools[0].moves, result.pools[0].evictions) == (1, 2)

    write_run(result, metrics, tmp_path)
    events = (tmp_path / "events.csv").read_text().splitlines()
    assert events[0].endswith(",beneficiary,beneficiary_queue,started_as,ran_s,evicted_before")
    assert "1020.000,default,evict,a2,a,2.000,2.000,reclaim,c1,c,move,240.000,1" in events
    assert "780.000,default,bind,a2,a,2.000,2.000,move,,,,," in events
    (moves,) = json.loads((tmp_path / "summary.json").read_text())["moves"]
    assert moves == {
        "pool": "default",
        "moves": 1,
        "moved_gpus": 2.0,
        "evictions": 2,
        "evictions_by_reason": {"defragment": 1, "reclaim": 1},
        "evicted_after_move": 1,
        "repeat_evictions": 1,
    }


def test_without_moves_one_reclaim_all_the_same_of_a_run_begun_within_share() -> None:
    """Without moves b1 waits until c1's arrival makes a's work reclaimable: at 1020 s c1 binds
    on the free GPUs and b1 reclaims a3 (begun at 0 s), binding at 1080 s. One reclaim either
    way: the move brought b1 forward by 300 s and the reclaim took the moved workload."""
    data = _scenario()
    del data["cluster"]["pools"][0]["max_moved_share_per_hour"]  # type: ignore[index]
    result, _ = run(scenario_from(data))
    rows = [
        (d.time_s, d.event, d.uid, d.reason, d.beneficiary, d.started_as, d.ran_s, d.evicted_before)
        for d in result.decisions
        if d.time_s > 0.0
    ]
    assert rows == [
        (1020.0, "bind", "c1", "within_share", "", "", 0.0, 0),
        (1020.0, "evict", "a3", "reclaim", "b1", "within_share", 1020.0, 0),
        (1080.0, "bind", "b1", "claim:reclaim", "", "", 0.0, 0),
    ]
