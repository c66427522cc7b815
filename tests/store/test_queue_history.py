"""When a queue's fair-share history starts (`store/queue_history.py`): the latest deletion of
its name in the config audit trail, read once per queue and creation by this process."""

from __future__ import annotations

import dataclasses
import time

from sqlalchemy import Engine, text

from gpufair.store import config_repo, queue_history
from tests.jobs.test_recompute import install, reference_config


def test_a_recreated_queue_s_deletion_is_read_once_and_anew_for_a_newer_queue(db: Engine) -> None:
    now_s = time.time()
    config = reference_config(1.0)
    gone = dataclasses.replace(
        config,
        queues=tuple(q for q in config.queues if q.name != "vision"),
        budgets=tuple(b for b in config.budgets if b.queue != "vision"),
    )
    with db.connect() as conn:
        install(conn, config, now_s)
        conn.commit()
        install(conn, gone, now_s)
        conn.commit()
        install(conn, config, now_s)  # vision created again
        conn.commit()
        deleted_s = float(
            conn.execute(
                text(
                    "SELECT extract(epoch FROM applied_at)::float8 FROM config_versions "
                    "WHERE version = 2"
                )
            ).scalar_one()
        )
        queues = config_repo.load_config(conn).queues
        llm_created_s = next(q.created_at_s for q in queues if q.name == "llm")
        # Asked from before the deletion: vision, deleted then; llm never was.
        assert queue_history.recreated_since(conn, queues, deleted_s - 1) == {"vision": deleted_s}
        assert queue_history.recreated_since(conn, queues, deleted_s) == {}
        # The answer is kept: with the audit trail emptied it is the same, read from nowhere.
        conn.execute(text("DELETE FROM config_versions"))
        assert queue_history.recreated_since(conn, queues, deleted_s - 1) == {"vision": deleted_s}
        # From after the queues' creation nothing was deleted (they are not even looked up).
        assert queue_history.recreated_since(conn, queues, llm_created_s + 1e9) == {}
        # vision deleted and created once more: a newer queue of the name, looked up anew in
        # the trail, which now holds that deletion alone.
        install(conn, gone, now_s)
        install(conn, config, now_s)
        again_s = float(
            conn.execute(
                text(
                    "SELECT extract(epoch FROM applied_at)::float8 FROM config_versions "
                    "ORDER BY version LIMIT 1"
                )
            ).scalar_one()
        )
        newest = config_repo.load_config(conn).queues
        assert queue_history.recreated_since(conn, newest, deleted_s - 1) == {"vision": again_s}
        conn.rollback()
