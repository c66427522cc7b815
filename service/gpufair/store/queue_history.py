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
kept: the latest version that deleted a queue of that name, among the queues configured now.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sqlalchemy import Connection, text


def recreated_since(conn: Connection, queues: Sequence[str], since_s: float) -> dict[str, float]:
    """For each of `queues` (configured now) deleted after `since_s` (-inf: ever), the Unix time
    of its latest deletion; the queue exists, so it was created again after that."""
    if not queues:
        return {}
    rows = conn.execute(
        text(
            """
            SELECT change ->> 'name' AS queue,
                   max(extract(epoch FROM v.applied_at))::float8 AS deleted_at
            FROM config_versions AS v
            CROSS JOIN LATERAL jsonb_array_elements(v.changes) AS change
            WHERE v.changes @> CAST('[{"kind": "queue", "action": "delete"}]' AS jsonb)
              AND (CAST(:since AS float8) IS NULL OR v.applied_at > to_timestamp(:since))
              AND change ->> 'kind' = 'queue' AND change ->> 'action' = 'delete'
              AND change ->> 'name' = ANY(:queues)
            GROUP BY change ->> 'name'
            """
        ),
        {"queues": list(queues), "since": since_s if math.isfinite(since_s) else None},
    )
    return {r.queue: float(r.deleted_at) for r in rows}
