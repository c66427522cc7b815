"""Migration 0030: report.workload_accounting gives a compute-unit request's ask, on PostgreSQL.

A request of 20 CU is stored with 0 pods and 0 GPUs per pod (placement picks both). Before, the
view said it asked for 0 GPUs; now `requested_gpus` is NULL for it and the new `requested_cu`
says 20. A request of 2 pods of 4 GPUs keeps 8 GPUs and has no CU. Going back to 0029 gives the
view of before (no `requested_cu`, 0 GPUs), with the reporter role's grant and the comments;
coming up again gives the new view again.
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
    "state_changed_at) VALUES (:uid, 'team', 'main', 'pending', CAST(:spec AS jsonb), 'd', "
    "now(), now())"
)
_READ = "SELECT * FROM report.workload_accounting ORDER BY workload"
_COLUMNS = (
    "SELECT attname, col_description(attrelid, attnum) FROM pg_attribute "
    "WHERE attrelid = 'report.workload_accounting'::regclass AND attnum > 0 ORDER BY attnum"
)
_GRANTED = "SELECT has_table_privilege('gpufair_reporter', 'report.workload_accounting', 'SELECT')"
_UTILISATION = (
    "SELECT col_description('report.pool_utilisation_daily'::regclass, attnum) FROM pg_attribute "
    "WHERE attrelid = 'report.pool_utilisation_daily'::regclass AND attname = 'utilisation'"
)


def _spec(uid: str, pods: int, gpus_per_pod: float, cu: float | None) -> str:
    spec: dict[str, object] = {
        "uid": uid,
        "queue": "team",
        "pool": "main",
        "pods": pods,
        "gpus_per_pod": gpus_per_pod,
    }
    if cu is not None:
        spec["compute_units"] = cu
    return json.dumps(spec)


def _asks(url: str) -> list[tuple[object, ...]]:
    rows = _rows(url, _READ)
    names = [r[0] for r in _rows(url, _COLUMNS)]
    return [
        tuple(
            row[names.index(c)] if c in names else "absent"
            for c in ("workload", "requested_gpus", "requested_cu")
        )
        for row in rows
    ]


def test_a_compute_unit_request_shows_its_cu_and_no_gpus(pg_server: Database) -> None:
    with scratch_database(pg_server.url) as url:
        migrate.upgrade(url)
        _rows(url, _ADD, uid="by-cu", spec=_spec("by-cu", 0, 0.0, 20.0))
        _rows(url, _ADD, uid="by-gpus", spec=_spec("by-gpus", 2, 4.0, None))
        assert _asks(url) == [("by-cu", None, 20.0), ("by-gpus", 8.0, None)]
        comments = dict(_rows(url, _COLUMNS))
        assert comments["requested_cu"] == (
            "compute units a request of compute units asked for; NULL for a request of GPUs"
        )
        assert _rows(url, _GRANTED) == [(True,)]
        [(utilisation,)] = _rows(url, _UTILISATION)
        assert isinstance(utilisation, str) and "Above 1" in utilisation

        command.downgrade(migrate.alembic_config(url), "0029")
        assert _asks(url) == [("by-cu", 0.0, "absent"), ("by-gpus", 8.0, "absent")]
        comments = dict(_rows(url, _COLUMNS))
        assert comments["requested_gpus"] == "pods times GPUs per pod"
        assert comments["wait_s"] == (
            "seconds from submit to its first start (to now while it waits; NULL for finished "
            "work whose runs retention deleted)"
        )
        assert all(comments.values())
        assert _rows(url, _GRANTED) == [(True,)]
        assert _rows(url, _UTILISATION) == [("used over capacity, 0 to 1; NULL without capacity",)]

        migrate.upgrade(url)
        assert _asks(url) == [("by-cu", None, 20.0), ("by-gpus", 8.0, None)]
