"""Retention's wait for a pool's rollup in flight (`retention_horizons.record`) outlasts the
engine's statement timeout as well as its lock timeout: a statement timeout bounds a lock wait
too, so the engine's 30 s ended the 10-minute wait (`ROLLUP_WAIT_S`) meant for a redo of a long
history, and retention failed having deleted nothing."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import Engine, text

from gpufair.domain.model import NodePool
from gpufair.store import rollup_repo
from gpufair.store.retention_repo import apply_retention
from tests.lock_waits import until, waiting_on_locks
from tests.store.test_retention_rollup_race import (
    KEPT,
    LATER,
    _assert_nothing_before_the_horizon,
    _in_thread,
    _parked_at_the_runs,
    _setup,
)


def test_retention_waits_for_a_rollup_longer_than_the_statement_timeout(
    db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection's statement timeout at 0.3 s (the engine's 30 s, shortened) and the rollup
    parked for 1.5 s: retention waits, then deletes as it would."""
    config = _setup(db)
    pool: NodePool = config.pools[0]
    parked, go = _parked_at_the_runs(monkeypatch)
    errors: list[BaseException] = []

    def rollup() -> None:
        with db.begin() as conn:
            rollup_repo.rollup_pool(conn, config, pool, LATER)

    def retention() -> None:
        with db.connect() as conn:
            conn.execute(text("SET statement_timeout = 300"))
            conn.commit()
            try:
                apply_retention(conn, LATER, KEPT)
                conn.commit()
            finally:
                conn.rollback()
                conn.execute(text("SET statement_timeout = 30000"))  # the engine's own
                conn.commit()

    rolling = _in_thread(rollup, errors)
    assert parked.wait(timeout=30), "the rollup never read the runs"
    retaining = _in_thread(retention, errors)
    until(lambda: waiting_on_locks(db, "advisory") == 1, "retention never waited")
    threading.Timer(1.5, go.set).start()
    rolling.join(timeout=30)
    retaining.join(timeout=30)
    assert errors == []
    _assert_nothing_before_the_horizon(db, config)
