"""Defragmentation moves of a run, per pool, for summary.json (`moves`): how many evictions were
moves, and the GPUs they moved; and the evictions by the phase that decided them, with the two
chains a move can start (`engine.DecisionRow`): evictions of a workload whose run a move started
(`evicted_after_move`), and evictions of a workload evicted before in the run
(`repeat_evictions`: evicted, bound again, evicted again). `bench/bench_defrag.py` sets runs
with and without moves side by side; this is what one run says about itself."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpufair.sim.engine import SimResult


def moves_summary(result: SimResult) -> list[dict[str, Any]]:
    return [
        {
            "pool": pool.name,
            "moves": pool.moves,
            "moved_gpus": pool.moved_gpus,
            "evictions": pool.evictions,
            **eviction_chains(result, pool.name),
        }
        for pool in result.pools
    ]


def eviction_chains(result: SimResult, pool: str) -> dict[str, Any]:
    """`pool`'s evictions by reason (sorted by name), and how many ended a run a move started
    or were of a workload evicted before."""
    evictions = [d for d in result.decisions if d.event == "evict" and d.pool == pool]
    return {
        "evictions_by_reason": dict(sorted(Counter(d.reason for d in evictions).items())),
        "evicted_after_move": sum(1 for d in evictions if d.started_as == "move"),
        "repeat_evictions": sum(1 for d in evictions if d.evicted_before > 0),
    }
