"""DESIGN §1's reference case as a snapshot: 100 GPUs, an LLM team and a vision team.

25 nodes × 4 GPUs (1 CU each). LLM: deserved 30, inference on 10 GPUs (non-preemptible). Vision:
deserved 20, holding the rest with 45 preemptible 2-GPU jobs and a stream of more pending. The LLM
team submits a 60-GPU gang: 15 pods × 4 GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable

from cycle_builders import node, queue, running, snapshot, workload

from gpufair.domain.model import Allocation, Node, Queue, Workload
from gpufair.domain.snapshot import CycleSnapshot, EvictionInFlight

NOW_S = 100_000.0
NODES: tuple[Node, ...] = tuple(node(f"n{i:02d}", gpus=4) for i in range(25))
QUEUES: tuple[Queue, ...] = (queue("llm", 30), queue("vision", 20))
INFERENCE = workload("llm-inference", "llm", pods=10, preemptible=False)
GANG = workload("llm-post-training", "llm", pods=15, gpus=4, submit_time_s=NOW_S - 300)
VISION_PENDING: tuple[Workload, ...] = tuple(
    workload(f"vision-next-{i}", "vision", gpus=2, submit_time_s=NOW_S - 1_000 + i)
    for i in range(10)
)


def running_work() -> list[Allocation]:
    inference = running(
        INFERENCE,
        [("n00", (i,)) for i in range(4)]
        + [("n01", (i,)) for i in range(4)]
        + [("n02", (0,)), ("n02", (1,))],
    )
    vision = [running(workload("vision-0", "vision", gpus=2), [("n02", (2, 3))], started_at_s=0)]
    for i in range(3, 25):
        for half in (0, 1):
            uid = f"vision-{(i - 3) * 2 + half + 1}"
            vision.append(
                running(
                    workload(uid, "vision", gpus=2),
                    [(f"n{i:02d}", (2 * half, 2 * half + 1))],
                    started_at_s=float(i * 100 + half),
                )
            )
    return [inference, *vision]


def reference_snapshot(
    llm_fair_share_cu: float,
    vision_fair_share_cu: float,
    *,
    work: Iterable[Allocation] | None = None,
    evicting: Iterable[EvictionInFlight] = (),
) -> CycleSnapshot:
    return snapshot(
        NODES,
        QUEUES,
        {"llm": llm_fair_share_cu, "vision": vision_fair_share_cu},
        running_work=running_work() if work is None else work,
        pending=[GANG, *VISION_PENDING],
        now_s=NOW_S,
        evicting=evicting,
    )
