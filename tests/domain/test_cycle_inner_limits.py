"""Limits of inner queues bind their leaves together in the cycle (DESIGN §2: every node of the
tree has its limit; issue 14), in the work-conserving pass too."""

from __future__ import annotations

from cycle_builders import A100, RTX4090, bound_uids, node, queue, running, snapshot, workload

from gpufair.domain.cycle import run_cycle
from gpufair.domain.snapshot import PendingCode


def _teams(dept: str = "dept") -> list[object]:
    return [queue("t1", parent=dept), queue("t2", parent=dept)]


def test_a_department_cu_limit_caps_its_teams_in_the_work_conserving_pass() -> None:
    nodes = [node("n", gpus=16)]
    dept = queue("dept", limit_cu=4)
    pending = [
        workload(f"{team}-{i}", team, submit_time_s=i) for team in ("t1", "t2") for i in range(8)
    ]
    result = run_cycle(
        snapshot(nodes, _teams(), {"t1": 2.0, "t2": 2.0}, pending=pending, inner_queues=[dept])
    )
    # 4 CU for the whole department: two jobs per team (before: all 16, 12 beyond the limit).
    assert bound_uids(result) == {"t1-0", "t1-1", "t2-0", "t2-1"}
    assert sum(b.cu for b in result.binds) == 4.0
    reason = result.pending["t1-2"]
    assert reason.code is PendingCode.QUEUE_LIMIT
    assert reason.message == (
        "would exceed the limit of queue dept above its queue (limit 4 CU; the queues under "
        "it hold 4 CU, this needs 1 CU)"
    )


def test_a_department_limit_counts_running_work_and_nested_departments() -> None:
    nodes = [node("n", gpus=16)]
    inner = [queue("org", limit_cu=6), queue("dept", parent="org")]
    teams = [queue("t1", parent="dept"), queue("t2", parent="org")]
    work = [running(workload("t2-old", "t2", gpus=4), [("n", (0, 1, 2, 3))])]
    pending = [workload(f"t1-{i}", "t1", submit_time_s=i) for i in range(8)]
    result = run_cycle(
        snapshot(
            nodes,
            teams,
            {"t1": 8.0, "t2": 4.0},
            running_work=work,
            pending=pending,
            inner_queues=inner,
        )
    )
    # org may hold 6 CU; t2 already holds 4 under it, so t1 (two levels down) gets 2.
    assert bound_uids(result) == {"t1-0", "t1-1"}
    assert result.pending["t1-2"].code is PendingCode.QUEUE_LIMIT
    assert "queue org above its queue" in result.pending["t1-2"].message


def test_a_department_per_type_limit_caps_its_teams_on_that_type_only() -> None:
    nodes = [node("a", A100, gpus=8), node("r", RTX4090, gpus=8)]
    dept = queue("dept", limit_gpus_by_type={A100.name: 2})
    a100_only = (A100.name,)
    pending = [
        workload(f"{team}-a{i}", team, types=a100_only, submit_time_s=i)
        for team in ("t1", "t2")
        for i in range(2)
    ] + [workload("t1-r", "t1", types=(RTX4090.name,), submit_time_s=9)]
    result = run_cycle(
        snapshot(nodes, _teams(), {"t1": 40.0, "t2": 40.0}, pending=pending, inner_queues=[dept])
    )
    bound = bound_uids(result)
    # Two A100s for the department (before: four), one per team in queue order; the RTX 4090
    # job is not under the A100 limit.
    assert len(bound & {"t1-a0", "t1-a1", "t2-a0", "t2-a1"}) == 2
    assert {"t1-a0", "t2-a0", "t1-r"} <= bound
    a100_binds = [b for b in result.binds if b.gpu_type == A100.name]
    assert sum(len(b.bindings) for b in a100_binds) == 2
    assert result.pending["t1-a1"].code is PendingCode.QUEUE_LIMIT
    assert "queue dept above: limit per type {'a100-80gb': 2" in result.pending["t1-a1"].message
