"""Cycle results and explanations to proto."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from gpufair.api.convert_workload import bindings_to_proto
from gpufair.domain.capacity import binding_gpus
from gpufair.domain.explain import Explanation
from gpufair.domain.snapshot import CycleResult, EvictReason, PendingReason
from gpufair.v1 import scheduler_pb2 as pb

_EVICT = {
    EvictReason.RECLAIM: pb.EVICT_REASON_RECLAIM,
    EvictReason.PREEMPT: pb.EVICT_REASON_PREEMPT,
}


def result_to_proto(
    pool: str, result: CycleResult, now_s: float, cycle_id: int
) -> pb.ScheduleResponse:
    reply = pb.ScheduleResponse(
        pool=pool,
        cycle_id=cycle_id,
        binds=[
            pb.BindDecision(
                uid=b.workload_uid,
                gpu_type=b.gpu_type,
                pods=bindings_to_proto(b.bindings),
                cu=b.cu,
                over_fair_share=b.over_fair_share,
                gpus=math.fsum(binding_gpus(p) for p in b.bindings),
                gpus_by_type=b.gpus_by_type
                or {b.gpu_type: math.fsum(binding_gpus(p) for p in b.bindings)},
            )
            for b in result.binds
        ],
        evicts=[
            pb.EvictDecision(
                uid=e.workload_uid,
                queue=e.queue,
                reason=_EVICT[e.reason],
                in_favour_of=e.beneficiary_uid,
                message=e.message,
            )
            for e in result.evicts
        ],
        pending=[
            pb.PendingWorkload(uid=uid, reason_code=reason.code.value, message=reason.message)
            for uid, reason in sorted(result.pending.items())
        ],
    )
    reply.decided_at.FromNanoseconds(round(now_s * 1e9))
    return reply


def explanation_to_proto(e: Explanation, state: str) -> pb.ExplainWorkloadResponse:
    n = e.nodes
    filters = [
        ("not_ready", n.not_ready),
        ("gpu_type", n.wrong_gpu_type),
        ("gpu_memory", n.gpu_memory_too_small),
        ("held_for_other", n.held_for_other),
        ("free_gpus", n.too_few_free_gpus),
        ("cpu", n.too_little_cpu),
        ("memory", n.too_little_memory),
    ]
    return pb.ExplainWorkloadResponse(
        uid=e.workload_uid,
        state=state if e.pending is None else "pending",
        reason_code=e.pending.code.value if e.pending else "",
        message=e.message,
        filters=[pb.FilterCount(filter=name, nodes_failed=count) for name, count in filters],
        needs_cu=e.needed_cu,
        queue_may_take_cu=e.queue_may_take_cu,
    )


def without_binds(result: CycleResult, not_kept: Mapping[str, PendingReason]) -> CycleResult:
    """`result` with the binds of `not_kept` turned back into pending work, each with its
    reason: their workloads changed while the cycle ran, or their GPUs were taken meanwhile
    (`store/schedule_repo.record_cycle`)."""
    if not not_kept:
        return result
    pending = dict(result.pending)
    pending.update(not_kept)
    uids = not_kept.keys()
    return dataclasses.replace(
        result, binds=tuple(b for b in result.binds if b.workload_uid not in uids), pending=pending
    )
