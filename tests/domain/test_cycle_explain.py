"""`explain`: a pending workload's queue numbers, node filters and what it would take."""

from __future__ import annotations

import pytest
from cycle_builders import A100, RTX4090, V100, node, queue, running, snapshot, workload

from gpufair.domain.cycle import run_cycle
from gpufair.domain.explain import explain
from gpufair.domain.snapshot import PendingCode


def test_explain_counts_the_first_filter_each_node_fails() -> None:
    nodes = [
        node("r1", RTX4090),
        node("v1", V100),
        node("v2", V100),
        node("a1", A100, gpus=2),
        node("a2", A100, gpus=2, cpu_millicores=1_000),
        node("a3", A100, gpus=2),
        node("down", A100, ready=False),
    ]
    a100, settled_s = (A100.name,), 10**9  # running work not reclaimable yet
    busy = workload("busy", "other", pods=2, types=a100, min_runtime_s=settled_s)
    half = workload("half", "other", types=a100, min_runtime_s=settled_s)
    work = [
        running(busy, [("a1", (0,)), ("a1", (1,))], A100),
        running(half, [("a3", (0,))], A100),
    ]
    wants = workload(
        "wants",
        "team",
        gpus=2,
        types=(A100.name, V100.name),
        min_gpu_memory_gib=30,
        cpu_millicores=2_000,
    )
    snap = snapshot(
        nodes,
        [queue("team", 20), queue("other")],
        {"team": 30, "other": 0},
        running_work=work,
        pending=[wants],
    )
    result = run_cycle(snap)
    assert result.pending["wants"].code is PendingCode.NO_CAPACITY
    why = explain(snap, result, "wants")
    counts = why.nodes
    assert (counts.nodes, counts.not_ready, counts.wrong_gpu_type) == (7, 1, 1)
    assert (counts.gpu_memory_too_small, counts.too_few_free_gpus) == (2, 2)
    assert (counts.too_little_cpu, counts.fits_a_pod) == (1, 0)
    assert (why.needed_cu, why.queue_may_take_cu, why.over_quota_needed_cu) == (20, 30, 0)
    assert "1 wrong GPU type, 2 too little GPU memory" in why.message


def test_explain_of_a_workload_the_cycle_binds_says_so() -> None:
    """Pending, and explain's own cycle binds it (no cycle ran since it came, or room freed up):
    the next cycle will; "not pending" would contradict the state the caller sees."""
    snap = snapshot([node("n")], [queue("q")], {"q": 8}, pending=[workload("w", "q")])
    why = explain(snap, run_cycle(snap), "w")
    assert why.pending is None
    assert why.message == ("w fits now: the next cycle of pool main would bind it (it needs 1 CU)")


def test_explain_memory_filter_and_what_it_would_take() -> None:
    nodes = [node("v1", V100), node("v2", V100)]
    job = workload("big-mem", "team", pods=2, min_gpu_memory_gib=30)
    snap = snapshot(nodes, [queue("team", 8)], {"team": 8}, pending=[job])
    result = run_cycle(snap)
    assert result.pending["big-mem"].code is PendingCode.NEVER_FITS
    why = explain(snap, result, "big-mem")
    assert why.nodes.gpu_memory_too_small == 2
    assert why.cheapest_gpu_type is None and why.needed_cu == 0


def test_explain_unknown_workload_raises() -> None:
    snap = snapshot([node("n")], [queue("q")], {"q": 1})
    with pytest.raises(KeyError):
        explain(snap, run_cycle(snap), "nobody")
