"""Placement (DESIGN §4.2) and submit-time validation, through the cycle and `never_fits`."""

from __future__ import annotations

import dataclasses
from collections import Counter

from cycle_builders import (
    A100,
    RTX4090,
    V100,
    bound_uids,
    node,
    queue,
    running,
    snapshot,
    workload,
)

from gpufair.domain.cycle import run_cycle
from gpufair.domain.model import PlacementStrategy, TopologyConstraint
from gpufair.domain.placement_ask import Exclusion, PodShape
from gpufair.domain.placement_rejection import never_fits
from gpufair.domain.snapshot import CycleResult, PendingCode

BIG = {"q": 1_000.0}


def _only_bind(result: CycleResult, uid: str) -> tuple[str, list[str]]:
    bind = next(b for b in result.binds if b.workload_uid == uid)
    return bind.gpu_type, [b.node for b in bind.bindings]


def test_30gb_job_never_lands_on_16gb_card() -> None:
    nodes = [node("v1", V100), node("a1", A100, gpus=1)]
    busy = running(workload("busy", "q", types=(A100.name,)), [("a1", (0,))], A100)
    job = workload("big-mem", "q", min_gpu_memory_gib=30)
    result = run_cycle(snapshot(nodes, [queue("q", 100)], BIG, running_work=[busy], pending=[job]))
    assert result.binds == ()
    assert result.pending["big-mem"].code is PendingCode.NO_CAPACITY
    rejection = never_fits(job, [node("v1", V100), node("v2", V100)], [V100, A100])
    assert rejection is not None
    assert rejection.field == "min_gpu_memory_gib"
    assert "16 GiB" in rejection.message


def test_4090_job_takes_a_free_4090_not_an_a100() -> None:
    nodes = [node("a1", A100), node("r1", RTX4090)]
    job = workload("small", "q", min_gpu_memory_gib=20)
    result = run_cycle(snapshot(nodes, [queue("q", 100)], BIG, pending=[job]))
    assert _only_bind(result, "small") == (RTX4090.name, ["r1"])
    assert result.binds[0].cu == 2.0


def test_cheapest_type_full_falls_back_to_pricier_type() -> None:
    nodes = [node("a1", A100, gpus=2), node("r1", RTX4090, gpus=1)]
    busy = running(workload("busy", "q"), [("r1", (0,))], RTX4090)
    job = workload("small", "q")
    result = run_cycle(snapshot(nodes, [queue("q", 100)], BIG, running_work=[busy], pending=[job]))
    assert _only_bind(result, "small") == (A100.name, ["a1"])


def test_no_gang_mixes_gpu_types() -> None:
    nodes = [node("a1", A100, gpus=4), node("r1", RTX4090, gpus=4)]
    gang = workload("gang", "q", pods=8)
    result = run_cycle(snapshot(nodes, [queue("q", 100)], BIG, pending=[gang]))
    assert result.binds == ()
    assert result.pending["gang"].code is PendingCode.NEVER_FITS
    smaller = workload("gang6", "q", pods=6)
    result = run_cycle(
        snapshot([*nodes, node("r2", RTX4090, gpus=4)], [queue("q", 100)], BIG, pending=[smaller])
    )
    gpu_type, placed = _only_bind(result, "gang6")
    assert gpu_type == RTX4090.name
    assert set(placed) <= {"r1", "r2"}


def test_gang_is_all_or_nothing() -> None:
    nodes = [node("n1", gpus=4), node("n2", gpus=4)]
    busy = running(workload("busy", "q"), [("n2", (0,))])
    gang = workload("gang", "q", pods=8)
    elastic = workload("elastic", "q", pods=8, min_pods=6, submit_time_s=1)
    result = run_cycle(
        snapshot(nodes, [queue("q", 100)], BIG, running_work=[busy], pending=[gang, elastic])
    )
    assert "gang" in result.pending
    bind = next(b for b in result.binds if b.workload_uid == "elastic")
    assert len(bind.bindings) == 7  # as many as fit, at least the gang minimum


def test_fractional_pods_share_a_gpu_up_to_one() -> None:
    nodes = [node("n1", gpus=2)]
    jobs = [workload(f"f{i}", "q", gpus=0.3, submit_time_s=i) for i in range(7)]
    result = run_cycle(snapshot(nodes, [queue("q", 100)], BIG, pending=jobs))
    per_gpu: Counter[int] = Counter()
    for bind in result.binds:
        (binding,) = bind.bindings
        assert binding.gpu_fraction == 0.3
        per_gpu[binding.gpu_indices[0]] += 1
    assert sorted(per_gpu.values()) == [3, 3]  # 3 × 0.3 = 0.9 per GPU; a 4th would exceed 1.0
    assert result.pending["f6"].code is PendingCode.NO_CAPACITY


def test_cpu_and_memory_must_fit_on_the_node() -> None:
    nodes = [
        node("n0", gpus=2, memory_mib=3_000),  # fullest, but too little memory for a pod
        node("n1", gpus=4, cpu_millicores=8_000),
        node("n2", gpus=8, cpu_millicores=8_000),
    ]
    job = workload("cpu-heavy", "q", pods=2, cpu_millicores=6_000, memory_mib=4_000)
    result = run_cycle(snapshot(nodes, [queue("q", 100)], BIG, pending=[job]))
    _, placed = _only_bind(result, "cpu-heavy")
    assert sorted(placed) == ["n1", "n2"]  # binpack would put both on n1; its CPU forbids it


def test_binpack_fills_the_fullest_node_and_spread_the_emptiest() -> None:
    nodes = [node("n1", gpus=4), node("n2", gpus=4)]
    busy = running(workload("busy", "q"), [("n1", (0, 1))])
    job = workload("job", "q", pods=2)
    packed = run_cycle(snapshot(nodes, [queue("q", 100)], BIG, running_work=[busy], pending=[job]))
    assert _only_bind(packed, "job")[1] == ["n1", "n1"]
    spread = run_cycle(
        snapshot(
            nodes,
            [queue("q", 100)],
            BIG,
            running_work=[busy],
            pending=[job],
            placement=PlacementStrategy.SPREAD,
        )
    )
    assert sorted(_only_bind(spread, "job")[1]) == ["n1", "n2"]


def test_pods_on_distinct_nodes_never_share_a_node() -> None:
    """A multi-node job (Slurm --nodes=N) gets one pod per node: the two pods that binpack
    would put on the fullest node go to two nodes; three pods on two nodes never fit."""
    nodes = [node("n1", gpus=4), node("n2", gpus=4)]
    busy = running(workload("busy", "q"), [("n1", (0, 1))])
    plain = workload("plain", "q", pods=2)
    distinct = dataclasses.replace(plain, uid="distinct", pods_on_distinct_nodes=True)
    packed = run_cycle(
        snapshot(nodes, [queue("q", 100)], BIG, running_work=[busy], pending=[plain])
    )
    assert _only_bind(packed, "plain")[1] == ["n1", "n1"]
    apart = run_cycle(
        snapshot(nodes, [queue("q", 100)], BIG, running_work=[busy], pending=[distinct])
    )
    assert sorted(_only_bind(apart, "distinct")[1]) == ["n1", "n2"]
    three = dataclasses.replace(distinct, uid="three", pods=3)
    result = run_cycle(snapshot(nodes, [queue("q", 100)], BIG, pending=[three]))
    assert result.binds == ()
    assert result.pending["three"].code is PendingCode.NEVER_FITS


def test_required_topology_keeps_gang_in_smallest_fitting_domain() -> None:
    nodes = [
        node("r1a", gpus=4, rack="r1"),
        node("r1b", gpus=4, rack="r1"),
        node("r2a", gpus=4, rack="r2"),
        node("r2b", gpus=4, rack="r2"),
    ]
    busy = running(workload("busy", "q"), [("r2a", (0, 1))])
    gang = workload("gang", "q", pods=5, topology=TopologyConstraint("rack", required=True))
    result = run_cycle(snapshot(nodes, [queue("q", 100)], BIG, running_work=[busy], pending=[gang]))
    # rack r2 has 6 free GPUs, r1 has 8: binpack takes the tighter domain that holds the gang.
    assert set(_only_bind(result, "gang")[1]) == {"r2a", "r2b"}
    too_big = workload("too-big", "q", pods=7, topology=TopologyConstraint("rack", required=True))
    result = run_cycle(
        snapshot(nodes, [queue("q", 100)], BIG, running_work=[busy], pending=[too_big])
    )
    assert bound_uids(result) == {"too-big"}  # r1 holds 8
    wider = workload("wider", "q", pods=9, topology=TopologyConstraint("rack", required=True))
    preferred = workload("pref", "q", pods=9, topology=TopologyConstraint("rack"))
    assert never_fits(wider, nodes, [A100]) is not None
    result = run_cycle(
        snapshot(nodes, [queue("q", 100)], BIG, running_work=[busy], pending=[preferred])
    )
    assert bound_uids(result) == {"pref"}  # preferred falls back across racks


def test_never_fits_names_the_offending_field() -> None:
    pool = [node("n1", V100, gpus=8), node("n2", V100, gpus=8)]
    types = [V100, A100]
    assert never_fits(workload("ok", "q", pods=2, gpus=8), pool, types) is None
    too_many = never_fits(workload("x", "q", pods=3, gpus=8), pool, types)
    assert too_many is not None and too_many.field == "pods"
    wrong_type = never_fits(workload("x", "q", types=(A100.name,)), pool, types)
    assert wrong_type is not None and wrong_type.field == "allowed_gpu_types"
    huge_pod = never_fits(workload("x", "q", gpus=16), pool, types)
    assert huge_pod is not None and huge_pod.field == "gpus_per_pod"
    odd = never_fits(workload("x", "q", gpus=1.5), pool, types)
    assert odd is not None and odd.field == "gpus_per_pod"
    cpu = never_fits(workload("x", "q", cpu_millicores=100_000), pool, types)
    assert cpu is not None and cpu.field == "cpu_millicores_per_pod"
    # Half a 16 GiB card gives 8 GiB: a 10 GiB fractional job cannot share one.
    shared = never_fits(workload("x", "q", gpus=0.5, min_gpu_memory_gib=10), pool, types)
    assert shared is not None and shared.field == "min_gpu_memory_gib"


def test_pod_shape_derives_its_gpu_facts_once_and_compares_by_its_fields() -> None:
    whole = PodShape(2.0, 8_000, 64_000)
    shared = PodShape(0.25, 2_000, 16_000)
    none = PodShape(0.0, 1_000, 1_000)
    assert (whole.whole_gpus, whole.shares_gpu) == (2, False)
    assert (shared.whole_gpus, shared.shares_gpu) == (0, True)
    assert (none.whole_gpus, none.shares_gpu) == (0, False)
    # Memo keys hold shapes: equal fields, equal shape and hash.
    assert PodShape(2.0, 8_000, 64_000) == whole
    assert hash(PodShape(2.0, 8_000, 64_000)) == hash(whole)
    assert repr(whole) == (
        "PodShape(gpus_per_pod=2.0, cpu_millicores=8000, memory_mib=64000, profile='', "
        "one_per_node=False)"
    )
    # A partition profile is part of the shape: the same fraction of another profile differs.
    assert PodShape(0.25, 2_000, 16_000, "2g.20gb") != shared


def test_an_exclusion_blocks_any_node_only_when_something_is_held_or_promised() -> None:
    assert not Exclusion().blocks_any()
    assert Exclusion(held={3: "job-a"}).blocks_any()
    # A cheap, safe test: held nodes make it true even when the owner itself places.
    assert Exclusion(held={3: "job-a"}, owner="job-a").blocks_any()
    assert not Exclusion(held={3: "job-a"}, owner="job-a").blocks(3)
    # Gang-wait nodes block only beyond-fair-share work.
    assert not Exclusion(gang_held=frozenset({1}), beyond_share=False).blocks_any()
    assert Exclusion(gang_held=frozenset({1}), beyond_share=True).blocks_any()
    assert Exclusion(gang_held=frozenset({1}), beyond_share=True).blocks(1)
