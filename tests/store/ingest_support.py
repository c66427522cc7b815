"""What the ingest tests share: one pool `p` of 8-GPU a100 nodes, one queue `q`, and four
workloads `w0`..`w3` submitted a day before `NOW`, committed; the connection is handed out
with that state and rolled back after."""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy import Connection, Engine

from gpufair.domain.config_diff import diff_configs
from gpufair.domain.model import (
    ClusterConfig,
    GpuType,
    Node,
    NodePool,
    Queue,
    QueueQuota,
    Workload,
    frozen_map,
)
from gpufair.store import config_repo, workload_repo
from gpufair.store.ingest_pipeline import EventStatus

NOW = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC
STORED, DUPLICATE, REJECTED = EventStatus.STORED, EventStatus.DUPLICATE, EventStatus.REJECTED


def one_pool_connection(db: Engine, nodes: int) -> Iterator[Connection]:
    """A connection to a database holding the pool with `nodes` nodes `a0`, `a1`, ..."""
    config = ClusterConfig(
        gpu_types=(GpuType("a100", 80, 10),),
        pools=(NodePool("p"),),
        nodes=tuple(Node(f"a{i}", "p", "a100", 8, 64000, 512000) for i in range(nodes)),
        queues=(Queue("q", None, frozen_map({"p": QueueQuota("p", deserved_cu=10)})),),
    )
    with db.connect() as connection:
        changes = diff_configs(config_repo.load_config(connection), config)
        config_repo.apply_changes(connection, config, changes)
        config_repo.record_version(connection, changes)
        workload_repo.submit(
            connection, [Workload(f"w{i}", "q", "p", 1, 1, NOW - 86400) for i in range(4)]
        )
        connection.commit()
        yield connection
        connection.rollback()
