"""The cycle's decision records, built as often as the cycle decides: once per bind, hold and
eviction, thousands per cycle at 4,000 nodes, and the pending reasons a result makes (one per
queue and sentence).

Each function returns the same value as the frozen class's constructor with those arguments
(every field set, defaults included). A frozen class refuses attribute stores, so its
constructor sets each field by `object.__setattr__`, and a slot descriptor's `__set__` (the
way these were built before) is a method-wrapper call too: about 0.9 k instructions a field.
Here a record is made as an instance of its class's plain twin (`record_fill.fill_class`: the
same slots, made from the class's own field list at import, which fails if the two layouts ever
differ), its fields set by plain attribute stores, and then given the frozen class as its
`__class__`; from then on it is of that class in every respect (type, equality, hash, repr,
pickling, copying, `dataclasses.replace`, frozen: tests/domain/test_record_fill.py). Per call
(cachegrind, 20,000 builds): `model.pod_binding` 5.7 -> 3.0 k instructions, `evicted_capacity`
5.6 -> 2.9 k, `bind_decision` 7.4 -> 3.5 k, `evict_decision` 8.8 -> 4.2 k, `pending_reason`
4.3 -> 3.4 k.
"""

from __future__ import annotations

from gpufair.domain.model import PodBinding
from gpufair.domain.record_fill import fill_class
from gpufair.domain.snapshot import (
    BindDecision,
    EvictDecision,
    EvictReason,
    PendingCode,
    PendingReason,
    Reservation,
    ReservationKind,
)

_BindFill = fill_class(
    BindDecision,
    ("workload_uid", "queue", "gpu_type", "bindings", "cu", "over_fair_share", "gpus_by_type"),
)
_ReservationFill = fill_class(Reservation, ("workload_uid", "kind", "gpu_type", "nodes", "held"))
_EvictFill = fill_class(
    EvictDecision,
    (
        "workload_uid",
        "queue",
        "reason",
        "message",
        "beneficiary_uid",
        "cu",
        "move_to",
        "move_gpu_type",
    ),
)
_ReasonFill = fill_class(PendingReason, ("code", "message"))
_EVICTED_CAPACITY = ReservationKind.EVICTED_CAPACITY


def bind_decision(
    workload_uid: str,
    queue: str,
    gpu_type: str,
    bindings: tuple[PodBinding, ...],
    cu: float,
    over_fair_share: bool,
) -> BindDecision:
    """`BindDecision(workload_uid, queue, gpu_type, bindings, cu, over_fair_share)`."""
    record = _BindFill()
    record.workload_uid = workload_uid
    record.queue = queue
    record.gpu_type = gpu_type
    record.bindings = bindings
    record.cu = cu
    record.over_fair_share = over_fair_share
    record.gpus_by_type = {}
    record.__class__ = BindDecision
    decision: BindDecision = record
    return decision


def evicted_capacity(
    workload_uid: str, gpu_type: str, nodes: tuple[str, ...], held: tuple[PodBinding, ...]
) -> Reservation:
    """`Reservation(workload_uid, ReservationKind.EVICTED_CAPACITY, gpu_type, nodes, held)`."""
    record = _ReservationFill()
    record.workload_uid = workload_uid
    record.kind = _EVICTED_CAPACITY
    record.gpu_type = gpu_type
    record.nodes = nodes
    record.held = held
    record.__class__ = Reservation
    reservation: Reservation = record
    return reservation


def evict_decision(
    workload_uid: str,
    queue: str,
    reason: EvictReason,
    message: str,
    beneficiary_uid: str,
    cu: float,
) -> EvictDecision:
    """`EvictDecision(workload_uid, queue, reason, message, beneficiary_uid, cu)`."""
    record = _EvictFill()
    record.workload_uid = workload_uid
    record.queue = queue
    record.reason = reason
    record.message = message
    record.beneficiary_uid = beneficiary_uid
    record.cu = cu
    record.move_to = ()
    record.move_gpu_type = ""
    record.__class__ = EvictDecision
    decision: EvictDecision = record
    return decision


def pending_reason(code: PendingCode, message: str) -> PendingReason:
    """`PendingReason(code, message)`."""
    record = _ReasonFill()
    record.code = code
    record.message = message
    record.__class__ = PendingReason
    reason: PendingReason = record
    return reason
