"""Scheduler: workload submission and cancellation; the scheduling cycle and explain."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
from sqlalchemy import Connection, Engine

from gpufair.api.convert_workload import workload_from_proto
from gpufair.api.idempotent import MAX_REQUEST_ID_LEN, run_mutation
from gpufair.domain.errors import InvalidInput, NotFound, Violation
from gpufair.domain.ledger import WorkloadState
from gpufair.domain.workload_rules import submit_problems, workload_violations
from gpufair.store import config_repo, workload_repo
from gpufair.v1 import scheduler_pb2 as pb
from gpufair.v1 import scheduler_pb2_grpc

MAX_WORKLOADS_PER_BATCH = 10_000


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, engine: Engine, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.clock = clock

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
            raise InvalidInput(violations)
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
            raise InvalidInput(violations)

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
            raise InvalidInput([Violation("uid", "is required")])

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
