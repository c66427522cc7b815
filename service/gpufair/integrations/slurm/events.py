"""Ledger events for what Slurm ran, with ids a restarted bridge derives again (pure).

An event's id is uuid5 of (uid, Slurm's restart count, what happened), and its time is Slurm's
own (start and end times), or the time the bridge stamped into the job's Comment just before it
requeued the job. So a bridge that sends an event twice, across a crash or a restart, sends the
same id with the same payload, and gpufair stores it once (a duplicate).

A run is one start of the job: run n is the start after n requeues (`restart_cnt` = n).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from typing import TypeAlias

from gpufair.v1 import ledger_pb2, scheduler_pb2

# The namespace of this bridge's event ids (any fixed UUID serves; this one is uuid5 of the name).
EVENT_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "gpufair:slurm-bridge:events")
_STAMP_RE = re.compile(r"gpufair: requeued run (\d+) at (\d+(?:\.\d+)?)")

Kind: TypeAlias = ledger_pb2.EventKind.ValueType


def event_id(uid: str, run: int, what: str) -> str:
    return str(uuid.uuid5(EVENT_NAMESPACE, f"{uid}/{run}/{what}"))


def _event(uid: str, run: int, what: str, kind: Kind, at_s: float) -> ledger_pb2.LedgerEvent:
    event = ledger_pb2.LedgerEvent(event_id=event_id(uid, run, what), workload_uid=uid, kind=kind)
    # Whole microseconds (PostgreSQL's resolution): a time parsed back from a Comment stamp
    # gives the very same timestamp, so the resent event's payload is identical.
    event.occurred_at.FromMicroseconds(round(at_s * 1e6))
    return event


def started(
    uid: str,
    run: int,
    at_s: float,
    nodes: Sequence[str],
    gpu_indices: Sequence[Sequence[int]],
) -> ledger_pb2.LedgerEvent:
    """Run `run` started at `at_s` on `nodes`, with the GPU indices Slurm gave on each."""
    event = _event(uid, run, "started", ledger_pb2.EVENT_KIND_STARTED, at_s)
    for node, indices in zip(nodes, gpu_indices, strict=True):
        event.pods.add(node=node, gpu_indices=list(indices), gpu_fraction=1.0)
    return event


def started_from_binding(
    uid: str, run: int, at_s: float, pods: Sequence[scheduler_pb2.PodBinding]
) -> ledger_pb2.LedgerEvent:
    """A start whose GPU indices Slurm no longer shows (it already ended): gpufair's binding."""
    return started(uid, run, at_s, [p.node for p in pods], [list(p.gpu_indices) for p in pods])


def ended(uid: str, run: int, at_s: float, kind: Kind) -> ledger_pb2.LedgerEvent:
    """Run `run` ended: stopped, failed or preempted (the kind names the event's id too)."""
    what = ledger_pb2.EventKind.Name(kind).removeprefix("EVENT_KIND_").lower()
    return _event(uid, run, what, kind, at_s)


def heartbeat(
    uid: str, run: int, started_s: float, now_s: float, period_s: float
) -> ledger_pb2.LedgerEvent:
    """A heartbeat, one per period of the run: its time is the period's start (never before the
    run's start), so a resend within the period is a duplicate."""
    bucket = int(now_s // period_s)
    at_s = max(float(started_s), bucket * period_s)
    return _event(uid, run, f"heartbeat-{bucket}", ledger_pb2.EVENT_KIND_HEARTBEAT, at_s)


def heartbeat_due(started_s: float, now_s: float, period_s: float, cycle_s: float) -> bool:
    """Whether a cycle at `now_s` sends a running job's heartbeat: after its first period, and
    only in each period's first two cycles (a resend is a duplicate; a missed one only delays the
    stale sweeper's view by a period)."""
    return now_s - started_s >= period_s and now_s % period_s < 2 * cycle_s


def requeue_stamp(run: int, at_s: float) -> str:
    """The Comment written just before the bridge requeues run `run`."""
    return f"gpufair: requeued run {run} at {at_s:.3f}"


def stamped_requeue_s(comment: str, run: int) -> float | None:
    """When the bridge requeued run `run`, if the Comment says so."""
    match = _STAMP_RE.search(comment)
    if match is None or int(match.group(1)) != run:
        return None
    return float(match.group(2))
