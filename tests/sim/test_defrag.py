"""Defragmentation in the simulator: the fragmentation example with and without moves, the
numbers bench/results/defrag.md records (over two days here, to keep the test short)."""

from __future__ import annotations

import dataclasses

from sim_support import example_data, run, scenario_from

from gpufair.sim.engine import SimResult
from gpufair.sim.metrics import percentile
from gpufair.sim.outputs import run_summary


def _large_waits(result: SimResult) -> list[float]:
    return [j.wait_s for j in result.jobs if j.workload.total_gpus >= 8]


def test_moves_shorten_the_wait_of_whole_node_jobs_among_small_ones() -> None:
    data = example_data("fragmentation")
    data["duration_s"] = "2d"
    with_moves = scenario_from(data)
    pools = tuple(
        dataclasses.replace(pool, max_moved_share_per_hour=None)
        for pool in with_moves.cluster.pools
    )
    without = dataclasses.replace(
        with_moves, cluster=dataclasses.replace(with_moves.cluster, pools=pools)
    )
    off, off_metrics = run(without)
    on, on_metrics = run(with_moves)
    (off_pool,), (on_pool,) = off.pools, on.pools
    assert (off_pool.moves, off_pool.moved_gpus) == (0, 0.0)
    assert on_pool.moves > 0
    off_waits, on_waits = _large_waits(off), _large_waits(on)
    assert len(off_waits) == len(on_waits) > 50
    off_p99, on_p99 = percentile(off_waits, 99), percentile(on_waits, 99)
    assert off_p99 is not None and on_p99 is not None
    # 6 moves (10 GPUs) take training's P99 wait from 1.2 h to 0.46 h and the GPU-hours left
    # idle while work waited from 153 to 104.
    assert (on_pool.moves, on_pool.moved_gpus) == (6, 10.0)
    (moves,) = run_summary(on, on_metrics)["moves"]
    assert (moves["moves"], moves["moved_gpus"]) == (6, 10.0)
    assert (round(off_p99), round(on_p99)) == (4328, 1644)
    idle_off = off_metrics.pools[0].idle_gpu_hours_while_pending
    idle_on = on_metrics.pools[0].idle_gpu_hours_while_pending
    assert (round(idle_off), round(idle_on)) == (153, 104)
    # Every moved job ran to its end or is still running: none was left waiting by a move.
    moved = {j.workload.uid for j in on.jobs if j.evictions}
    assert all(j.pending_since_s is None for j in on.jobs if j.workload.uid in moved)
