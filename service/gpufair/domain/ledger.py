"""Ledger events and what ran, derived from them (DESIGN §5). Pure: no clock, no database.

The batch system is the source of truth: usage comes from its `started` and stop events with its
own timestamps, never from gpufair's decisions. A workload's runs are derived from all of its
events sorted by `occurred_at` (ties: starts before stops, then event id), so events may arrive in
any order and the same set of events always yields the same runs.

Pairing rules:
- `started` opens a run, unless one is open already (a repeated start is ignored).
- `stopped`, `preempted`, `failed` and `stale` close the open run at their instant; with no run
  open they are orphans and change nothing (a stop that arrived before its start is kept, and
  pairs once the start arrives, as long as it is not earlier than that start).
- `stale` is written by the sweeper when heartbeats stop: the run ends at its last sign of life.
- A `stale` close is void when the workload showed a sign of life after it: given the instant of
  its latest heartbeat (`alive_at_s`), a `stale` earlier than that closes nothing, and the run
  goes on (it ran through the silence: a cut-off batch system came back and still reports it).
  Unless a `started` lies between the two (after the stale, not after the heartbeat): that
  heartbeat may be the new start's, so the close stands, as it did before a start re-opened the
  workload. Real stops keep their meaning whatever comes after them. Only the latest heartbeat
  is needed, the one retention keeps; a `stale` at it or after it (the sweeper's close of a run
  silent again) stands.
- A later stop is a sign of life too: a `stale` close followed by a later end (a real stop, or
  the sweeper's close at a later heartbeat) with no start in between is void, and the run ends
  at that end. So a stop reported after the sweep ends the run where it would have ended had it
  come before, and a restart after it (whose start lies before the latest heartbeat) leaves that
  end where it is.
"""

from __future__ import annotations

import enum
import math
import re
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from gpufair.domain import limits
from gpufair.domain.model import GpuType, Node


class EventKind(enum.StrEnum):
    STARTED = "started"
    STOPPED = "stopped"
    HEARTBEAT = "heartbeat"
    PREEMPTED = "preempted"
    FAILED = "failed"
    NODE_CAPACITY = "node_capacity"
    STALE = "stale"  # internal: written by the stale-allocation sweeper


# The kinds the checks made once per event compare with, as module names: reading a member off
# the enum class costs a lookup through its metaclass, measured at 150-200 ns on Python 3.11
# against about 30 for a global, and ingestion makes several such checks per event.
_STARTED, _STALE, _NODE_CAPACITY = EventKind.STARTED, EventKind.STALE, EventKind.NODE_CAPACITY

END_KINDS = frozenset({EventKind.STOPPED, EventKind.PREEMPTED, EventKind.FAILED, EventKind.STALE})
RUN_KINDS = END_KINDS | {EventKind.STARTED}

# How far ahead of the server's clock an event may claim to have happened (clock skew).
MAX_FUTURE_SKEW_S = 300.0
# Events older than this are refused: their usage would fall before any retained history.
MAX_AGE_S = 400 * 86400.0
# Namespace of the ids the sweeper gives its `stale` events: one per close (`stale_event_id`).
STALE_NAMESPACE = uuid.UUID("3f0d6f0e-8a53-4b5e-9d7c-6a2f2c1e9b41")


class WorkloadState(enum.StrEnum):
    PENDING = "pending"  # waiting for a placement
    BOUND = "bound"  # placed by a Schedule decision, not yet confirmed by a `started` event
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class EventPod:
    node: str
    gpu_indices: tuple[int, ...]
    gpu_fraction: float = 1.0  # share of each listed GPU; below 1 for shared GPUs
    partition_start: int | None = None  # a partition's first slice (`model.PodBinding`)

    @property
    def gpus(self) -> float:
        return len(self.gpu_indices) * self.gpu_fraction


class LedgerEvent(NamedTuple):
    """One reported fact. A named tuple rather than a frozen dataclass: ingestion makes one or two
    per event, tens of thousands a second, and a tuple is several times cheaper to build."""

    event_id: str
    kind: EventKind
    occurred_at_s: float
    workload_uid: str = ""
    pods: tuple[EventPod, ...] = ()
    node: str = ""  # node_capacity events
    gpu_count: int = 0  # node_capacity events: usable GPUs from now on


@dataclass(frozen=True, slots=True)
class Run:
    """One stretch of a workload on its pods, from a `started` event to the stop that ended it."""

    start_event_id: str
    started_at_s: float
    pods: tuple[EventPod, ...]
    ended_at_s: float | None = None
    end_kind: EventKind | None = None


@dataclass(frozen=True, slots=True)
class IntervalRow:
    """A run's share on one GPU type: what the ledger integrates into usage."""

    start_event_id: str
    gpu_type: str
    gpus: float
    cu: float
    started_at_s: float
    ended_at_s: float | None
    end_kind: EventKind | None
    pods: tuple[EventPod, ...]


def _order(event: LedgerEvent) -> tuple[float, int, str]:
    return (event.occurred_at_s, 0 if event.kind is _STARTED else 1, event.event_id)


def derive_runs(events: Iterable[LedgerEvent], alive_at_s: float | None = None) -> list[Run]:
    """A workload's runs from its start and stop events, in any arrival order; `alive_at_s`: the
    instant of its latest heartbeat, if it has one (it voids earlier `stale` closes)."""
    runs: list[Run] = []
    opened: LedgerEvent | None = None  # the start of the open run
    ordered = sorted((e for e in events if e.kind in RUN_KINDS), key=_order)
    for i, event in enumerate(ordered):
        if event.kind is _STARTED:
            if opened is None:
                opened = event
        elif opened is not None:
            if event.kind is _STALE and _void_close(i, ordered, alive_at_s):
                continue
            runs.append(
                Run(
                    opened.event_id,
                    opened.occurred_at_s,
                    opened.pods,
                    event.occurred_at_s,
                    event.kind,
                )
            )
            opened = None
    if opened is not None:
        runs.append(Run(opened.event_id, opened.occurred_at_s, opened.pods))
    return runs


def _void_close(position: int, ordered: Sequence[LedgerEvent], alive_at_s: float | None) -> bool:
    """Whether the `stale` at `position` of `ordered` (the run events in order) is void: a later
    stop, or a heartbeat later than it, and no start in between (see the module's docstring)."""
    stale_s = ordered[position].occurred_at_s
    for later in ordered[position + 1 :]:
        if later.kind is _STARTED:
            break
        if later.occurred_at_s > stale_s:
            return True  # a stop (or the sweeper's close at a later heartbeat): alive till then
    if alive_at_s is None or alive_at_s <= stale_s:
        return False
    return not any(stale_s < e.occurred_at_s <= alive_at_s for e in ordered if e.kind is _STARTED)


def state_after(
    runs: Sequence[Run], current: WorkloadState, cancelled: bool = False
) -> WorkloadState:
    """The workload state that its runs imply, given the state it has now and whether it was
    ever cancelled: a cancelled workload the batch system started all the same runs until its
    run ends, then is cancelled again, whichever messages its events came in (never pending
    again after a preemption, to be scheduled anew)."""
    if runs and runs[-1].ended_at_s is None:
        return WorkloadState.RUNNING
    if cancelled or current is WorkloadState.CANCELLED:
        return WorkloadState.CANCELLED
    if not runs:
        return current
    if runs[-1].end_kind is EventKind.PREEMPTED:
        return WorkloadState.PENDING  # requeued by the batch system under the same uid
    return WorkloadState.FINISHED


def interval_rows(
    runs: Iterable[Run], nodes: Mapping[str, Node], gpu_types: Mapping[str, GpuType]
) -> list[IntervalRow]:
    """Each run split by GPU type, in GPUs and CU (a gang should not mix types, but if the batch
    system ran one that did, each type is counted at its own weight)."""
    rows: list[IntervalRow] = []
    for run in runs:
        types = {node.gpu_type if (node := nodes.get(p.node)) else "" for p in run.pods}
        if len(types) == 1:  # as it should be; grouping and sorting change nothing then
            groups: Iterable[tuple[str, Sequence[EventPod]]] = [(types.pop(), run.pods)]
        else:
            by_type: dict[str, list[EventPod]] = defaultdict(list)
            for pod in run.pods:
                node = nodes.get(pod.node)
                by_type[node.gpu_type if node else ""].append(pod)
            groups = sorted(by_type.items())
        for type_name, pods in groups:
            gpus = math.fsum(p.gpus for p in pods) if len(pods) > 1 else float(pods[0].gpus)
            weight = gpu_types[type_name].compute_weight if type_name in gpu_types else 0.0
            rows.append(
                IntervalRow(
                    run.start_event_id,
                    type_name,
                    gpus,
                    gpus * weight,
                    run.started_at_s,
                    run.ended_at_s,
                    run.end_kind,
                    tuple(pods),
                )
            )
    return rows


def stale_event_id(start_event_id: str, alive_at_s: float) -> str:
    """The id of the sweeper's close of the run started by `start_event_id`, silent since
    `alive_at_s`: one per close, not per run. Sweeping the same silence twice gives one id (the
    second is a replay); a run revived by a later heartbeat and silent again gets a new close.
    The instant enters in whole microseconds, as stored. Closes stored when the id named the run
    alone (`uuid5(STALE_NAMESPACE, start_event_id)`) stay valid: the rule that voids a close
    reads its instant, not its id."""
    return str(uuid.uuid5(STALE_NAMESPACE, f"{start_event_id}@{round(alive_at_s * 1e6)}"))


@dataclass(frozen=True, slots=True)
class WorkloadRef:
    """What event validation needs to know of a workload."""

    uid: str
    queue: str
    pool: str


# The form PostgreSQL prints and most clients send: recognised without building a UUID object.
CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")


def canonical_event_id(event_id: str) -> str | None:
    """The event id in PostgreSQL's text form (lowercase, hyphenated), or None if it is not a
    UUID. Replays are recognised by this form, so `{...}` or upper case is the same event."""
    if CANONICAL_UUID.match(event_id):
        return event_id
    try:
        return str(uuid.UUID(event_id))
    except ValueError:
        return None


def event_problem(
    event: LedgerEvent,
    *,
    now_s: float,
    workload: WorkloadRef | None,
    nodes: Mapping[str, Node],
) -> str | None:
    """Why `event` cannot be stored, or None. Checks only the event itself and the config:
    none depends on the workload's other events, which may arrive in any order."""
    return static_problem(event, now_s=now_s) or context_problem(
        event, workload=workload, nodes=nodes
    )


def static_problem(event: LedgerEvent, *, now_s: float) -> str | None:
    """The first checks of `event_problem`: those that need nothing but the event and the clock,
    so ingestion can make them before it has a database connection."""
    if canonical_event_id(event.event_id) is None:
        return f"event_id {event.event_id[:80]!r} is not a UUID"
    return static_problem_of_uuid(event, now_s=now_s)


def static_problem_of_uuid(event: LedgerEvent, *, now_s: float) -> str | None:
    """`static_problem` of an event whose id the caller found to be a UUID already."""
    at = event.occurred_at_s
    if not math.isfinite(at) or at <= 0:
        return "occurred_at is missing"
    if at > now_s + MAX_FUTURE_SKEW_S:
        ahead = at - now_s
        return f"occurred_at is {ahead:.0f} s in the future (more than {MAX_FUTURE_SKEW_S:.0f} s of clock skew)"
    if at < now_s - MAX_AGE_S:
        return f"occurred_at is more than {MAX_AGE_S / 86400:.0f} days in the past"
    kind = event.kind
    if kind is _STALE:
        return "stale events are written by gpufair itself"
    # Each kind carries its own fields: a value in another kind's field would be stored in the
    # payload and meant nothing (a node report's uid, a heartbeat's GPU count).
    if kind is _NODE_CAPACITY:
        if event.workload_uid or event.pods:
            return "a node_capacity event names its node and gpu_count, no workload_uid or pods"
    elif event.node or event.gpu_count:
        return f"node and gpu_count belong on node_capacity events, not {kind.value}"
    # PostgreSQL can store no NUL character in text, nor as \u0000 in JSON: caught here (with
    # the other control characters and over-long strings, domain/limits.py), the event is
    # refused alone instead of failing its whole batch.
    # Each string is looked at once in C (length, isprintable); only a suspect one is examined.
    uid, node = event.workload_uid, event.node
    if len(uid) > limits.MAX_UID_LEN or not uid.isprintable():
        problem = _text_problem("workload_uid", uid, limits.MAX_UID_LEN)
        if problem:
            return problem
    if len(node) > limits.MAX_NODE_NAME_LEN or not node.isprintable():
        problem = _text_problem("node", node, limits.MAX_NODE_NAME_LEN)
        if problem:
            return problem
    pods = event.pods
    if len(pods) > limits.MAX_PODS:
        return f"pods: more than {limits.MAX_PODS}"
    for pod in pods:
        name = pod.node
        if len(name) > limits.MAX_NODE_NAME_LEN or not name.isprintable():
            problem = _text_problem(f"pods[{pods.index(pod)}].node", name, limits.MAX_NODE_NAME_LEN)
            if problem:
                return problem
        if len(pod.gpu_indices) > limits.MAX_GPUS_PER_NODE:
            return f"pods[{pods.index(pod)}].gpu_indices: more than {limits.MAX_GPUS_PER_NODE}"
    return None


def _text_problem(path: str, value: str, max_len: int) -> str | None:
    found = limits.text_violations(path, value, max_len)
    return f"{found[0].field_path} {found[0].message}" if found else None


def context_problem(
    event: LedgerEvent, *, workload: WorkloadRef | None, nodes: Mapping[str, Node]
) -> str | None:
    """The rest of `event_problem`, for an event that passed `static_problem`: what depends on
    the workload and the nodes."""
    if event.kind is _NODE_CAPACITY:
        if event.node not in nodes:
            return f"unknown node {event.node[:80]!r}"
        if not 0 <= event.gpu_count <= nodes[event.node].gpu_count:
            return f"gpu_count must be between 0 and the node's {nodes[event.node].gpu_count} GPUs"
        return None
    problem = sign_of_life_problem(event, known=workload is not None)
    if problem or workload is None or event.kind is not _STARTED:
        return problem
    return _pods_problem(event.pods, workload, nodes)


def sign_of_life_problem(event: LedgerEvent, *, known: bool) -> str | None:
    """`context_problem` of an event that needs nothing of its workload but that it exists
    (a heartbeat; the first checks of every workload event)."""
    if not event.workload_uid:
        return "workload_uid is required"
    if not known:
        return f"unknown workload {event.workload_uid[:80]!r}"
    if event.pods and event.kind is not _STARTED:
        return f"pods belong on started events, not {event.kind.value}"
    return None


def _pods_problem(
    pods: Sequence[EventPod], workload: WorkloadRef, nodes: Mapping[str, Node]
) -> str | None:
    if not pods:
        return "a started event needs the pods it runs on"
    for i, pod in enumerate(pods):
        node = nodes.get(pod.node)
        if node is None:
            return f"pods[{i}]: unknown node {pod.node[:80]!r}"
        if node.pool != workload.pool:
            return f"pods[{i}]: node {pod.node} is in pool {node.pool}, the workload in {workload.pool}"
        if pod.gpu_fraction == 0 and pod.partition_start is not None:
            # Unset, it would read as a whole GPU: a 3g.40gb counted 7/3 of what it holds.
            return f"pods[{i}]: a partition's gpu_fraction is required (its share of the GPU)"
        if not math.isfinite(pod.gpu_fraction) or not 0 < pod.gpu_fraction <= 1:
            return f"pods[{i}]: gpu_fraction must be in (0, 1]"
        if pod.gpu_fraction < 1 and len(pod.gpu_indices) != 1:
            return f"pods[{i}]: a GPU fraction is of exactly one GPU"
        if len(set(pod.gpu_indices)) != len(pod.gpu_indices):
            return f"pods[{i}]: a GPU index is listed twice"
        if pod.partition_start is not None and (
            not 0 <= pod.partition_start < limits.MAX_MEMORY_SLICES or len(pod.gpu_indices) != 1
        ):
            return (
                f"pods[{i}]: partition_start must be in [0, {limits.MAX_MEMORY_SLICES - 1}], "
                "on exactly one GPU"
            )
        bad = [g for g in pod.gpu_indices if not 0 <= g < node.gpu_count]
        if bad:
            return f"pods[{i}]: GPU index {bad[0]} does not exist on {pod.node} ({node.gpu_count} GPUs)"
    return None
