"""Two replicas, one killed with SIGKILL while both serve and tick: the survivor keeps claiming
and doing every periodic job period by period, and its RPCs (Schedule on the pool the dead
replica was scheduling, ReportEvents, GetFairShare) keep answering without an error."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
from fault_support import cluster, run_events, serve_env, status_of, workloads
from serve_support import ServeProcess
from sqlalchemy import create_engine, text

from gpufair.client import GpufairClient
from gpufair.store.database import Database, normalise_url
from gpufair.store.scratch import scratch_database
from gpufair.v1 import ledger_pb2, scheduler_pb2

NODES = 8


def test_one_replica_killed_the_other_goes_on(pg_server: Database, tmp_path: Path) -> None:
    with scratch_database(pg_server.url) as url:
        args = ["--database-url", url, "--grace-s", "1", "--job-tick-s", "0.25"]
        args += ["--sweep-period-s", "1"]
        replicas = [ServeProcess(args, serve_env(), tmp_path / f"replica-{i}.log") for i in (0, 1)]
        try:
            for r in replicas:
                r.wait_serving()
            victim, survivor = replicas
            with GpufairClient(survivor.address, attempts=1, timeout_s=60) as c:
                c.apply_config(cluster(["main", "ledger"], NODES, recompute_s=1))
                c.submit_workloads(workloads("main", 300) + workloads("ledger", 400, prefix="l"))

            stop = threading.Event()
            failures: list[grpc.StatusCode] = []
            calls: Counter[str] = Counter()

            def victim_schedules() -> None:
                # Keeps the dead replica busy with the shared pool lock up to its death.
                with GpufairClient(victim.address, attempts=1, timeout_s=10) as c:
                    while not stop.is_set():
                        try:
                            c.schedule("main")
                        except grpc.RpcError:
                            return

            def survivor_serves() -> None:
                t0 = time.time() - 3600
                with GpufairClient(survivor.address, attempts=1, timeout_s=20) as c:
                    w = 0
                    while not stop.is_set():
                        try:
                            c.schedule("main")
                            calls["Schedule"] += 1
                            node = f"ledger-n{w % NODES:03d}"
                            c.report_events(run_events(f"l{w}", node, w // NODES % 8, t0 + w))
                            calls["ReportEvents"] += 1
                            c.get_fair_share("main")
                            calls["GetFairShare"] += 1
                        except grpc.RpcError as exc:
                            failures.append(status_of(exc))
                        w = (w + 1) % 400

            threads = [threading.Thread(target=f) for f in (victim_schedules, survivor_serves)]
            for t in threads:
                t.start()
            time.sleep(2)
            victim.proc.send_signal(signal.SIGKILL)
            assert victim.proc.wait(timeout=30) == -signal.SIGKILL
            killed_at = datetime.now(UTC)
            calls_at_kill = sum(calls.values())
            time.sleep(5)
            stop.set()
            for t in threads:
                t.join(timeout=60)
            calls_after_kill = sum(calls.values()) - calls_at_kill
            with GpufairClient(survivor.address, attempts=1) as c:
                reply = c.scheduler.Schedule(scheduler_pb2.ScheduleRequest(pool="main"), timeout=20)
                assert reply.cycle_id > 0
                statuses = c.report_events(
                    run_events("l399", "ledger-n000", 7, time.time() - 600, stop=False)
                ).results
                assert {r.status for r in statuses} == {ledger_pb2.EVENT_STATUS_STORED}
        finally:
            survivor_code = replicas[1].terminate()
            if replicas[0].proc.poll() is None:
                replicas[0].terminate()
        assert survivor_code == 0
        assert failures == []  # the survivor never failed a call, before or after the kill
        assert calls_after_kill >= 10

        engine = create_engine(normalise_url(url))
        try:
            with engine.connect() as conn:
                rows = conn.execute(
                    text(
                        "SELECT job, period_start, claimed_by, outcome FROM job_claims "
                        "ORDER BY job, period_start"
                    )
                ).all()
        finally:
            engine.dispose()

    after = [r for r in rows if r.period_start >= killed_at + timedelta(seconds=1)]
    replicas_before = {r.claimed_by for r in rows if r.period_start < killed_at}
    survivors = {r.claimed_by for r in after}
    by_job = Counter(r.job for r in after)
    unfinished = [r for r in rows if r.outcome is None and r.period_start < killed_at]
    print(
        f"claims before the kill by {len(replicas_before)} replica(s); after: {dict(by_job)} by "
        f"{len(survivors)}; {len(unfinished)} claim(s) left unfinished by the kill; "
        f"survivor calls after the kill {calls_after_kill}"
    )
    # Periods wholly after the kill: claimed by one replica, the survivor, and done.
    assert len(survivors) == 1
    assert by_job["sweep"] >= 3 and by_job["recompute:main"] >= 3
    assert by_job["recompute:ledger"] >= 3
    assert all(r.outcome is not None and r.outcome.startswith("ok") for r in after)
