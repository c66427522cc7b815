"""Scheduler: workload submission and cancellation; the scheduling cycle and explain."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
from sqlalchemy import Connection, Engine

from gpufair.api.convert_schedule import explanation_to_proto, result_to_proto, without_binds
from gpufair.api.convert_workload import workload_from_proto
from gpufair.api.idempotent import MAX_REQUEST_ID_LEN, run_mutation
from gpufair.api.ledger import share_to_proto
from gpufair.api.workload_listing import list_workloads
from gpufair.domain.errors import InvalidInputError, NotFound, Violation
from gpufair.domain.ledger import WorkloadState
from gpufair.domain.workload_rules import submit_problems, workload_violations
from gpufair.services import schedule
from gpufair.store import config_repo, fairshare_repo, locks, schedule_repo, workload_repo
from gpufair.store.schedule_repo import DEFAULT_BIND_TIMEOUT_S
from gpufair.v1 import scheduler_pb2 as pb
from gpufair.v1 import scheduler_pb2_grpc

MAX_WORKLOADS_PER_BATCH = 10_000


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
        violations: list[Violation] = []
        if len(request.request_id) > MAX_REQUEST_ID_LEN:
            violations.append(
                Violation("request_id", f"longer than {MAX_REQUEST_ID_LEN} characters")
            )
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
        if not request.uid:
            raise InvalidInputError([Violation("uid", "is required")])

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
        violations = []
        if not request.pool:
            violations.append(Violation("pool", "is required"))
        if len(request.request_id) > MAX_REQUEST_ID_LEN:
            violations.append(
                Violation("request_id", f"longer than {MAX_REQUEST_ID_LEN} characters")
            )
        if violations:
            raise InvalidInputError(violations)
        now_s = self.clock()

        def work(conn: Connection) -> pb.ScheduleResponse:
            decided = schedule.decide(conn, request.pool, now_s)
            if request.dry_run:
                return result_to_proto(request.pool, decided.result, now_s, cycle_id=0)
            draft = result_to_proto(request.pool, decided.result, now_s, cycle_id=0)
            cycle_id, skipped = schedule_repo.record_cycle(
                conn,
                request.pool,
                decided.result,
                draft.SerializeToString(),
                now_s,
                self.bind_timeout_s,
            )
            schedule_repo.forget_standing_claims(
                conn, schedule.standing_claims_served(decided.snapshot)
            )
            result = without_binds(decided.result, skipped)
            reply = result_to_proto(request.pool, result, now_s, cycle_id)
            if skipped:
                schedule_repo.replace_reply(
                    conn, cycle_id, reply.SerializeToString(), len(reply.binds)
                )
            return reply

        # The pool lock is taken before the replay check, so a concurrent first attempt of the
        # same request id cannot slip in between; `decide` takes it again, a no-op then.
        return run_mutation(
            self.engine,
            method="Schedule",
            request=request,
            request_id=request.request_id,
            dry_run=request.dry_run,
            lock_key=locks.pool_key(request.pool) if request.pool else None,
            reply_type=pb.ScheduleResponse,
            work=work,
        )

    def ExplainWorkload(
        self, request: pb.ExplainWorkloadRequest, context: grpc.ServicerContext
    ) -> pb.ExplainWorkloadResponse:
        if not request.uid:
            raise InvalidInputError([Violation("uid", "is required")])
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
