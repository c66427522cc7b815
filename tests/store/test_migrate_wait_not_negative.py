"""Migration 0031: report.workload_accounting's wait never reads below 0, on PostgreSQL.

A run whose batch system stamped its start 5 minutes before the submit time (the submitter's
clock ahead of the batch system's) read a wait of -300 s; a pending workload submitted "in an
day" by a clock ahead of the server's read about -86,400 s. Both read 0 now; a real wait (10
minutes) and an unknown one (a finished workload whose runs retention deleted: NULL) are as
before. Going back to 0030 gives the view and the comment of before, with the reporter role's
grant; coming up again gives the new ones again.
"""

from __future__ import annotations

import json

from alembic import command

from gpufair.store import migrate
from gpufair.store.database import Database
from gpufair.store.scratch import scratch_database
from tests.store.migrate_support import sql_rows as _rows

_ADD = (
    "INSERT INTO workloads (uid, queue, pool, state, spec, spec_digest, submit_time, "
    "state_changed_at) VALUES (:uid, 'team', 'main', :state, CAST(:spec AS jsonb), 'd', "
    "CAST(:submit AS timestamptz), now())"
)
_RUN = (
    "INSERT INTO allocation_intervals (workload_uid, start_event_id, queue, pool, gpu_type, "
    "gpus, cu, started_at, ended_at, end_kind, pods) VALUES (:uid, gen_random_uuid(), 'team', "
    "'main', 'a100', 1, 10, CAST(:start AS timestamptz), NULL, NULL, '[]')"
)
# The future submit's wait counts to now(): its sign, not its seconds.
_WAITS = (
    "SELECT workload, CASE WHEN workload = 'future' THEN sign(wait_s) ELSE round(wait_s) END "
    "FROM report.workload_accounting ORDER BY workload"
)
_COMMENT = (
    "SELECT col_description('report.workload_accounting'::regclass, attnum) FROM pg_attribute "
    "WHERE attrelid = 'report.workload_accounting'::regclass AND attname = 'wait_s'"
)
_GRANTED = "SELECT has_table_privilege('gpufair_reporter', 'report.workload_accounting', 'SELECT')"
_OLD_COMMENT = (
    "seconds from submit to its first start (to now while it waits; NULL for finished work "
    "whose runs retention deleted)"
)


def _add(url: str, uid: str, state: str, submit: str) -> None:
    spec = json.dumps({"uid": uid, "queue": "team", "pool": "main", "pods": 1, "gpus_per_pod": 1})
    _rows(url, _ADD, uid=uid, state=state, spec=spec, submit=submit)


def test_a_start_before_its_submit_waited_0_seconds(pg_server: Database) -> None:
    with scratch_database(pg_server.url) as url:
        migrate.upgrade(url)
        _add(url, "ahead", "running", "2026-03-02 09:05:00+00")
        _rows(url, _RUN, uid="ahead", start="2026-03-02 09:00:00+00")
        _add(url, "waited", "running", "2026-03-02 09:00:00+00")
        _rows(url, _RUN, uid="waited", start="2026-03-02 09:10:00+00")
        _add(url, "future", "pending", "2026-03-02 09:00:00+00")
        _rows(
            url, "UPDATE workloads SET submit_time = now() + interval '1 day' WHERE uid = 'future'"
        )
        _add(url, "pruned", "finished", "2026-03-02 09:00:00+00")
        fixed = [("ahead", 0), ("future", 0), ("pruned", None), ("waited", 600)]
        assert _rows(url, _WAITS) == fixed
        [(comment,)] = _rows(url, _COMMENT)
        assert comment == (
            f"{_OLD_COMMENT}; 0, never below, when the start (or now) reads before the submit "
            "time: the batch system's clock behind the submitter's"
        )
        assert _rows(url, _GRANTED) == [(True,)]

        command.downgrade(migrate.alembic_config(url), "0030")
        assert _rows(url, _WAITS) == [
            ("ahead", -300),
            ("future", -1),
            ("pruned", None),
            ("waited", 600),
        ]
        assert _rows(url, _COMMENT) == [(_OLD_COMMENT,)]
        assert _rows(url, _GRANTED) == [(True,)]

        migrate.upgrade(url)
        assert _rows(url, _WAITS) == fixed
