"""The report views for BI tools (migration 0010), on rows written straight into the tables:
accounting per workload, daily utilisation, fair-share history, the open hour (equal to what
GetUsage counts for it), and a comment on every view and column of the schema."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from report_support import add_usage
from sqlalchemy import Connection, Engine, text

from gpufair.store import report_repo

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)


def add_workload(conn: Connection, uid: str, state: str, submit: datetime, gpus: int) -> None:
    spec = {"uid": uid, "pods": gpus, "gpus_per_pod": 1.0, "pool": "main", "queue": "team-a"}
    conn.execute(
        text(
            "INSERT INTO workloads (uid, queue, pool, state, spec, spec_digest, submit_time, "
            "state_changed_at) VALUES (:uid, 'team-a', 'main', :state, CAST(:spec AS jsonb), "
            "'d', :submit, :submit)"
        ),
        {"uid": uid, "state": state, "spec": json.dumps(spec), "submit": submit},
    )


def add_run(
    conn: Connection,
    uid: str,
    start: datetime,
    end: datetime | None,
    end_kind: str | None,
    *,
    gpus: float,
    cu_per_gpu: float = 10.0,
    queue: str = "team-a",
) -> None:
    conn.execute(
        text(
            "INSERT INTO allocation_intervals (workload_uid, start_event_id, queue, pool, "
            "gpu_type, gpus, cu, started_at, ended_at, end_kind, pods) VALUES (:uid, :event, "
            ":queue, 'main', 'a100', :gpus, :cu, :start, :end, :kind, '[]')"
        ),
        {
            "uid": uid,
            "event": str(uuid.uuid4()),
            "queue": queue,
            "gpus": gpus,
            "cu": gpus * cu_per_gpu,
            "start": start,
            "end": end,
            "kind": end_kind,
        },
    )


def test_workload_accounting(db: Engine) -> None:
    with db.begin() as conn:
        # Waited 10 min, ran 30 min, was evicted, ran 60 min more and finished: 8 GPUs.
        add_workload(conn, "done", "finished", T0, 8)
        add_run(conn, "done", T0 + 10 * MIN, T0 + 40 * MIN, "preempted", gpus=8)
        add_run(conn, "done", T0 + 50 * MIN, T0 + 110 * MIN, "stopped", gpus=8)
        add_workload(conn, "waiting", "pending", T0, 2)
        rows = {
            r.workload: r for r in conn.execute(text("SELECT * FROM report.workload_accounting"))
        }
    done = rows["done"]
    assert (done.start_time, done.end_time) == (T0 + 10 * MIN, T0 + 110 * MIN)
    assert done.wait_s == 600 and done.requested_gpus == 8
    assert done.gpu_hours == pytest.approx(8 * 1.5) and done.cu_hours == pytest.approx(120)
    assert (done.runs, done.evictions, done.last_end_kind) == (1 + 1, 1, "stopped")
    waiting = rows["waiting"]
    assert waiting.start_time is None and waiting.end_time is None
    assert (waiting.gpu_hours, waiting.runs, waiting.evictions) == (0, 0, 0)
    assert waiting.wait_s > (datetime.now(UTC) - T0).total_seconds() - 60  # still waiting


def test_workload_accounting_after_retention_deleted_the_runs(db: Engine) -> None:
    """Retention deletes the runs of finished work and keeps the workload: its wait is unknown
    then (NULL), not a wait that grows to now. Cancelled work that never ran keeps its wait
    to the cancel, and pending work its wait so far."""
    with db.begin() as conn:
        add_workload(conn, "pruned", "finished", T0, 4)
        add_workload(conn, "withdrawn", "cancelled", T0, 2)
        conn.execute(
            text("UPDATE workloads SET state_changed_at = :at WHERE uid = 'withdrawn'"),
            {"at": T0 + 25 * MIN},
        )
        add_workload(conn, "waiting", "pending", T0, 2)
        rows = {
            r.workload: r for r in conn.execute(text("SELECT * FROM report.workload_accounting"))
        }
        comment = conn.execute(
            text(
                "SELECT col_description('report.workload_accounting'::regclass, "
                "(SELECT attnum FROM pg_attribute WHERE attname = 'wait_s' "
                "AND attrelid = 'report.workload_accounting'::regclass))"
            )
        ).scalar_one()
    pruned = rows["pruned"]
    assert (pruned.start_time, pruned.end_time, pruned.wait_s) == (None, None, None)
    assert (pruned.gpu_hours, pruned.runs, pruned.requested_gpus) == (0, 0, 4)
    assert rows["withdrawn"].wait_s == 25 * 60
    assert rows["waiting"].wait_s > (datetime.now(UTC) - T0).total_seconds() - 60
    assert comment == (
        "seconds from submit to its first start (to now while it waits; NULL for finished work "
        "whose runs retention deleted); 0, never below, when the start (or now) reads before the "
        "submit time: the batch system's clock behind the submitter's"
    )


def test_pool_utilisation_daily(db: Engine) -> None:
    with db.begin() as conn:
        for at, gpus in ((T0 - 3 * 60 * MIN, 100), (T0 + 9 * 60 * MIN, 50)):  # 06:00, 18:00
            conn.execute(
                text(
                    "INSERT INTO pool_capacity_changes (pool, changed_at, capacity_cu, "
                    "capacity_gpus_by_type, source) VALUES ('main', :at, :cu, "
                    "CAST(:types AS jsonb), 'config')"
                ),
                {"at": at, "cu": gpus * 10, "types": json.dumps({"a100": gpus})},
            )
        for hour in range(3):
            add_usage(
                conn,
                queue="team-a",
                bucket_start=T0 + hour * 60 * MIN,
                gpus=10,
                cu_per_gpu=10,
                gpu_type="a100",
            )
        rows = conn.execute(
            text("SELECT * FROM report.pool_utilisation_daily WHERE day < :until ORDER BY day"),
            {"until": T0.replace(hour=0) + timedelta(days=2)},
        ).fetchall()
    monday, tuesday = rows
    # Monday: 100 GPUs 06:00-18:00 and 50 GPUs 18:00-24:00; 30 GPU-hours used.
    assert (monday.pool, monday.gpu_type) == ("main", "a100")
    assert monday.capacity_gpu_hours == pytest.approx(1200 + 300)
    assert monday.used_gpu_hours == 30 and monday.idle_gpu_hours == pytest.approx(1470)
    assert monday.utilisation == pytest.approx(30 / 1500)
    assert tuesday.capacity_gpu_hours == pytest.approx(50 * 24)
    assert (tuesday.used_gpu_hours, tuesday.utilisation) == (0, 0)


def test_fair_share_history(db: Engine) -> None:
    with db.begin() as conn:
        for k, share in enumerate((30.0, 45.0)):
            run_id = conn.execute(
                text(
                    "INSERT INTO fair_share_runs (pool, computed_at, capacity_cu, config_version) "
                    "VALUES ('main', :at, 100, 1) RETURNING id"
                ),
                {"at": T0 + k * MIN},
            ).scalar_one()
            conn.execute(
                text(
                    "INSERT INTO fair_share_history (run_id, queue, pool, computed_at, parent, "
                    "priority, deserved_cu, demand_cu, limit_cu, allocated_cu, weight_share, "
                    "usage_share, priority_weight, effective_weight, fair_share_cu, "
                    "decayed_usage_cu_s, fair_share_gpus_by_type) VALUES (:run, 'team-a', "
                    "'main', :at, NULL, 0, 20, 60, NULL, 25, 0.5, 0.25, 0.75, 0.75, :share, "
                    "7200, '{}')"
                ),
                {"run": run_id, "at": T0 + k * MIN, "share": share},
            )
        rows = conn.execute(
            text("SELECT * FROM report.fair_share_history ORDER BY computed_at")
        ).fetchall()
    assert [r.fair_share_cu for r in rows] == [30, 45]
    assert rows[0].pool_capacity_cu == 100 and rows[0].decayed_usage_cu_hours == 2
    assert (rows[0].weight_share, rows[0].usage_share, rows[0].priority_weight) == (
        0.5,
        0.25,
        0.75,
    )


def test_open_hour_view_equals_what_get_usage_counts(db: Engine) -> None:
    with db.begin() as conn:
        now = conn.execute(text("SELECT now()")).scalar_one()
        hour = now.replace(minute=0, second=0, microsecond=0)
        add_workload(conn, "long", "running", hour - 120 * MIN, 4)
        add_run(conn, "long", hour - 120 * MIN, None, None, gpus=4)  # running since before
        add_run(conn, "old", hour - 90 * MIN, hour - 30 * MIN, "stopped", gpus=2)  # not this hour
        if now - hour > 2 * MIN:
            add_run(conn, "short", hour, hour + MIN, "stopped", gpus=2, queue="ops")
        view = {r.queue: r for r in conn.execute(text("SELECT * FROM report.usage_open_hour"))}
        api = {r.queue: r for r in report_repo.open_hour_usage(conn, now.timestamp())}
    elapsed_h = (now - hour).total_seconds() / 3600
    assert view["team-a"].gpu_hours == pytest.approx(4 * elapsed_h)
    assert view["team-a"].cu_hours == pytest.approx(40 * elapsed_h)
    assert view["team-a"].hour_start == hour and view["team-a"].partial is True
    assert set(view) == set(api)
    for queue, row in view.items():
        assert row.gpu_hours == pytest.approx(api[queue].gpu_hours)
        assert row.cu_hours == pytest.approx(api[queue].cu_hours)
    if "ops" in view:
        assert view["ops"].gpu_hours == pytest.approx(2 / 60)


def test_every_report_view_and_column_has_a_comment(db: Engine) -> None:
    with db.connect() as conn:
        missing = conn.execute(
            text(
                """
                SELECT c.relname, a.attname
                FROM pg_class c
                JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'report'
                JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
                WHERE c.relkind = 'v'
                  AND (col_description(c.oid, a.attnum) IS NULL
                       OR obj_description(c.oid, 'pg_class') IS NULL)
                """
            )
        ).fetchall()
        views = conn.execute(
            text(
                "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'report' AND c.relkind = 'v'"
            )
        ).scalar_one()
    assert missing == [] and views == 9
