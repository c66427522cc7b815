"""Defragmentation moves of a run, per pool, for summary.json (`moves`): how many evictions were
moves, and the GPUs they moved. `bench/bench_defrag.py` sets runs with and without moves side by
side; this is what one run says about itself."""

from __future__ import annotations

from typing import Any

from gpufair.sim.engine import SimResult


def moves_summary(result: SimResult) -> list[dict[str, Any]]:
    return [
        {
            "pool": pool.name,
            "moves": pool.moves,
            "moved_gpus": pool.moved_gpus,
            "evictions": pool.evictions,
        }
        for pool in result.pools
    ]
