"""Compute-unit requests: the cycle picks the GPU type and count, cheapest adequate first."""

from __future__ import annotations

import pytest
from cycle_builders import (
    A100,
    GPU_TYPES,
    POOL,
    RTX4090,
    V100,
    node,
    queue,
    snapshot,
)

from gpufair.domain.cu_request import options
from gpufair.domain.cycle import run_cycle
from gpufair.domain.demand import queue_demands
from gpufair.domain.model import Allocation, PodBinding, TopologyConstraint, Workload
from gpufair.domain.placement_ask import adequate_types
from gpufair.domain.placement_rejection import never_fits
from gpufair.domain.snapshot import CycleResult, PendingCode

TYPES = {t.name: t for t in GPU_TYPES}
PRESENT = ("a100-80gb", "v100-16gb", "rtx4090-24gb")


def cu_job(
    uid: str, cu: float, submit_time_s: float = 0.0, gpus_per_pod: float = 0.0, **fields: object
) -> Workload:
    return Workload(
        uid,
        "team",
        POOL,
        0,
        gpus_per_pod,
        submit_time_s,
        compute_units=cu,
        **fields,  # type: ignore[arg-type]
    )


def chosen(result: CycleResult, uid: str) -> tuple[str, int, float]:
    bind = next(b for b in result.binds if b.workload_uid == uid)
    return bind.gpu_type, len(bind.bindings), bind.cu


def test_options_are_ordered_by_cu_given_then_by_type() -> None:
    twenty = [(o.gpu_type, o.pods, o.given_cu) for o in options(cu_job("j", 20), TYPES, PRESENT)]
    assert twenty == [
        ("rtx4090-24gb", 10, 20.0),
        ("v100-16gb", 5, 20.0),
        ("a100-80gb", 2, 20.0),
    ]
    six = [(o.gpu_type, o.pods, o.given_cu) for o in options(cu_job("j", 6), TYPES, PRESENT)]
    assert six == [("rtx4090-24gb", 3, 6.0), ("v100-16gb", 2, 8.0), ("a100-80gb", 1, 10.0)]
    # GPU memory filters types out; pods of 8 GPUs round the count up to whole pods.
    big = options(cu_job("j", 20, min_gpu_memory_gib=40), TYPES, PRESENT)
    assert [(o.gpu_type, o.pods) for o in big] == [("a100-80gb", 2)]
    eights = options(cu_job("j", 20, gpus_per_pod=8.0), TYPES, PRESENT)
    assert (eights[0].gpu_type, eights[0].pods, eights[0].given_cu) == ("rtx4090-24gb", 2, 32.0)
    assert adequate_types(cu_job("j", 20), TYPES, PRESENT) == (
        "rtx4090-24gb",
        "v100-16gb",
        "a100-80gb",
    )


def test_20_cu_takes_ten_4090s_while_free_then_two_a100s() -> None:
    nodes = [node("r1", RTX4090, 8), node("r2", RTX4090, 8), node("a1", A100, 8)]
    pending = [cu_job("first", 20, 0.0), cu_job("second", 20, 1.0)]
    result = run_cycle(snapshot(nodes, [queue("team", 100)], {"team": 100.0}, pending=pending))
    assert chosen(result, "first") == ("rtx4090-24gb", 10, pytest.approx(20.0))
    # Six 4090s are left: the second request goes to the next option with its GPUs free.
    assert chosen(result, "second") == ("a100-80gb", 2, pytest.approx(20.0))
    first = next(b for b in result.binds if b.workload_uid == "first")
    assert sorted({b.node for b in first.bindings}) == ["r1", "r2"]
    assert all(len(b.gpu_indices) == 1 for b in first.bindings)
    assert result.queues["team"].bound_cu == pytest.approx(40.0)


def test_fair_share_counts_the_cu_given_and_caps_the_request() -> None:
    nodes = [node("v1", V100, 8)]
    # 10 CU on V100s (4 CU) is 3 GPUs = 12 CU: within a share of 12, not within one of 11.
    fits = run_cycle(
        snapshot(nodes, [queue("team", 12)], {"team": 12.0}, pending=[cu_job("j", 10)])
    )
    assert chosen(fits, "j") == ("v100-16gb", 3, pytest.approx(12.0))
    capped = run_cycle(
        snapshot(nodes, [queue("team", 11, limit_cu=11)], {"team": 11.0}, pending=[cu_job("j", 10)])
    )
    assert not capped.binds
    assert capped.pending["j"].code is PendingCode.QUEUE_LIMIT


def test_running_cu_request_counts_its_bindings() -> None:
    job = cu_job("j", 20)
    held = Allocation(job, tuple(PodBinding(i, "a1", (i,)) for i in range(2)), 0.0, "a100-80gb")
    result = run_cycle(
        snapshot([node("a1", A100, 8)], [queue("team", 100)], {"team": 100.0}, running_work=[held])
    )
    assert result.queues["team"].allocated_cu_before == pytest.approx(20.0)


def test_a_request_no_type_can_hold_is_refused_with_the_field() -> None:
    nodes = [node("v1", V100, 4)]
    rejection = never_fits(cu_job("j", 40), nodes, GPU_TYPES)  # 10 V100s, the pool has 4
    assert rejection is not None and rejection.field == "compute_units"
    assert "40 CU fits no GPU type of this pool: as 10 × v100-16gb = 40 CU" in rejection.message
    assert never_fits(cu_job("j", 16), nodes, GPU_TYPES) is None


def test_waiting_request_is_demand_on_its_cheapest_option() -> None:
    demands = queue_demands(
        ["team"],
        [],
        [cu_job("j", 20)],
        lambda w: adequate_types(w, TYPES, PRESENT)[0],
        {t.name: t.compute_weight for t in GPU_TYPES},
    )
    assert dict(demands["team"].pending_gpus_by_type) == {"rtx4090-24gb": pytest.approx(10.0)}


def test_a_type_limit_of_the_queue_moves_the_request_to_the_next_option() -> None:
    nodes = [node("r1", RTX4090, 8), node("r2", RTX4090, 8), node("a1", A100, 8)]
    capped = queue("team", 100, limit_gpus_by_type={"rtx4090-24gb": 4})
    result = run_cycle(snapshot(nodes, [capped], {"team": 100.0}, pending=[cu_job("j", 20)]))
    # Ten RTX 4090s would pass the queue's limit of four: two A100s serve the 20 CU instead.
    assert chosen(result, "j") == ("a100-80gb", 2, pytest.approx(20.0))


def mixed_job(uid: str, cu: float, **fields: object) -> Workload:
    return cu_job(
        uid, cu, mixed_gpu_types=True, topology=TopologyConstraint("rack", required=True), **fields
    )


def test_a_mixed_request_takes_several_types_inside_one_rack() -> None:
    # Rack r1: one A100 (10 CU) and eight RTX 4090s (2 CU); rack r2: two V100s (4 CU).
    nodes = [
        node("a1", A100, 1, rack="r1"),
        node("r1", RTX4090, 8, rack="r1"),
        node("v1", V100, 2, rack="r2"),
    ]
    pending = [
        mixed_job("mix", 20),
        cu_job("plain", 20, 1.0, topology=TopologyConstraint("rack", required=True)),
    ]
    result = run_cycle(snapshot(nodes, [queue("team", 100)], {"team": 100.0}, pending=pending))
    # No single type in one rack gives 20 CU (10 RTX 4090s, 2 A100s or 5 V100s): the mixed
    # request takes the A100 and five RTX 4090s of r1; the plain one waits.
    bind = next(b for b in result.binds if b.workload_uid == "mix")
    assert dict(bind.gpus_by_type) == {"a100-80gb": 1.0, "rtx4090-24gb": 5.0}
    assert bind.cu == pytest.approx(20.0)
    assert bind.gpu_type == "a100-80gb"  # 10 CU each: the first name
    assert sorted(b.node for b in bind.bindings) == ["a1"] + ["r1"] * 5
    assert "plain" in result.pending


def test_a_mix_stays_within_the_share_and_counts_its_cu_when_running() -> None:
    nodes = [node("a1", A100, 1, rack="r1"), node("r1", RTX4090, 8, rack="r1")]
    # A fair share of 18 CU cannot take 20 CU within its share; the beyond-share pass may.
    within = run_cycle(
        snapshot(nodes, [queue("team", 18)], {"team": 18.0}, pending=[mixed_job("m", 20)])
    )
    (bind,) = within.binds
    assert bind.over_fair_share and bind.cu == pytest.approx(20.0)
    # Running, the mix counts each GPU at its own type's weight: 10 + 5 × 2 CU.
    running = Allocation(
        mixed_job("m", 20),
        (PodBinding(0, "a1", (0,)), *(PodBinding(i, "r1", (i,)) for i in range(1, 6))),
        0.0,
        "a100-80gb",
    )
    result = run_cycle(snapshot(nodes, [queue("team", 18)], {"team": 18.0}, running_work=[running]))
    assert result.queues["team"].allocated_cu_before == pytest.approx(20.0)
