"""A pool's capacity history (`pool_capacity_changes`) whatever order node capacity reports and
config applies come in, on PostgreSQL.

Pool `p` is made at NOW - 1000 by a config apply with nodes of 8 A100 GPUs (10 CU each): 80 CU
per node. Reports: a0 down to 6 GPUs at NOW - 300 (-20 CU), a1 down to 4 at NOW - 200 (-40 CU),
a2 down to 0 at NOW - 100 (-80 CU).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.api import config_write
from gpufair.domain.config_diff import diff_configs
from gpufair.domain.ledger import EventKind, LedgerEvent
from gpufair.domain.model import (
    ClusterConfig,
    GpuType,
    Node,
    NodePool,
    Queue,
    QueueQuota,
    frozen_map,
)
from gpufair.store import config_repo, ingest_pipeline, retention_repo
from tests.store.ingest_support import NOW, REJECTED, STORED

A0, A1, A2 = (("a0", 6, -300), ("a1", 4, -200), ("a2", 0, -100))


def _config(nodes: int) -> ClusterConfig:
    return ClusterConfig(
        gpu_types=(GpuType("a100", 80, 10),),
        pools=(NodePool("p"),),
        nodes=tuple(Node(f"a{i}", "p", "a100", 8, 64000, 512000) for i in range(nodes)),
        queues=(Queue("q", None, frozen_map({"p": QueueQuota("p", deserved_cu=10)})),),
    )


def _apply(conn: Connection, config: ClusterConfig, at: float) -> None:
    changes = diff_configs(config_repo.load_config(conn), config)
    config_write.write(conn, config, changes, dry_run=False, now_s=NOW + at)


def _report(conn: Connection, node: str, gpus: int, at: float) -> None:
    event = LedgerEvent(
        str(uuid.uuid4()), EventKind.NODE_CAPACITY, NOW + at, node=node, gpu_count=gpus
    )
    [outcome] = ingest_pipeline.ingest(conn, [event], NOW)
    assert (outcome.status, outcome.error) == (STORED, "")


def _history(conn: Connection) -> list[tuple[float, float, str]]:
    rows = conn.execute(
        text(
            "SELECT extract(epoch FROM changed_at)::float8 - :now, capacity_cu, source "
            "FROM pool_capacity_changes WHERE pool = 'p' ORDER BY changed_at"
        ),
        {"now": NOW},
    ).all()
    return [(at, cu, source) for at, cu, source in rows]


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    with db.connect() as connection:
        yield connection
        connection.rollback()


THREE_REPORTS = [
    (-1000.0, 240.0, "config"),
    (-300.0, 220.0, "node_capacity"),
    (-200.0, 180.0, "node_capacity"),
    (-100.0, 100.0, "node_capacity"),
]


@pytest.mark.parametrize("order", list(itertools.permutations((A0, A1, A2))))
def test_three_nodes_reports_in_any_order_give_one_history(
    conn: Connection, order: tuple[tuple[str, int, int], ...]
) -> None:
    _apply(conn, _config(3), -1000)
    for node, gpus, at in order:
        _report(conn, node, gpus, at)
    assert _history(conn) == THREE_REPORTS
    by_type = conn.execute(
        text(
            "SELECT capacity_gpus_by_type FROM pool_capacity_changes "
            "WHERE pool = 'p' ORDER BY changed_at DESC LIMIT 1"
        )
    ).scalar_one()
    assert by_type == {"a100": 10}  # 6 + 4 + 0


def test_a_late_report_between_two_rows_changes_them_and_marks_rollups_from_its_instant(
    conn: Connection,
) -> None:
    """a0's and a2's reports are in; a1's comes last, between them: the row at NOW - 100 (it
    said 140 CU, without a1's loss) becomes 100 CU, and rollups are redone from NOW - 200."""
    _apply(conn, _config(3), -1000)
    _report(conn, *A0)
    _report(conn, *A2)
    assert _history(conn) == [
        (-1000.0, 240.0, "config"),
        (-300.0, 220.0, "node_capacity"),
        (-100.0, 140.0, "node_capacity"),
    ]
    conn.execute(text("DELETE FROM rollup_dirty_marks"))
    _report(conn, *A1)
    assert _history(conn) == THREE_REPORTS
    dirty = conn.execute(
        text("SELECT extract(epoch FROM min(dirty_from))::float8 - :now FROM rollup_dirty_marks"),
        {"now": NOW},
    ).scalar_one()
    assert dirty == -200.0


def test_a_late_report_of_a_node_before_its_own_later_one(conn: Connection) -> None:
    """a0 reports 4 GPUs at NOW - 100, then (late) 6 at NOW - 300: 220 CU from NOW - 300, then
    200 CU; the node's latest report stays the one of NOW - 100."""
    _apply(conn, _config(3), -1000)
    _report(conn, "a0", 4, -100)
    _report(conn, "a0", 6, -300)
    assert _history(conn) == [
        (-1000.0, 240.0, "config"),
        (-300.0, 220.0, "node_capacity"),
        (-100.0, 200.0, "node_capacity"),
    ]
    assert conn.execute(text("SELECT gpu_count FROM node_capacity")).scalar_one() == 4


def test_a_late_report_before_a_config_apply_that_added_a_node(conn: Connection) -> None:
    """a0 and a1 from NOW - 1000 (160 CU), a2 added at NOW - 150 (240 CU). Then come, late,
    a0's 6 GPUs and a2's 4 at NOW - 300: a0's counts from NOW - 300 (140 CU, then 220 CU at
    NOW - 150, the config apply's row). a2's is refused, as it is when it comes in time: gpufair
    did not know a2 then (`test_capacity_arrival_rules.py`). It was stored, and counted from
    a2's addition (180 CU at NOW - 150)."""
    _apply(conn, _config(2), -1000)
    _apply(conn, _config(3), -150)
    assert _history(conn) == [(-1000.0, 160.0, "config"), (-150.0, 240.0, "config")]
    event = LedgerEvent(
        str(uuid.uuid4()), EventKind.NODE_CAPACITY, NOW - 300, node="a2", gpu_count=4
    )
    [outcome] = ingest_pipeline.ingest(conn, [event], NOW)
    assert (outcome.status, outcome.error) == (REJECTED, "unknown node 'a2'")
    assert _history(conn) == [(-1000.0, 160.0, "config"), (-150.0, 240.0, "config")]
    _report(conn, "a0", 6, -300)
    assert _history(conn) == [
        (-1000.0, 160.0, "config"),
        (-300.0, 140.0, "node_capacity"),
        (-150.0, 220.0, "config"),
    ]


def test_a_config_apply_between_reports_counts_the_reports_of_its_instant(
    conn: Connection,
) -> None:
    """a1's loss at NOW - 200 is in; a2 is made not ready at NOW - 150 (a config apply); a0's
    loss at NOW - 300 comes last. Every row after it counts it, the config row included:
    220, 180, then 100 CU without a2's 80."""
    _apply(conn, _config(3), -1000)
    _report(conn, *A1)
    config = _config(3)
    drained = replace(config, nodes=(*config.nodes[:2], replace(config.nodes[2], ready=False)))
    _apply(conn, drained, -150)
    assert _history(conn) == [
        (-1000.0, 240.0, "config"),
        (-200.0, 200.0, "node_capacity"),
        (-150.0, 120.0, "config"),
    ]
    _report(conn, *A0)
    assert _history(conn) == [
        (-1000.0, 240.0, "config"),
        (-300.0, 220.0, "node_capacity"),
        (-200.0, 180.0, "node_capacity"),
        (-150.0, 100.0, "config"),
    ]


def test_retention_keeps_the_report_a_rebuild_starts_from(conn: Connection) -> None:
    """a0 reports 6, 4 and 2 GPUs 10, 9 and 8 days ago, and 7 two days ago; retention keeps the
    pool's rows from 7 days ago (its usage window). Of a0's reports before that only the latest,
    2 GPUs, stays: it is in force there. a1's loss three days ago, coming after, is counted
    with a0's 2 GPUs (20 + 40 + 80 = 140 CU), then a0's 7 (190 CU)."""
    day = 86400.0
    _apply(conn, _config(3), -20 * day)
    for gpus, days in ((6, 10), (4, 9), (2, 8), (7, 2)):
        _report(conn, "a0", gpus, -days * day)
    conn.commit()
    deleted = retention_repo.apply_retention(conn, NOW, retention_repo.Retention(rollups_days=1))
    assert (deleted["node_capacity_reports"], deleted["node_config_history"]) == (2, 0)
    reports = conn.execute(
        text(
            "SELECT (extract(epoch FROM reported_at)::float8 - :now) / 86400, gpu_count "
            "FROM node_capacity_reports ORDER BY reported_at"
        ),
        {"now": NOW},
    ).all()
    assert [tuple(r) for r in reports] == [(-8.0, 2), (-2.0, 7)]
    _report(conn, "a1", 4, -3 * day)
    assert [(at / day, cu, source) for at, cu, source in _history(conn)] == [
        (-8.0, 180.0, "node_capacity"),
        (-3.0, 140.0, "node_capacity"),
        (-2.0, 190.0, "node_capacity"),
    ]


def test_a_late_report_of_a_node_removed_since_counts_until_its_removal(
    conn: Connection,
) -> None:
    """a2 down to 0 GPUs at NOW - 300, then removed by a config apply at NOW - 150; its report
    comes after the apply. In time order: 160 CU from NOW - 300, and the removal changes
    nothing. It was refused as of an unknown node (the config of its arrival, not of its time),
    and the pool counted a2's 80 CU until NOW - 150."""
    _apply(conn, _config(3), -1000)
    _apply(conn, _config(2), -150)
    _report(conn, "a2", 0, -300)
    assert _history(conn) == [(-1000.0, 240.0, "config"), (-300.0, 160.0, "node_capacity")]


def test_a_late_report_above_the_node_s_declared_gpus_of_now_counts_until_then(
    conn: Connection,
) -> None:
    """a0 reports 7 usable GPUs at NOW - 300; at NOW - 150 a config apply declares it 6 GPUs;
    the report comes after the apply. In time order: 230 CU from NOW - 300, 220 from NOW - 150.
    It was refused (7 is above the 6 of now), and the pool counted 8 GPUs until NOW - 150."""
    _apply(conn, _config(3), -1000)
    config = _config(3)
    _apply(
        conn,
        replace(config, nodes=(replace(config.nodes[0], gpu_count=6), *config.nodes[1:])),
        -150,
    )
    _report(conn, "a0", 7, -300)
    assert _history(conn) == [
        (-1000.0, 240.0, "config"),
        (-300.0, 230.0, "node_capacity"),
        (-150.0, 220.0, "config"),
    ]
