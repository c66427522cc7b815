"""Workloads: submission (idempotent by uid), cancellation, and reading them back."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, select, text, update

from gpufair.domain.ledger import WorkloadRef, WorkloadState
from gpufair.domain.model import TopologyConstraint, Workload
from gpufair.store.ledger_tables import workloads


def spec_json(w: Workload) -> dict[str, Any]:
    """A workload as stored. Fields added later are written only when set, so the spec (and
    `spec_digest`) of a workload that does not use them is what it always was."""
    spec: dict[str, Any] = {
        "uid": w.uid,
        "queue": w.queue,
        "pool": w.pool,
        "pods": w.pods,
        "gpus_per_pod": w.gpus_per_pod,
        "submit_time_s": w.submit_time_s,
        "min_pods": w.min_pods,
        "allowed_gpu_types": list(w.allowed_gpu_types),
        "min_gpu_memory_gib": w.min_gpu_memory_gib,
        "cpu_millicores_per_pod": w.cpu_millicores_per_pod,
        "memory_mib_per_pod": w.memory_mib_per_pod,
        "topology": None
        if w.topology is None
        else {"level": w.topology.level, "required": w.topology.required},
        "priority_class": w.priority_class,
        "preemptible": w.preemptible,
        "min_runtime_s": w.min_runtime_s,
    }
    if w.partition_profile:
        spec["partition_profile"] = w.partition_profile
    if w.compute_units:
        spec["compute_units"] = w.compute_units
    if w.mixed_gpu_types:
        spec["mixed_gpu_types"] = True
    if w.pods_on_distinct_nodes:  # only when set: other specs and their digests are unchanged
        spec["pods_on_distinct_nodes"] = True
    return spec


def workload_from_json(spec: dict[str, Any]) -> Workload:
    topology = spec.get("topology")
    return Workload(
        uid=spec["uid"],
        queue=spec["queue"],
        pool=spec["pool"],
        pods=spec["pods"],
        gpus_per_pod=spec["gpus_per_pod"],
        submit_time_s=spec["submit_time_s"],
        min_pods=spec.get("min_pods"),
        allowed_gpu_types=tuple(spec.get("allowed_gpu_types", ())),
        min_gpu_memory_gib=spec.get("min_gpu_memory_gib", 0.0),
        cpu_millicores_per_pod=spec.get("cpu_millicores_per_pod", 0),
        memory_mib_per_pod=spec.get("memory_mib_per_pod", 0),
        topology=None if topology is None else TopologyConstraint(**topology),
        priority_class=spec.get("priority_class", 0),
        preemptible=spec.get("preemptible", True),
        min_runtime_s=spec.get("min_runtime_s", 0.0),
        partition_profile=spec.get("partition_profile", ""),
        compute_units=spec.get("compute_units", 0.0),
        mixed_gpu_types=spec.get("mixed_gpu_types", False),
        pods_on_distinct_nodes=spec.get("pods_on_distinct_nodes", False),
    )


def spec_digest(w: Workload) -> str:
    """Identity of a submission, ignoring the submit time a client may leave to the server."""
    spec = spec_json(w)
    spec.pop("submit_time_s")
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class SubmitOutcome:
    uid: str
    accepted: bool
    error: str = ""


def submit(conn: Connection, batch: Sequence[Workload]) -> list[SubmitOutcome]:
    """Insert new workloads; a known uid with the same spec is accepted as a no-op, with another
    spec refused (a uid names one workload for good)."""
    if not batch:
        return []
    digests = {w.uid: spec_digest(w) for w in batch}
    # Rows go in in uid order: two batches sharing uids wait for each other at the first uid
    # they share; in opposite orders each could hold a uid the other waits for (a deadlock,
    # one of them aborted).
    rows = [
        {
            "uid": w.uid,
            "queue": w.queue,
            "pool": w.pool,
            "spec": json.dumps(spec_json(w)),
            "digest": digests[w.uid],
            "submit_time": datetime.fromtimestamp(w.submit_time_s, UTC),
        }
        for w in sorted(batch, key=lambda w: w.uid)
    ]
    inserted = {
        r[0]
        for r in conn.execute(
            text(
                """
                INSERT INTO workloads (uid, queue, pool, state, spec, spec_digest, submit_time)
                SELECT r.uid, r.queue, r.pool, 'pending', r.spec::jsonb, r.digest, r.submit_time
                FROM jsonb_to_recordset(CAST(:rows AS jsonb))
                     AS r(uid text, queue text, pool text, spec text, digest text,
                          submit_time timestamptz)
                ON CONFLICT (uid) DO NOTHING
                RETURNING uid
                """
            ),
            {"rows": json.dumps(rows, default=str)},
        )
    }
    existing = {}
    if len(inserted) < len(batch):
        existing = dict(
            conn.execute(
                select(workloads.c.uid, workloads.c.spec_digest).where(
                    workloads.c.uid.in_([w.uid for w in batch if w.uid not in inserted])
                )
            ).all()
        )
    outcomes = []
    for w in batch:
        if w.uid in inserted or existing.get(w.uid) == digests[w.uid]:
            outcomes.append(SubmitOutcome(w.uid, True))
        else:
            outcomes.append(
                SubmitOutcome(w.uid, False, "uid already submitted with a different spec")
            )
    return outcomes


def refs(conn: Connection, uids: Iterable[str]) -> dict[str, WorkloadRef]:
    wanted = list(set(uids))
    if not wanted:
        return {}
    rows = conn.execute(
        select(workloads.c.uid, workloads.c.queue, workloads.c.pool).where(
            workloads.c.uid.in_(wanted)
        )
    )
    return {r.uid: WorkloadRef(r.uid, r.queue, r.pool) for r in rows}


def get(conn: Connection, uid: str) -> tuple[Workload, WorkloadState] | None:
    row = conn.execute(
        select(workloads.c.spec, workloads.c.state).where(workloads.c.uid == uid)
    ).one_or_none()
    if row is None:
        return None
    return workload_from_json(row.spec), WorkloadState(row.state)


def cancel(conn: Connection, uid: str) -> WorkloadState | None:
    """Cancel `uid`; returns the state it had, None if unknown. A running workload keeps its GPUs
    (and its usage counts) until the batch system reports it stopped."""
    row = conn.execute(
        select(workloads.c.state).where(workloads.c.uid == uid).with_for_update()
    ).one_or_none()
    if row is None:
        return None
    before = WorkloadState(row.state)
    if before in (WorkloadState.PENDING, WorkloadState.BOUND):
        conn.execute(
            update(workloads)
            .where(workloads.c.uid == uid)
            .values(
                state=WorkloadState.CANCELLED.value,
                binding=None,
                state_changed_at=text("now()"),
                cancelled_at=text("now()"),
            )
        )
    return before


def active_in_queues(
    conn: Connection, queues: Sequence[str], limit: int
) -> list[tuple[str, str, str]]:
    """Up to `limit` bound or running workloads of `queues`, by uid: (state, uid, queue)."""
    rows = conn.execute(
        select(workloads.c.uid, workloads.c.queue, workloads.c.state)
        .where(
            workloads.c.queue.in_(list(queues)),
            workloads.c.state.in_([WorkloadState.BOUND.value, WorkloadState.RUNNING.value]),
        )
        .order_by(workloads.c.uid)
        .limit(limit)
    )
    return [(r.state, r.uid, r.queue) for r in rows]


class SpecCache:
    """Parsed workload specs by (uid, spec digest). Parsing 25,000 JSON specs is most of what a
    snapshot costs; a spec never changes under its digest, so an entry cannot go stale, and the
    state of every workload is still read fresh each cycle. Bounded: past `limit` it starts over.
    """

    def __init__(self, limit: int = 200_000) -> None:
        self.limit = limit
        self._specs: dict[tuple[str, str], Workload] = {}

    def workloads(self, conn: Connection, keys: Sequence[tuple[str, str]]) -> list[Workload]:
        # RPC threads share the cache: this call fills and reads one dict of its own choosing, so
        # another call starting over meanwhile cannot take the entries it just loaded.
        specs = self._specs
        missing = [key[0] for key in keys if key not in specs]
        if missing:
            if len(specs) + len(missing) > self.limit:
                specs = {}
            for r in conn.execute(
                text("SELECT uid, spec_digest, spec FROM workloads WHERE uid = ANY(:uids)"),
                {"uids": missing},
            ):
                specs[(r.uid, r.spec_digest)] = workload_from_json(r.spec)
            self._specs = specs
        return [specs[key] for key in keys]


SPECS = SpecCache()


def workloads_in_states(conn: Connection, pool: str, states: Sequence[str]) -> list[Workload]:
    """The pool's workloads in `states`, oldest submission first, specs from the cache."""
    keys = [
        (r.uid, r.spec_digest)
        for r in conn.execute(
            text(
                "SELECT uid, spec_digest FROM workloads WHERE pool = :pool "
                "AND state = ANY(:states) ORDER BY submit_time, uid"
            ),
            {"pool": pool, "states": list(states)},
        )
    ]
    return SPECS.workloads(conn, keys)


def last_change_s(conn: Connection, pool: str) -> float | None:
    """When a workload of `pool` was last submitted or changed state (POSIX seconds); None when
    the pool has none."""
    value = conn.execute(
        text(
            "SELECT extract(epoch FROM max(GREATEST(created_at, state_changed_at)))::float8 "
            "FROM workloads WHERE pool = :pool"
        ),
        {"pool": pool},
    ).scalar_one()
    return None if value is None else float(value)


def held_gpus(conn: Connection, pool: str) -> list[tuple[str, str, float]]:
    """(queue, GPU type, GPUs) of what runs in `pool` now: its open allocation intervals."""
    return [
        (r.queue, r.gpu_type, float(r.gpus))
        for r in conn.execute(
            text(
                "SELECT queue, gpu_type, sum(gpus) AS gpus FROM allocation_intervals "
                "WHERE pool = :pool AND ended_at IS NULL GROUP BY queue, gpu_type "
                "ORDER BY queue, gpu_type"
            ),
            {"pool": pool},
        )
    ]
