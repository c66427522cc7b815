"""What every config mutation (ApplyConfig, DeleteObjects, UpsertNodes, SetNodesReady) shares:
its request checks, the optimistic-concurrency check, the deletion rules (and the like rules that
a leaf queue holding work stays a leaf, and a node holding work keeps its pool, its GPU type and
the GPUs it holds) and the write.

Each runs in one transaction under the config lock (api/idempotent.py). A dry run goes through the
very same steps, writes included, and checks the deferred foreign keys before its transaction is
rolled back: it refuses exactly what the real call would, and leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection

from gpufair.domain.config_diff import ChangeAction, ConfigChange
from gpufair.domain.config_scope import MAX_SHOWN, capped
from gpufair.domain.errors import FailedPrecondition, Violation
from gpufair.domain.limits import echo
from gpufair.domain.model import ClusterConfig
from gpufair.domain.request_rules import request_id_violations
from gpufair.store import capacity_repo, config_repo, node_history_repo, workload_repo
from gpufair.store.deletion_guard import (
    refuse_unsafe_deletions,
    work_beyond_gpu_counts,
    work_using,
)
from gpufair.v1 import cluster_pb2 as pb

Mutation = (
    pb.ApplyConfigRequest
    | pb.DeleteObjectsRequest
    | pb.UpsertNodesRequest
    | pb.SetNodesReadyRequest
)


def request_violations(request: Mutation) -> list[Violation]:
    """The checks of the fields every mutation has: `request_id` and `expected_version`."""
    violations = request_id_violations(request.request_id)
    expected = expected_version(request)
    if expected is not None and expected < 0:
        violations.append(Violation("expected_version", f"must be >= 0, got {expected}"))
    return violations


def repeated_violations(path: str, names: Sequence[str]) -> list[Violation]:
    """A violation at each entry of `names` that repeats an earlier one, naming both places.
    A list of objects to delete, flip or prune names each once: a repeat is a caller's slip
    (a list built twice, a copy pasted), said rather than quietly merged."""
    first: dict[str, int] = {}
    out: list[Violation] = []
    for i, name in enumerate(names):
        j = first.setdefault(name, i)
        if j != i:
            out.append(
                Violation(f"{path}[{i}]", f"{echo(name)} is listed twice (also {path}[{j}])")
            )
    return out


def expected_version(request: Mutation) -> int | None:
    if not request.HasField("expected_version"):
        return None
    return request.expected_version


def check_version(conn: Connection, request: Mutation) -> int:
    """The stored config version; FailedPrecondition naming it when the request expected
    another (someone else changed the config since the caller read it)."""
    current = config_repo.config_version(conn)
    expected = expected_version(request)
    if expected is not None and expected != current:
        raise FailedPrecondition(
            f"config version is {current}, not the expected {expected}: the config changed "
            "since it was read. Nothing was changed: read it again and retry."
        )
    return current


def write(
    conn: Connection,
    final: ClusterConfig,
    changes: Sequence[ConfigChange],
    *,
    dry_run: bool,
    now_s: float,
) -> int:
    """Make `changes` (the diff from the stored config to `final`) once the deletion rules
    allow them; returns the config version after them (for a dry run: the current one)."""
    refuse_unsafe_deletions(conn, final, changes)
    refuse_node_moves_under_work(conn, changes)
    refuse_node_shrinks_under_work(conn, changes)
    refuse_new_parents_with_work(conn, final, changes)
    version = config_repo.config_version(conn)
    if not changes:
        return version
    node_history_repo.seed_config(conn)  # each node as it counted until now, if not yet kept
    config_repo.apply_changes(conn, final, changes)
    new_version = config_repo.record_version(conn, changes)
    capacity_repo.lock_changes(conn)
    node_history_repo.record_config(conn, now_s)
    capacity_repo.record_if_changed(conn, now_s, "config")
    if dry_run:
        # What the commit would check, checked now; the caller's transaction is rolled back.
        config_repo.check_constraints_now(conn)
        return version
    return new_version


# A node's fields that its bound and running work depends on: the pool whose cycles count its
# GPUs, and the GPU type its binds and runs are priced in.
_HELD_NODE_FIELDS = frozenset({"pool", "gpu_type"})


def refuse_node_moves_under_work(conn: Connection, changes: Sequence[ConfigChange]) -> None:
    """Raise FailedPrecondition when a node that bound or running work uses would change pool or
    GPU type. Moved to another pool, the GPUs its work holds would look free to that pool's
    cycles (and be handed out twice), and the work's own reports would name a node outside its
    pool; as with a deletion, that work must stop or be cancelled first."""
    moved = {
        c.name
        for c in changes
        if c.kind == "node"
        and c.action is ChangeAction.UPDATE
        and any(f.field in _HELD_NODE_FIELDS for f in c.fields)
    }
    if not moved:
        return
    in_use = work_using(conn, {"node": moved})
    if in_use:
        held = sorted({line.rsplit(" ", 1)[-1] for line in in_use})
        raise FailedPrecondition(
            f"cannot change the pool or GPU type of node {', '.join(held)}. In use: "
            f"{capped(in_use)}. Work placed on a node keeps it as it was placed: it must stop "
            "or be cancelled first. Nothing was changed."
        )


def refuse_node_shrinks_under_work(conn: Connection, changes: Sequence[ConfigChange]) -> None:
    """Raise FailedPrecondition when a node's `gpu_count` would shrink below a GPU that bound or
    running work holds there: a GPU index at or past the new count. The cycle counts a pod's
    GPUs by index and drops those the node no longer has: with work on GPUs 6-7 of a node shrunk
    from 8 to 4, it saw 4 free GPUs and bound them, 6 GPUs of work on 4. A shrink that leaves
    every held GPU (work on GPUs 0-1 of a node going from 8 to 2) is made."""
    shrunk = {
        c.name: int(f.after)
        for c in changes
        if c.kind == "node" and c.action is ChangeAction.UPDATE
        for f in c.fields
        if f.field == "gpu_count" and int(f.after) < int(f.before)
    }
    if not shrunk:
        return
    held_gpus = work_beyond_gpu_counts(conn, shrunk)
    if held_gpus:
        in_use = [
            f"{h.state} workload {h.uid} uses GPU {h.gpu} of node {h.node}" for h in held_gpus
        ]
        held = sorted({h.node for h in held_gpus})
        counts = ", ".join(
            f"{name} to {shrunk[name]} GPU{'' if shrunk[name] == 1 else 's'}" for name in held
        )
        raise FailedPrecondition(
            f"cannot shrink node {counts}. In use: {capped(in_use)}. Work placed on a node "
            "keeps the GPUs it was placed on: it must stop or be cancelled first. "
            "Nothing was changed."
        )


def refuse_new_parents_with_work(
    conn: Connection, final: ClusterConfig, changes: Sequence[ConfigChange]
) -> None:
    """Raise FailedPrecondition when `final` gives children to a stored leaf queue that holds
    bound or running work. Only leaves hold work (fair shares count allocations at the leaves):
    as a parent, its work's GPUs would count in no share, and its department could hand them
    out again. Like a deletion in use, it waits until that work stops or is cancelled."""
    if not any(c.kind == "queue" for c in changes):
        return  # no queue changes: no new parent (the node RPCs pay nothing)
    parents = {q.parent for q in final.queues if q.parent}
    new = sorted(parents - config_repo.parent_queue_names(conn))
    if not new:
        return
    in_use = workload_repo.active_in_queues(conn, new, MAX_SHOWN + 1)
    if in_use:
        held = sorted({queue for _, _, queue in in_use})
        lines = [f"{state} workload {uid} uses queue {queue}" for state, uid, queue in in_use]
        raise FailedPrecondition(
            f"cannot make queue {', '.join(held)} a parent. In use: {capped(lines)}. "
            "Only leaf queues hold work: it must stop or be cancelled first. Nothing was changed."
        )
