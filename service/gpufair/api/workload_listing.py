"""ListWorkloads: what gpufair holds, with each pending workload's reason and place in its queue.

The reason of a pending workload is the one the pool's latest stored Schedule cycle gave it (the
cycle stores its reply): "" when no cycle has seen it yet. Bound and running workloads carry where
they are (the Schedule binding; the pods of their open runs as the batch system reported them).

Page tokens are opaque to callers: the sort key of the last row served and a digest of the
filters, base64url-encoded JSON. A token is only good for the filters it was issued under.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

from gpufair.api.convert_workload import workload_to_proto
from gpufair.domain.errors import InvalidInputError, NotFound, Violation
from gpufair.domain.limits import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, MAX_PAGE_TOKEN_LEN
from gpufair.domain.request_rules import name_violations
from gpufair.store import workload_list
from gpufair.store.workload_list import ALL_STATES, DEFAULT_STATES, ListedWorkload, PageKey
from gpufair.v1 import scheduler_pb2 as pb

_STATE_REASONS = {
    "bound": ("bound", "placed by a Schedule decision; waiting for the batch system to start it"),
    "running": ("running", "running"),
}


def _filters_digest(request: pb.ListWorkloadsRequest, states: Sequence[str]) -> str:
    text = json.dumps([request.pool, request.queue, sorted(states)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _encode_token(key: PageKey, filters: str) -> str:
    raw = json.dumps({"k": key.as_list(), "f": filters}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_token(token: str, filters: str) -> PageKey | None:
    """The key of `token`; None if it is not one this listing issued under these filters."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        doc = json.loads(raw)
        pool, queue, pending, neg_priority, submit_us, uid = doc["k"]
        if doc["f"] != filters:
            return None
        key = PageKey(pool, queue, pending, neg_priority, submit_us, uid)
    except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    types_ok = all(
        isinstance(v, str) and "\x00" not in v for v in (key.pool, key.queue, key.uid)
    ) and all(
        isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**63
        for v in (key.pending, key.neg_priority, key.submit_us)
    )
    return key if types_ok else None


def parse_request(
    request: pb.ListWorkloadsRequest,
) -> tuple[tuple[str, ...], int, PageKey | None, str]:
    """(states, page size, where to start, filters digest); INVALID_ARGUMENT naming each bad
    field."""
    violations = name_violations("pool", request.pool, required=False)
    violations += name_violations("queue", request.queue, required=False)
    for i, state in enumerate(request.states):
        if state not in ALL_STATES:
            violations.append(
                Violation(f"states[{i}]", f"{state[:40]!r} is not one of {', '.join(ALL_STATES)}")
            )
    if not 0 <= request.page_size <= MAX_PAGE_SIZE:
        violations.append(
            Violation(
                "page_size",
                f"must be between 1 and {MAX_PAGE_SIZE} (0 = {DEFAULT_PAGE_SIZE}), "
                f"got {request.page_size}",
            )
        )
    states = tuple(sorted(set(request.states))) if request.states else DEFAULT_STATES
    filters = _filters_digest(request, states)
    after = None
    if len(request.page_token) > MAX_PAGE_TOKEN_LEN:
        violations.append(Violation("page_token", f"longer than {MAX_PAGE_TOKEN_LEN} characters"))
    elif request.page_token:
        after = _decode_token(request.page_token, filters)
        if after is None:
            violations.append(
                Violation(
                    "page_token",
                    "not a next_page_token of this listing with these filters "
                    "(pass it back unchanged, with the same pool, queue and states)",
                )
            )
    if violations:
        raise InvalidInputError(violations)
    return states, request.page_size or DEFAULT_PAGE_SIZE, after, filters


def list_workloads(conn: Connection, request: pb.ListWorkloadsRequest) -> pb.ListWorkloadsResponse:
    states, size, after, filters = parse_request(request)
    rows = workload_list.list_page(
        conn,
        pool=request.pool,
        queue=request.queue,
        states=states,
        after=after,
        limit=size + 1,
    )
    if not rows and (request.pool or request.queue):
        # Nothing listed: say so when a filter names nothing there is (as GetUsage and
        # GetFairShareHistory do), rather than an empty list a typo cannot be told from.
        pool_known, queue_known = workload_list.names_known(
            conn, pool=request.pool, queue=request.queue
        )
        if not pool_known:
            raise NotFound("pool", request.pool)
        if not queue_known:
            raise NotFound("queue", request.queue)
    more = len(rows) > size
    rows = rows[:size]
    pending_pools = sorted({r.workload.pool for r in rows if r.state == "pending"})
    reasons: dict[str, tuple[str, str]] = {}
    for reply_bytes in workload_list.latest_cycle_replies(conn, pending_pools).values():
        reply = pb.ScheduleResponse.FromString(reply_bytes)
        reasons.update((p.uid, (p.reason_code, p.message)) for p in reply.pending)
    return pb.ListWorkloadsResponse(
        workloads=[_status(r, reasons) for r in rows],
        next_page_token=_encode_token(rows[-1].key, filters) if more else "",
    )


def _status(row: ListedWorkload, reasons: dict[str, tuple[str, str]]) -> pb.WorkloadStatus:
    if row.state == "pending":
        code, message = reasons.get(
            row.workload.uid, ("", "no Schedule cycle of its pool has considered it yet")
        )
    else:
        code, message = _STATE_REASONS.get(row.state, ("", row.state))
    status = pb.WorkloadStatus(
        workload=workload_to_proto(row.workload),
        state=row.state,
        reason_code=code,
        message=message,
        queue_position=row.position,
        evicting=row.evicting,
    )
    status.state_changed_at.FromDatetime(row.state_changed_at)
    pods: list[dict[str, Any]] = []
    types: list[str] = []
    if row.binding is not None:
        pods = list(row.binding.get("pods", ()))
        types = [row.binding.get("gpu_type", "")]
    for gpu_type, run_pods in row.runs:
        pods += run_pods
        types.append(gpu_type)
    status.gpu_type = ",".join(dict.fromkeys(t for t in types if t))
    for i, p in enumerate(pods):
        pod = status.pods.add(
            pod_index=p.get("pod_index", i),
            node=p["node"],
            gpu_indices=p["gpu_indices"],
            gpu_fraction=p.get("gpu_fraction", 1.0),
        )
        if p.get("partition_start") is not None:  # a partition's first memory slice
            pod.partition_start = p["partition_start"]
    return status
