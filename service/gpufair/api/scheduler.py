"""Scheduler: workload submission and cancellation; the scheduling cycle and explain."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
from sqlalchemy import Connection, Engine

from gpufair.api.convert_schedule import explanation_to_proto, result_to_proto, without_binds
from gpufair.api.convert_workload import workload_from_proto
from gpufair.api.idempotent import run_mutation
from gpufair.api.ledger import share_to_proto
from gpufair.api.workload_listing import list_workloads
from gpufair.domain.errors import InvalidInputError, NotFound, Violation
from gpufair.domain.ledger import WorkloadState
from gpufair.domain.limits import MAX_WORKLOADS_PER_BATCH
from gpufair.domain.request_rules import name_violations, request_id_violations, uid_violations
from gpufair.domain.workload_rules import submit_problems, workload_violations
from gpufair.metrics import observe_cycle
from gpufair.services import schedule
from gpufair.store import (
    config_repo,
    fairshare_repo,
    locks,
    metrics_repo,
    schedule_repo,
    workload_repo,
)
from gpufair.store.schedule_repo import DEFAULT_BIND_TIMEOUT_S
from gpufair.v1 import scheduler_pb2 as pb
from gpufair.v1 import scheduler_pb2_grpc


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(
        self,
        engine: Engine,
        clock: Callable[[], float] = time.time,
        bind_timeout_s: float = DEFAULT_BIND_TIMEOUT_S,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.bind_timeout_s = bind_timeout_s

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
        for i, w in enumerate(batch):
            violations += workload_violations(w, f"workloads[{i}]")
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
            problems = submit_problems(config, batch)
            fitting = [w for w in batch if w.uid not in problems]
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
                was_pending=before in (WorkloadState.PENDING, WorkloadState.BOUND)
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
        violations = name_violations("pool", request.pool)
        violations += request_id_violations(request.request_id)
        if violations:
            raise InvalidInputError(violations)
        now_s = self.clock()
        started = time.perf_counter()
        # What a recorded cycle decided, counted in the metrics once it committed (a replay of
        # a request id or a dry run counts nothing).
        recorded: list[Callable[[float], None]] = []

        def work(conn: Connection) -> pb.ScheduleResponse:
            decided = schedule.decide(conn, request.pool, now_s)
            if request.dry_run:
                dry = result_to_proto(request.pool, decided.result, now_s, cycle_id=0)
                dry.warnings.extend(decided.warnings)
                return dry
            draft = result_to_proto(request.pool, decided.result, now_s, cycle_id=0)
            draft.warnings.extend(decided.warnings)
            cycle_id, skipped = schedule_repo.record_cycle(
                conn,
                request.pool,
                decided.result,
                draft.SerializeToString(),
                now_s,
                self.bind_timeout_s,
            )
            result = without_binds(decided.result, skipped)
            workloads = {w.uid: w for w in decided.snapshot.pending}
            first = metrics_repo.first_binds(conn, [b.workload_uid for b in result.binds])
            recorded.append(
                lambda duration_s: observe_cycle(
                    request.pool, result, workloads, first, now_s, duration_s
                )
            )
            reply = result_to_proto(request.pool, result, now_s, cycle_id)
            reply.warnings.extend(decided.warnings)
            if skipped:
                schedule_repo.replace_reply(
                    conn, cycle_id, reply.SerializeToString(), len(reply.binds)
                )
            return reply

        # The pool lock is taken before the replay check, so a concurrent first attempt of the
        # same request id cannot slip in between; `decide` takes it again, a no-op then.
        reply = run_mutation(
            self.engine,
            method="Schedule",
            request=request,
            request_id=request.request_id,
            dry_run=request.dry_run,
            lock_key=locks.pool_key(request.pool) if request.pool else None,
            reply_type=pb.ScheduleResponse,
            work=work,
        )
        for observe in recorded:
            observe(time.perf_counter() - started)
        return reply

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
            if state is WorkloadState.PENDING:
                explanation = schedule.explain_pending(conn, workload.pool, workload.uid, now_s)
                reply = explanation_to_proto(explanation, state.value)
                share = fairshare_repo.latest_run(conn, workload.pool)
            else:
                reply = pb.ExplainWorkloadResponse(
                    uid=workload.uid, state=state.value, message=_STATE_MESSAGES[state]
                )
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


_STATE_MESSAGES = {
    WorkloadState.BOUND: "placed by a Schedule decision; waiting for the batch system to start it",
    WorkloadState.RUNNING: "running",
    WorkloadState.FINISHED: "finished",
    WorkloadState.CANCELLED: "cancelled",
}
