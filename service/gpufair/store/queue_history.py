"""When a queue's history starts: a queue deleted and created again under the same name is a new
queue for fair share.

Usage is kept by queue name (the ledger's intervals, the hourly rollups), and the ledger keeps
a deleted queue's rows: reports (`report.*` views, fair-share history) go on showing what it ran.
A queue created again under that name is another team's, or the same team given a fresh start;
either way an administrator who deleted the queue ended its claim to the shared pool, and its
old usage must not lower the new queue's weight (nor would a queue of a new name inherit it). So
the fair share reads a re-created queue's usage from its deletion on (`rollup_repo.
decayed_usage`). Deletion is refused while the queue has bound or running work
(`deletion_guard`), so every run of the old queue ended by then.

The instant is the config audit trail's (`config_versions`: every applied change set, with the
database's time it was applied and each change's kind, name and action), so no extra state is
kept: the latest version that deleted a queue of that name. Reading it scans the trail (about
0.18 s for 10,080 versions of 50 changes each), so each queue's answer is kept by this process,
keyed by the database (its engine's URL) and the queue's name and creation time: it cannot change while that queue exists, since a
deletion of the name after its creation would have removed it. Only a queue created after the
instant asked about can have been deleted after it, so older queues are never looked up.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, text

from gpufair.domain.model import Queue

# (database URL, queue name, created_at_s) -> its name's latest deletion before that creation,
# None if never.
_last_deletion: dict[tuple[str, str, float], float | None] = {}


def recreated_since(conn: Connection, queues: Sequence[Queue], since_s: float) -> dict[str, float]:
    """For each of `queues` (configured now) whose name was deleted after `since_s` (-inf:
    ever), the Unix time of that latest deletion; the queue exists, so it was created again
    after it."""
    young = [q for q in queues if q.created_at_s > since_s]
    if not young:
        return {}
    database = str(conn.engine.url)
    missing = [q for q in young if (database, q.name, q.created_at_s) not in _last_deletion]
    if missing:
        deleted = _latest_deletions(conn, [q.name for q in missing])
        renewed = {q.name for q in missing}
        for key in [k for k in _last_deletion if k[0] == database and k[1] in renewed]:
            _last_deletion.pop(key, None)  # an earlier queue of the name: never asked again
        for q in missing:
            _last_deletion[(database, q.name, q.created_at_s)] = deleted.get(q.name)
    found = {}
    for q in young:
        deleted_s = _last_deletion.get((database, q.name, q.created_at_s))
        if deleted_s is not None and deleted_s > since_s:
            found[q.name] = deleted_s
    return found


def _latest_deletions(conn: Connection, names: list[str]) -> dict[str, float]:
    """The latest deletion of each of `names` in the audit trail, for those ever deleted."""
    rows = conn.execute(
        text(
            """
            SELECT change ->> 'name' AS queue,
                   max(extract(epoch FROM v.applied_at))::float8 AS deleted_at
            FROM config_versions AS v
            CROSS JOIN LATERAL jsonb_array_elements(v.changes) AS change
            WHERE v.changes @> CAST('[{"kind": "queue", "action": "delete"}]' AS jsonb)
              AND change ->> 'kind' = 'queue' AND change ->> 'action' = 'delete'
              AND change ->> 'name' = ANY(:queues)
            GROUP BY change ->> 'name'
            """
        ),
        {"queues": names},
    )
    return {r.queue: float(r.deleted_at) for r in rows}
