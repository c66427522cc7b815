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
    EvictReason.DEFRAGMENT: pb.EVICT_REASON_DEFRAGMENT,
    EvictReason.ENTITLEMENT: pb.EVICT_REASON_ENTITLEMENT,
}


class PendingEncoder:
    """The `pending` list of `Schedule` replies, encoded a (uid, reason) at a time and kept.

    A reply lists every waiting workload with its reason (18,000 of them at the issue's size),
    and from one cycle to the next most of them wait for the same reason. Building a message
    object for each costs more than the rest of the reply; here each (uid, reason) is encoded
    once, as the bytes of one `pending` entry of `ScheduleResponse`, kept by uid with the reason
    it encodes (compared on use: a new reason is encoded anew), and a reply's list is the
    concatenation of its entries, in uid order, merged into the message by protobuf's own
    parser (repeated fields of concatenated encodings append). Bounded: past `limit` entries
    the map starts over. Threads share it: each call reads and fills one map of its own
    choosing, as `SpecCache` does."""

    def __init__(self, limit: int = 200_000) -> None:
        self.limit = limit
        self._entries: dict[str, tuple[str, str, bytes]] = {}  # uid -> code, message, bytes

    def encode(self, pending: Mapping[str, PendingReason]) -> bytes:
        entries = self._entries
        if len(entries) > self.limit:
            entries = self._entries = {}
        out = []
        for uid in sorted(pending):
            reason = pending[uid]
            entry = entries.get(uid)
            if entry is None or entry[1] != reason.message or entry[0] != reason.code:
                entry = entries[uid] = (reason.code, reason.message, _pending_entry(uid, reason))
            out.append(entry[2])
        return b"".join(out)


def _pending_entry(uid: str, reason: PendingReason) -> bytes:
    one = pb.PendingWorkload(uid=uid, reason_code=reason.code.value, message=reason.message)
    return pb.ScheduleResponse(pending=[one]).SerializeToString()


def result_to_proto(
    pool: str,
    result: CycleResult,
    now_s: float,
    cycle_id: int,
    encoder: PendingEncoder | None = None,
) -> pb.ScheduleResponse:
    """The reply of a cycle; with `encoder`, the pending list comes from its kept encodings
    (the same message, built faster)."""
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
                move=bool(e.move_to),
                move_gpu_type=e.move_gpu_type,
                move_to=bindings_to_proto(e.move_to),
            )
            for e in result.evicts
        ],
    )
    if encoder is None:
        reply.pending.extend(
            pb.PendingWorkload(uid=uid, reason_code=reason.code.value, message=reason.message)
            for uid, reason in sorted(result.pending.items())
        )
    else:
        reply.MergeFromString(encoder.encode(result.pending))
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
