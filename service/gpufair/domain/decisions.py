"""The cycle's decision records, built as often as the cycle decides: once per bind, hold and
eviction, thousands per cycle at 4,000 nodes, and the pending reasons a result makes (one per
queue and sentence).

Each function returns the same value as the frozen class's constructor with those arguments
(every field set, defaults included), in about half its time: the slots are filled through their
descriptors, not through the generated `__init__` (one `object.__setattr__` per field), as
`model.pod_binding` builds a `PodBinding`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from gpufair.domain.model import PodBinding, pod_binding
from gpufair.domain.snapshot import (
    BindDecision,
    EvictDecision,
    EvictReason,
    PendingCode,
    PendingReason,
    Reservation,
    ReservationKind,
)

_new_object = object.__new__


def _setters(
    cls: type[Any], names: tuple[str, ...]
) -> tuple[Callable[[object, object], None], ...]:
    """The slot setters of `cls` for `names`, which must be all its fields, in their order."""
    declared = tuple(field.name for field in fields(cls))
    if declared != names:
        raise TypeError(f"{cls.__name__} has fields {declared}, not {names}")
    return tuple(vars(cls)[name].__set__ for name in names)


_BIND = _setters(
    BindDecision,
    ("workload_uid", "queue", "gpu_type", "bindings", "cu", "over_fair_share", "gpus_by_type"),
)
_RESERVATION = _setters(Reservation, ("workload_uid", "kind", "gpu_type", "nodes", "held"))
_EVICT = _setters(
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
_REASON = _setters(PendingReason, ("code", "message"))
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
    record: BindDecision = _new_object(BindDecision)
    uid_, queue_, type_, bindings_, cu_, over_, by_type_ = _BIND
    uid_(record, workload_uid)
    queue_(record, queue)
    type_(record, gpu_type)
    bindings_(record, bindings)
    cu_(record, cu)
    over_(record, over_fair_share)
    by_type_(record, {})
    return record


def evicted_capacity(
    workload_uid: str, gpu_type: str, nodes: tuple[str, ...], held: tuple[PodBinding, ...]
) -> Reservation:
    """`Reservation(workload_uid, ReservationKind.EVICTED_CAPACITY, gpu_type, nodes, held)`."""
    record: Reservation = _new_object(Reservation)
    uid_, kind_, type_, nodes_, held_ = _RESERVATION
    uid_(record, workload_uid)
    kind_(record, _EVICTED_CAPACITY)
    type_(record, gpu_type)
    nodes_(record, nodes)
    held_(record, held)
    return record


def evicted_capacity_one(
    workload_uid: str,
    gpu_type: str,
    node: str,
    gpu_indices: tuple[int, ...],
    gpu_fraction: float,
    partition_start: int | None,
) -> Reservation:
    """`evicted_capacity` of one pod held on `node`: the common hold, whose node names and
    bindings are each one item."""
    held = (pod_binding(0, node, gpu_indices, gpu_fraction, partition_start),)
    return evicted_capacity(workload_uid, gpu_type, (node,), held)


def evict_decision(
    workload_uid: str,
    queue: str,
    reason: EvictReason,
    message: str,
    beneficiary_uid: str,
    cu: float,
) -> EvictDecision:
    """`EvictDecision(workload_uid, queue, reason, message, beneficiary_uid, cu)`."""
    record: EvictDecision = _new_object(EvictDecision)
    uid_, queue_, reason_, message_, beneficiary_, cu_, move_to_, move_type_ = _EVICT
    uid_(record, workload_uid)
    queue_(record, queue)
    reason_(record, reason)
    message_(record, message)
    beneficiary_(record, beneficiary_uid)
    cu_(record, cu)
    move_to_(record, ())
    move_type_(record, "")
    return record


def pending_reason(code: PendingCode, message: str) -> PendingReason:
    """`PendingReason(code, message)`."""
    record: PendingReason = _new_object(PendingReason)
    code_, message_ = _REASON
    code_(record, code)
    message_(record, message)
    return record
