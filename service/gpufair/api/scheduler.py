"""Scheduler: workload submission and cancellation; the scheduling cycle and explain."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from sqlalchemy import Connection, Engine

from gpufair.api.convert_schedule import (
    PendingEncoder,
    explanation_to_proto,
    result_to_proto,
    without_binds,
)
from gpufair.api.convert_workload import submit_time_violations, workload_from_proto
from gpufair.api.cycle_gate import Batch, CycleGate, Member
from gpufair.api.idempotent import run_mutation
from gpufair.api.ledger import share_to_proto
from gpufair.api.work_slots import WorkSlots
from gpufair.api.workload_listing import list_workloads
from gpufair.domain.errors import InvalidInputError, NotFound, Violation
from gpufair.domain.ledger import WorkloadState
from gpufair.domain.limits import MAX_WORKLOADS_PER_BATCH
from gpufair.domain.request_rules import name_violations, request_id_violations, uid_violations
from gpufair.domain.snapshot import EvictionInFlight
from gpufair.domain.workload_rules import resolve_submitted, workload_violations
from gpufair.metrics import observe_cycle
from gpufair.services import schedule
from gpufair.services.snapshot_source import SnapshotSource
from gpufair.store import (
    config_repo,
    deadline,
    fairshare_repo,
    locks,
    metrics_repo,
    schedule_repo,
    workload_repo,
)
from gpufair.store.commit_watch import commit_count
from gpufair.store.idempotency import (
    CYCLE_REFERENCE,
    StoredReply,
    conflict,
    request_digest,
    store_cycle_references,
    stored_replies,
)
from gpufair.store.schedule_repo import DEFAULT_BIND_TIMEOUT_S
from gpufair.v1 import scheduler_pb2 as pb
from gpufair.v1 import scheduler_pb2_grpc


@dataclass(frozen=True, slots=True)
class _Asked:
    """What a coalesced `Schedule` caller brings to its slot."""

    request_id: str
    digest: str


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(
        self,
        engine: Engine,
        clock: Callable[[], float] = time.time,
        bind_timeout_s: float = DEFAULT_BIND_TIMEOUT_S,
        slots: WorkSlots | None = None,
    ) -> None:
        self.engine = engine
        # `Schedule` takes its work slot itself: a caller waiting for a shared cycle holds none.
        self.slots = slots if slots is not None else WorkSlots(None)
        self.clock = clock
        self.bind_timeout_s = bind_timeout_s
        # Callers may join a running cycle when no commit of this process came between its
        # first read and their arrival (`api/cycle_gate.py`).
        commits = self._commits = commit_count(engine)
        self._gate: CycleGate[_Asked, pb.ScheduleResponse] = CycleGate(lambda: commits.value)
        # Per pool, touched only by slot leaders under the pool's lock (one slot runs at a
        # time per pool and process): this process's last own cycle with the commit marker just
        # after it, and the latest cycle it answered callers with.
        self._after_own: dict[str, tuple[int, int]] = {}
        self._handed: dict[str, int] = {}
        # Kept between cycles, checked against the database in each cycle's transaction.
        self.snapshots = SnapshotSource()
        self._pending = PendingEncoder()

    def SubmitWorkloads(
        self, request: pb.SubmitWorkloadsRequest, context: grpc.ServicerContext
    ) -> pb.SubmitWorkloadsResponse:
        now_s = self.clock()
        violations = request_id_violations(request.request_id)
        if len(request.workloads) > MAX_WORKLOADS_PER_BATCH:
            violations.append(Violation("workloads", f"at most {MAX_WORKLOADS_PER_BATCH} per call"))
        if violations:
            raise InvalidInputError(violations)
        batch = [workload_from_proto(w, now_s) for w in request.workloads]
        # Malformed fields are the caller's bug: refuse the whole call. Workloads that are well
        # formed but do not fit the cluster are refused one by one, the others accepted.
        for i, (msg, w) in enumerate(zip(request.workloads, batch, strict=True)):
            path = f"workloads[{i}]"
            stamp = submit_time_violations(msg, path)
            found = workload_violations(w, path)
            if stamp:  # named once, by the Timestamp's field, not again by the instant of it
                found = [v for v in found if v.field_path != f"{path}.submit_time"]
            violations += stamp + found
        seen: set[str] = set()
        for i, w in enumerate(batch):
            if w.uid in seen:
                violations.append(
                    Violation(f"workloads[{i}].uid", f"uid {w.uid!r} twice in one call")
                )
            seen.add(w.uid)
        if violations:
            raise InvalidInputError(violations)

        def work(conn: Connection) -> pb.SubmitWorkloadsResponse:
            config = config_repo.load_config(conn)
            resolved, problems = resolve_submitted(config, batch)
            fitting = [w for w in resolved if w.uid not in problems]
            outcomes = {o.uid: o for o in workload_repo.submit(conn, fitting)}
            results = []
            for w in batch:
                if w.uid in problems:
                    results.append(
                        pb.WorkloadResult(uid=w.uid, accepted=False, error=problems[w.uid])
                    )
                else:
                    o = outcomes[w.uid]
                    results.append(pb.WorkloadResult(uid=w.uid, accepted=o.accepted, error=o.error))
            return pb.SubmitWorkloadsResponse(results=results)

        return run_mutation(
            self.engine,
            method="SubmitWorkloads",
            request=request,
            request_id=request.request_id,
            dry_run=False,
            lock_key=None,
            reply_type=pb.SubmitWorkloadsResponse,
            work=work,
        )

    def CancelWorkload(
        self, request: pb.CancelWorkloadRequest, context: grpc.ServicerContext
    ) -> pb.CancelWorkloadResponse:
        violations = uid_violations("uid", request.uid)
        violations += request_id_violations(request.request_id)
        if violations:
            raise InvalidInputError(violations)

        def work(conn: Connection) -> pb.CancelWorkloadResponse:
            before = workload_repo.cancel(conn, request.uid)
            if before is None:
                raise NotFound("workload", request.uid)
            return pb.CancelWorkloadResponse(
                was_pending=before in (WorkloadState.PENDING, WorkloadState.BOUND),
                previous_state=before.value,
            )

        return run_mutation(
            self.engine,
            method="CancelWorkload",
            request=request,
            request_id=request.request_id,
            dry_run=False,
            lock_key=None,
            reply_type=pb.CancelWorkloadResponse,
            work=work,
        )

    def Schedule(
        self, request: pb.ScheduleRequest, context: grpc.ServicerContext
    ) -> pb.ScheduleResponse:
        """A cycle of the pool. A dry run is decided alone, and rolled back. Other calls are
        coalesced (`api/cycle_gate.py`): the calls of one pool that arrive while a cycle runs
        share the next cycle, run once by one of them for all; each request id gets that
        cycle's reply stored in the cycle's own transaction (a replay returns it). A dry run and
        a slot's cycle hold a work slot (`api/work_slots.py`); a caller waiting for its slot's
        cycle holds only its thread."""
        violations = name_violations("pool", request.pool)
        violations += request_id_violations(request.request_id)
        if violations:
            raise InvalidInputError(violations)
        if not request.dry_run:
            asked = _Asked(
                request.request_id,
                request_digest("Schedule", request.SerializeToString(deterministic=True)),
            )
            return self._gate.call(
                request.pool,
                asked,
                context.time_remaining(),
                lambda batch: self._run_slot(request.pool, batch),
            )
        now_s = self.clock()
        with self.slots.held(context.time_remaining()), self.engine.connect() as conn:
            decided = schedule.decide(conn, request.pool, now_s, self.snapshots)
            conn.rollback()  # a dry run decides, but nothing it touched may last
        dry = result_to_proto(request.pool, decided.result, now_s, 0, self._pending)
        dry.warnings.extend(decided.warnings)
        return dry

    def _run_slot(
        self, pool: str, batch: Batch[_Asked, pb.ScheduleResponse]
    ) -> dict[int, pb.ScheduleResponse | BaseException]:
        """One cycle for the members of a slot, in one transaction under the pool's lock.

        Members whose request id has a stored reply get it (or a Conflict if the id was used
        for another request). If the others' pool got a cycle from another replica while this
        one waited for the lock (a cycle begun after they all arrived: `last_cycle_id` is read
        before the lock), they get that cycle's stored reply, and no second cycle runs on its
        heels. Callers that joined the slot later (while it waited for the lock) get another
        process's cycle only by the commit-marker rule below, else the slot's own cycle, which
        callers arriving while it runs may also join (`api/cycle_gate.py`: from
        `batch.reading()`, just before the cycle's first read of the pool, to `batch.late()`,
        just before its reply is stored under their request ids).

        The rule across processes: a cycle of the pool stored after this process's last own
        cycle `k` of it read the pool after `k` committed (the pool's lock orders them). A
        member whose arrival found the commit marker where it stood just after `k` committed
        (only `k`'s own commit counted since the marker was read before its COMMIT) wrote
        nothing this process acknowledged after that, so such a cycle saw all of it; it is
        given only if no member of this process got it or a later one before."""
        deadline_s = batch.deadline_s
        remaining_s = None if deadline_s is None else deadline_s - time.monotonic()
        results: dict[int, pb.ScheduleResponse | BaseException] = {}
        after = self._after_own.get(pool)  # (own cycle id, marker just after its commit)
        asked: dict[str, str] = {}  # request id -> digest, of the members a cycle answers
        groups: list[tuple[pb.ScheduleResponse, list[Member[_Asked]]]] = []
        mine: pb.ScheduleResponse | None = None
        observe: Callable[[float], None] | None = None
        with (
            self.slots.held(remaining_s),
            deadline.call_deadline(remaining_s),
            self.engine.connect() as conn,
        ):
            seen = schedule_repo.last_cycle_id(conn)
            locks.xact_lock(conn, locks.pool_key(pool))
            todo = self._sort_members(conn, batch.members, asked, results)
            found = schedule_repo.cycle_after(conn, pool, seen) if todo else None
            if found is not None:
                groups.append((self._stored_cycle(found), todo))
                todo = []
            # Members that joined after `seen` was read may have written after that cycle read
            # the pool: the rule across processes, or a cycle of this slot.
            todo += self._sort_members(conn, batch.late(), asked, results)
            handed = self._handed.get(pool, 0)
            later = None
            if todo and after is not None and any(m.mark == after[1] for m in todo):
                later = schedule_repo.cycle_after(conn, pool, max(after[0], handed))
            if later is not None and after is not None:
                shared = [m for m in todo if m.mark == after[1]]
                groups.append((self._stored_cycle(later), shared))
                todo = [m for m in todo if m.mark != after[1]]
            started = time.perf_counter()
            if todo:
                batch.reading()
                mine, observe = self._decide_and_record(conn, pool, self.clock())
                todo += self._sort_members(conn, batch.late(), asked, results)
                groups.append((mine, todo))
            for reply, members in groups:
                ids = {m.key.request_id for m in members if m.key.request_id}
                store_cycle_references(conn, {i: asked[i] for i in ids}, reply.cycle_id)
            marker = self._commits.value  # before the COMMIT: what it counted committed before
            if groups:
                conn.commit()
            else:
                conn.rollback()
        only_this = self._commits.value == marker + 1  # no other commit counted meanwhile
        if mine is not None:
            if only_this:
                self._after_own[pool] = (mine.cycle_id, marker + 1)
            else:
                self._after_own.pop(pool, None)
        elif after is not None and groups and only_this and marker == after[1]:
            # This commit stored only request ids: no caller's write came after the own cycle.
            self._after_own[pool] = (after[0], marker + 1)
        if groups:
            self._handed[pool] = max(handed, *(reply.cycle_id for reply, _ in groups))
        if observe is not None:  # a cycle this replica ran, counted once it committed
            observe(time.perf_counter() - started)
        for reply, members in groups:
            for m in members:
                results[id(m)] = reply
        return results

    @staticmethod
    def _stored_cycle(found: tuple[int, bytes]) -> pb.ScheduleResponse:
        reply = pb.ScheduleResponse.FromString(found[1])
        reply.cycle_id = found[0]
        return reply

    def _sort_members(
        self,
        conn: Connection,
        members: list[Member[_Asked]],
        digests: dict[str, str],
        results: dict[int, pb.ScheduleResponse | BaseException],
    ) -> list[Member[_Asked]]:
        """The `members` the cycle answers; the others get their stored reply or a Conflict in
        `results`. Adds the request ids the cycle answers to `digests`."""
        asked = {m.key.request_id for m in members if m.key.request_id}
        stored = stored_replies(conn, asked) if asked else {}
        todo = []
        for m in members:
            rid, digest = m.key.request_id, m.key.digest
            if rid in stored and stored[rid].digest != digest:
                results[id(m)] = conflict(rid)
            elif rid in stored:
                results[id(m)] = self._stored_reply(conn, stored[rid])
            elif rid in digests and digests[rid] != digest:
                results[id(m)] = conflict(rid)  # twice in this slot, for two requests
            else:
                todo.append(m)
                if rid:
                    digests[rid] = digest
        return todo

    @staticmethod
    def _stored_reply(conn: Connection, stored: StoredReply) -> pb.ScheduleResponse:
        if stored.method != CYCLE_REFERENCE:
            return pb.ScheduleResponse.FromString(stored.reply)  # stored whole, as before
        cycle_id = int(stored.reply.decode())
        reply = pb.ScheduleResponse.FromString(schedule_repo.cycle_reply(conn, cycle_id))
        reply.cycle_id = cycle_id
        return reply

    def _decide_and_record(
        self, conn: Connection, pool: str, now_s: float
    ) -> tuple[pb.ScheduleResponse, Callable[[float], None]]:
        """The cycle's reply, and what counts it in the metrics once it committed (given the
        cycle's duration)."""
        decided = schedule.decide(conn, pool, now_s, self.snapshots)
        draft = result_to_proto(pool, decided.result, now_s, 0, self._pending)
        draft.warnings.extend(decided.warnings)
        cycle_id, not_kept = schedule_repo.record_cycle(
            conn, pool, decided.result, draft.SerializeToString(), now_s, self.bind_timeout_s
        )
        schedule_repo.forget_standing_claims(
            conn, schedule.standing_claims_served(decided.snapshot)
        )
        result = without_binds(decided.result, not_kept)
        reply = draft
        reply.cycle_id = cycle_id
        if not_kept:
            reply = result_to_proto(pool, result, now_s, cycle_id, self._pending)
            reply.warnings.extend(decided.warnings)
            schedule_repo.replace_reply(conn, cycle_id, reply.SerializeToString(), len(reply.binds))
        workloads = {w.uid: w for w in decided.snapshot.pending}
        ran = metrics_repo.latest_run_ends(conn, [b.workload_uid for b in result.binds])

        def observe(duration_s: float) -> None:
            observe_cycle(pool, result, workloads, ran, now_s, duration_s)

        return reply, observe

    def ExplainWorkload(
        self, request: pb.ExplainWorkloadRequest, context: grpc.ServicerContext
    ) -> pb.ExplainWorkloadResponse:
        violations = uid_violations("uid", request.uid)
        if violations:
            raise InvalidInputError(violations)
        now_s = self.clock()
        with self.engine.connect() as conn:
            found = workload_repo.get(conn, request.uid)
            if found is None:
                raise NotFound("workload", request.uid)
            workload, state = found
            share = fairshare_repo.latest_run(conn, workload.pool)
            if state is WorkloadState.PENDING and not config_repo.pool_exists(conn, workload.pool):
                # Its pool was removed while it waited (pending work does not block that): it
                # waits on, and no cycle of that pool can say more.
                reply = _without_pool(workload.uid, workload.pool)
                share = None
            elif state is WorkloadState.PENDING:
                explanation = schedule.explain_pending(
                    conn, workload.pool, workload.uid, now_s, self.snapshots
                )
                reply = explanation_to_proto(explanation, state.value)
                share = fairshare_repo.latest_run(conn, workload.pool)
            else:
                reply = pb.ExplainWorkloadResponse(
                    uid=workload.uid, state=state.value, message=_STATE_MESSAGES[state]
                )
                move = schedule_repo.move_of(conn, workload.uid)
                if move is not None:
                    reply.message += "; " + move_message(move)
            conn.rollback()  # explaining decides nothing
        if share is not None:
            for record in share.shares:
                if record.queue == workload.queue:
                    reply.queue_share.CopyFrom(share_to_proto(record))
        return reply

    def ListWorkloads(
        self, request: pb.ListWorkloadsRequest, context: grpc.ServicerContext
    ) -> pb.ListWorkloadsResponse:
        with self.engine.connect() as conn:
            reply = list_workloads(conn, request)
            conn.rollback()  # listing writes nothing
        return reply


def move_message(move: EvictionInFlight) -> str:
    """What `gpufair explain` adds for a workload being moved (defragmentation)."""
    places = ", ".join(
        f"{binding.node} GPUs {','.join(str(gpu) for gpu in binding.gpu_indices)}"
        for binding in move.move_to
    )
    return (
        f"being moved to make room for {move.beneficiary_uid}: once it stops it is bound on "
        f"{move.move_gpu_type} {places}, held for it meanwhile"
    )


def _without_pool(uid: str, pool: str) -> pb.ExplainWorkloadResponse:
    code = "unknown_pool"
    return pb.ExplainWorkloadResponse(
        uid=uid,
        state=WorkloadState.PENDING.value,
        reason_code=code,
        message=f"{uid} is pending ({code}): pool {pool} is not in the config; it waits until "
        "the pool is declared again, or until it is cancelled",
    )


_STATE_MESSAGES = {
    WorkloadState.BOUND: "placed by a Schedule decision; waiting for the batch system to start it",
    WorkloadState.RUNNING: "running",
    WorkloadState.FINISHED: "finished",
    WorkloadState.CANCELLED: "cancelled",
}
