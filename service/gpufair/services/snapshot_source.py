"""What a process keeps between scheduling cycles so that a cycle reads only what changed
(issue 16): the cluster config, by the latest config version's key (`store/read_versions.py`,
the key GetConfig's cache checks), each pool's latest fair-share run by its key, and each pool's
holding and pending workloads (`store/snapshot_rows.py`, by row versions). Both are checked against the database in the
cycle's own transaction, under the pool's lock, every cycle: a cached snapshot is exactly what a
fresh read would give, whatever another replica, the ingest or a direct SQL write did meanwhile.

It also keeps, per pool, what the last cycle loaded from those rows (`domain/cycle_memory.py`):
the rows it hands out are the same objects for every row that did not change, so the next
cycle reuses its records for them and loads only what changed. Cycles of one pool never run at
once (the pool's advisory lock, `services/schedule.py`), so one pool's records are never used
by two cycles together.

What is kept for a pool the config no longer has (a deleted pool) is dropped when a new config
is read, so the process holds state only for the pools that exist.

One per servicer (per database); each process of `gpufair serve --processes N` has its own.
"""

from __future__ import annotations

import threading

from sqlalchemy import Connection

from gpufair.domain.cycle_memory import CarriedLoad
from gpufair.domain.model import Allocation, ClusterConfig, Workload
from gpufair.domain.stored_limits import within_limits
from gpufair.store import config_repo, fairshare_repo, read_versions
from gpufair.store.fairshare_repo import StoredRun
from gpufair.store.snapshot_rows import SnapshotRows


class SnapshotSource:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._config: tuple[str, ClusterConfig] | None = None
        self._runs: dict[str, tuple[str, StoredRun | None]] = {}
        self.rows = SnapshotRows()
        self._carried: dict[str, CarriedLoad] = {}
        self.config_loads = 0  # how often the config was read whole

    def config(self, conn: Connection) -> ClusterConfig:
        """The stored config within the input limits, read whole only when its key changed."""
        key = read_versions.config_key(conn)
        held = self._config
        if key is not None and held is not None and held[0] == key:
            return held[1]
        config = within_limits(config_repo.load_config(conn))[0]
        self.config_loads += 1
        if key is not None:
            with self._lock:
                self._config = (key, config)
        self._forget_pools_other_than({pool.name for pool in config.pools})
        return config

    def kept_pools(self) -> set[str]:
        """The pools something is kept for (runs, rows or carried records)."""
        with self._lock:
            return set(self._runs) | set(self._carried) | self.rows.pools()

    def _forget_pools_other_than(self, pools: set[str]) -> None:
        with self._lock:
            for gone in (set(self._runs) | set(self._carried)) - pools:
                self._runs.pop(gone, None)
                self._carried.pop(gone, None)
        self.rows.forget_other_than(pools)

    def latest_run(self, conn: Connection, pool: str) -> StoredRun | None:
        """`fairshare_repo.latest_run`, read whole only when the run's key changed. The key is
        read first: a run committed in between is stored under the older key and read again
        next time, never the reverse."""
        key = read_versions.fair_share_run_key(conn, pool)
        held = self._runs.get(pool)
        if key is not None and held is not None and held[0] == key:
            return held[1]
        run = fairshare_repo.latest_run(conn, pool)
        if key is not None:
            with self._lock:
                self._runs[pool] = (key, run)
        return run

    def holding_and_pending(
        self, conn: Connection, pool: str
    ) -> tuple[tuple[Allocation, ...], tuple[Workload, ...]]:
        return self.rows.holding_and_pending(conn, pool)

    def carried(self, pool: str) -> CarriedLoad:
        """The records the last cycle of `pool` loaded (empty before the first), for the next."""
        with self._lock:
            found = self._carried.get(pool)
            if found is None:
                found = self._carried[pool] = CarriedLoad()
            return found
