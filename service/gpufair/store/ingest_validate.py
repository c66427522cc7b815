"""The checks of a batch that need the database's answers (`ingest_pipeline`): each event
against the workloads and nodes `_read_context` read, after `prepare`'s checks, which need
none. What fails is rejected; the rest goes on to the COPY, in order. None depends on the order
events arrive in (`_validate`).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpufair.domain.ledger import (
    RUN_KINDS,
    EventKind,
    context_problem,
    event_problem,
    sign_of_life_problem,
)
from gpufair.domain.model import Node
from gpufair.store.ingest_batch import _POSITION, Candidate, PreparedBatch
from gpufair.store.ingest_context import _Context

PURGED = "the workload's events were removed by retention: its runs can no longer change"


def _validate(batch: PreparedBatch, ctx: _Context) -> list[Candidate]:
    """The checks that need the workloads and nodes; rejects what fails them, returns the rest,
    in order. None depends on the order events arrive in: a stop earlier than every start
    stored so far is stored like any other, and pairs with an earlier start whenever that
    arrives (DESIGN §5, out-of-order arrival).

    A heartbeat with no pods of a workload that exists and has no run event in the batch
    passes, nearly every event of a working cluster: when every plain heartbeat's workload
    (`batch.plain_uids`, looked at as a set) is such a one, only the other events are judged
    one by one; else all of them, as a message that starts and ends the runs it beats for
    needs anyway."""
    plain, candidates, workloads = batch.plain_uids, batch.candidates, ctx.workloads
    if "" in plain or not plain.isdisjoint(workloads) or not plain.isdisjoint(ctx.missing):
        return _validate_each(batch, ctx, candidates)
    check = batch.not_plain()
    passed = _validate_each(batch, ctx, check)
    if len(passed) == len(check):
        return candidates
    refused = set(map(_POSITION, check)) - set(map(_POSITION, passed))
    return [c for c in candidates if c.position not in refused]


def _validate_each(
    batch: PreparedBatch, ctx: _Context, candidates: Sequence[Candidate]
) -> list[Candidate]:
    """`_validate` of `candidates`, one by one."""
    outcomes, workloads, missing, nodes = batch.outcomes, ctx.workloads, ctx.missing, ctx.nodes
    then = ctx.declared_then  # empty but for node capacity reports
    # The enum's members read once, not once per event (see domain/ledger.py).
    heartbeat, stale = EventKind.HEARTBEAT, EventKind.STALE
    valid: list[Candidate] = []
    for c in candidates:
        event = c.event
        kind, uid = event.kind, event.workload_uid
        if kind is heartbeat and uid not in workloads:
            # What `sign_of_life_problem` accepts, nearly every heartbeat, without the call.
            if uid and uid not in missing and not event.pods:
                valid.append(c)
                continue
            problem = sign_of_life_problem(event, known=uid not in missing)
            if problem:
                outcomes.reject(c.position, problem)
            else:
                valid.append(c)
            continue
        ref = workloads.get(uid)
        if batch.internal and kind is stale:
            problem = (
                None
                if ref is not None
                else event_problem(event, now_s=batch.now_s, workload=None, nodes=nodes)
            )
        else:
            problem = context_problem(event, workload=ref[0] if ref else None, nodes=nodes)
            if then and kind is EventKind.NODE_CAPACITY:
                key = (event.node, event.occurred_at_s)
                if key in then:  # its node as configured just before its instant, not as now
                    problem = context_problem(
                        event, workload=None, nodes=_node_then(event.node, then[key])
                    )
        if not problem and kind in RUN_KINDS and uid in ctx.purged:
            problem = PURGED  # a heartbeat changes no run: it is stored, as it would be alone
        if problem:
            outcomes.reject(c.position, problem)
        else:
            valid.append(c)
    return valid


def _node_then(name: str, declared: int | None) -> dict[str, Node]:
    """The nodes `context_problem` judges a report of `name` by, as configured just before its
    instant (`declared` GPUs; None: not configured then): its answers, in time or late."""
    if declared is None:
        return {}
    return {name: Node(name, "", "", declared, 0, 0)}  # only its GPU count is read
