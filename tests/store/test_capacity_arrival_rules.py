"""Node capacity reports whose outcome once depended on when they arrived, on PostgreSQL: each
case delivered in time (before any config apply later than it) and late (after them), or its two
events in both orders, must end with the same outcomes, reports and capacity rows.

Pool `p` of `test_capacity_history`: nodes of 8 A100 GPUs (10 CU each), made at NOW - 1000.

- A report is judged against its node as configured just before its instant: refused as of an
  unknown node when it was not configured then (added later, or removed before), and when it
  reports more GPUs than the node declared then.
- Two reports of one node at one instant: the fewer usable GPUs count, whichever came first.
- A report at the very instant of a config apply: the apply counts from that instant as the report
  does (the node counts its reported GPUs, never more than the apply declares), the report is
  judged against the config before the apply, and the row there is the apply's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.domain.ledger import EventKind, LedgerEvent
from gpufair.domain.model import ClusterConfig, Node, NodePool
from gpufair.store import ingest_pipeline
from tests.store.ingest_support import NOW
from tests.store.test_capacity_history import _apply, _config, _history

UNKNOWN_A2 = "unknown node 'a2'"


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    with db.connect() as connection:
        yield connection
        connection.rollback()


def _event(node: str, gpus: int, at: float) -> LedgerEvent:
    return LedgerEvent(
        str(uuid.uuid4()), EventKind.NODE_CAPACITY, NOW + at, node=node, gpu_count=gpus
    )


def _send(conn: Connection, event: LedgerEvent) -> tuple[str, str]:
    [outcome] = ingest_pipeline.ingest(conn, [event], NOW)
    return outcome.status.value, outcome.error


def _reports(conn: Connection) -> list[tuple[str, float, int]]:
    rows = conn.execute(
        text(
            "SELECT node, extract(epoch FROM reported_at)::float8 - :now, gpu_count "
            "FROM node_capacity_reports ORDER BY node, reported_at"
        ),
        {"now": NOW},
    ).all()
    return [(n, at, g) for n, at, g in rows]


def _latest(conn: Connection) -> list[tuple[str, int, float]]:
    rows = conn.execute(
        text(
            "SELECT node, gpu_count, extract(epoch FROM changed_at)::float8 - :now "
            "FROM node_capacity ORDER BY node"
        ),
        {"now": NOW},
    ).all()
    return [(n, g, at) for n, g, at in rows]


def _declared(config: ClusterConfig, node: str, gpus: int) -> ClusterConfig:
    return replace(
        config,
        nodes=tuple(replace(n, gpu_count=gpus) if n.name == node else n for n in config.nodes),
    )


def _not_ready(config: ClusterConfig, node: str) -> ClusterConfig:
    return replace(
        config,
        nodes=tuple(replace(n, ready=False) if n.name == node else n for n in config.nodes),
    )


Applies = list[tuple[ClusterConfig, float]]


def _in_time_and_late(
    conn: Connection, applies: Applies, event: LedgerEvent
) -> list[tuple[tuple[str, str], list[tuple[float, float, str]], list[tuple[str, float, int]]]]:
    """The outcome, capacity rows and stored reports with `event` delivered in time (after the
    applies older than it), then late (after all of them)."""
    ends = []
    for late in (False, True):
        outcome = None
        for config, at in applies:
            if outcome is None and not late and NOW + at > event.occurred_at_s:
                outcome = _send(conn, event)
            _apply(conn, config, at)
        if outcome is None:
            outcome = _send(conn, event)
        ends.append((outcome, _history(conn), _reports(conn)))
        conn.rollback()
    return ends


def test_a_report_of_a_node_configured_only_later_is_refused_in_time_and_late(
    conn: Connection,
) -> None:
    """a2 is added at NOW - 150; its report of NOW - 300 is of a node gpufair did not know then.
    It was refused in time and stored late, and counted from a2's addition on (180 CU there,
    instead of the 240 of a2's 8 declared GPUs)."""
    applies = [(_config(2), -1000.0), (_config(3), -150.0)]
    in_time, late = _in_time_and_late(conn, applies, _event("a2", 2, -300))
    expected_rows = [(-1000.0, 160.0, "config"), (-150.0, 240.0, "config")]
    assert in_time == late == (("rejected", UNKNOWN_A2), expected_rows, [])


def test_a_report_of_a_node_removed_before_it_is_refused_even_once_the_node_is_back(
    conn: Connection,
) -> None:
    """a2 is removed at NOW - 500 and added back at NOW - 150; its report of NOW - 300 falls
    between. Refused in time (a2 was not configured); late, it was stored (a2 is configured
    now, and its removal's history row kept its 8 GPUs) and counted from its return on."""
    applies = [(_config(3), -1000.0), (_config(2), -500.0), (_config(3), -150.0)]
    in_time, late = _in_time_and_late(conn, applies, _event("a2", 2, -300))
    expected_rows = [
        (-1000.0, 240.0, "config"),
        (-500.0, 160.0, "config"),
        (-150.0, 240.0, "config"),
    ]
    assert in_time == late == (("rejected", UNKNOWN_A2), expected_rows, [])


def test_a_report_of_a_removed_node_is_refused_late_too(conn: Connection) -> None:
    """a2 removed at NOW - 500: its report of NOW - 300 comes after, in time or not; both are
    refused (late, the removal's history row once admitted it)."""
    applies = [(_config(3), -1000.0), (_config(2), -500.0), (_config(2), -150.0)]
    in_time, late = _in_time_and_late(conn, applies, _event("a2", 0, -300))
    assert in_time == late
    assert in_time[0] == ("rejected", UNKNOWN_A2)


def test_a_report_above_the_gpus_declared_then_is_refused_whatever_is_declared_now(
    conn: Connection,
) -> None:
    """a0 declares 6 GPUs until NOW - 150, then 8; a report of 8 usable GPUs at NOW - 300 is
    more than a0 had then. Refused in time; late, judged by the 8 of now, it was stored."""
    six = _declared(_config(3), "a0", 6)
    applies = [(six, -1000.0), (_config(3), -150.0)]
    in_time, late = _in_time_and_late(conn, applies, _event("a0", 8, -300))
    assert in_time == late
    assert in_time[0] == ("rejected", "gpu_count must be between 0 and the node's 6 GPUs")
    assert in_time[2] == []


def test_a_report_of_a_node_not_ready_then_is_stored_in_time_and_late(conn: Connection) -> None:
    """a2 is not ready from NOW - 500 to NOW - 150: it is configured, so its report of NOW - 300
    (4 GPUs) is stored either way and counts from its return (200 CU)."""
    applies = [
        (_config(3), -1000.0),
        (_not_ready(_config(3), "a2"), -500.0),
        (_config(3), -150.0),
    ]
    in_time, late = _in_time_and_late(conn, applies, _event("a2", 4, -300))
    expected_rows = [
        (-1000.0, 240.0, "config"),
        (-500.0, 160.0, "config"),
        (-150.0, 200.0, "config"),
    ]
    assert in_time == late == (("stored", ""), expected_rows, [("a2", -300.0, 4)])


def test_a_report_of_a_node_removed_while_not_ready_is_refused_late_too(conn: Connection) -> None:
    """a2 is made not ready at NOW - 700 and removed at NOW - 500 (its removal changes no
    capacity): its report of NOW - 300 is refused, in time and late."""
    applies = [
        (_config(3), -1000.0),
        (_not_ready(_config(3), "a2"), -700.0),
        (_config(2), -500.0),
        (_config(2), -150.0),
    ]
    in_time, late = _in_time_and_late(conn, applies, _event("a2", 4, -300))
    assert in_time == late
    assert in_time[0] == ("rejected", UNKNOWN_A2)


@pytest.mark.parametrize("later", [False, True], ids=["last", "before-a-later-report"])
def test_two_reports_of_one_node_at_one_instant_count_the_fewer_gpus_in_either_order(
    conn: Connection, later: bool
) -> None:
    """a0 reports 6 and 4 usable GPUs, both at NOW - 300 (with, when `later`, its report of 7
    at NOW - 100 in first, so both come late). The 4 count, in either order: the lower of two
    readings of one instant is the one no workload is promised GPUs that may not be there."""
    ends = []
    for first, second in ((6, 4), (4, 6)):
        _apply(conn, _config(3), -1000)
        if later:
            assert _send(conn, _event("a0", 7, -100)) == ("stored", "")
        assert _send(conn, _event("a0", first, -300)) == ("stored", "")
        assert _send(conn, _event("a0", second, -300)) == ("stored", "")
        ends.append((_history(conn), _reports(conn), _latest(conn)))
        conn.rollback()
    assert ends[0] == ends[1]
    history, reports, _latest_report = ends[0]
    assert ("a0", -300.0, 4) in reports
    assert history[:2] == [(-1000.0, 240.0, "config"), (-300.0, 200.0, "node_capacity")]
    if not later:
        assert ends[0][2] == [("a0", 4, -300.0)]


def test_two_reports_of_one_node_at_one_instant_one_in_time_one_late(conn: Connection) -> None:
    """a0's 6 at NOW - 300 comes in time, a1's 4 at NOW - 200 after it, then a0's 4 at NOW - 300
    (late); and the other way round: 4 first, the 6 late. Both give the rows of the 4."""
    ends = []
    for first, second in ((6, 4), (4, 6)):
        _apply(conn, _config(3), -1000)
        assert _send(conn, _event("a0", first, -300)) == ("stored", "")
        assert _send(conn, _event("a1", 4, -200)) == ("stored", "")
        assert _send(conn, _event("a0", second, -300)) == ("stored", "")
        ends.append((_history(conn), _reports(conn), _latest(conn)))
        conn.rollback()
    assert ends[0] == ends[1]
    assert ends[0][0] == [
        (-1000.0, 240.0, "config"),
        (-300.0, 200.0, "node_capacity"),
        (-200.0, 160.0, "node_capacity"),
    ]


def _two_pools(nodes: int) -> ClusterConfig:
    config = _config(nodes)
    return replace(
        config,
        pools=(NodePool("p"), NodePool("r")),
        nodes=(*config.nodes, Node("r0", "r", "a100", 8, 64000, 512000)),
    )


SAME_INSTANT = {
    # name: (config applied at NOW - 300, the report at NOW - 300)
    "declared-fewer": (_declared(_config(3), "a0", 6), ("a0", 7)),
    "declared-more": (_declared(_config(3), "a0", 8), ("a0", 7)),
    "added": (_config(3), ("a2", 4)),
    "removed": (_config(1), ("a1", 4)),
    "not-ready": (_not_ready(_config(3), "a0"), ("a0", 4)),
    "other-pool": (_declared(_two_pools(3), "r0", 4), ("a0", 6)),
}


@pytest.mark.parametrize("case", sorted(SAME_INSTANT))
def test_a_report_at_the_instant_of_a_config_apply_in_either_order(
    conn: Connection, case: str
) -> None:
    """A config apply at NOW - 300 and a report stamped NOW - 300, in both orders, with a later
    report of a1 after (the report then comes in time, and late in a rebuild): one outcome, one
    history. The report is judged against the config before the apply (7 GPUs of a0 declared 8
    then are admitted, a2 added at the instant is not known yet); the row at the instant counts
    both, and is the apply's."""
    config, (node, gpus) = SAME_INSTANT[case]
    before = _declared(_config(3), "a0", 6) if case == "declared-more" else _config(3)
    if case == "added":
        before = _config(2)
    if case == "other-pool":
        before = _two_pools(3)
    ends = []
    for report_first in (True, False):
        for later in (False, True):
            _apply(conn, before, -1000)
            event = _event(node, gpus, -300)
            if later:
                assert _send(conn, _event("a0", 5, -100))[0] == "stored"
            if report_first:
                outcome = _send(conn, event)
                _apply(conn, config, -300)
            else:
                _apply(conn, config, -300)
                outcome = _send(conn, event)
            if not later:
                assert _send(conn, _event("a0", 5, -100))[0] == "stored"
            ends.append((outcome, _history(conn), _reports(conn)))
            conn.rollback()
    assert all(end == ends[0] for end in ends), ends
    outcome, history, _ = ends[0]
    expected = {
        "declared-fewer": ("stored", "", 220.0),  # 6 of the 7 count
        "declared-more": ("rejected", "gpu_count must be between 0 and the node's 6 GPUs", 240.0),
        "added": ("rejected", UNKNOWN_A2, 240.0),
        "removed": ("stored", "", 80.0),
        "not-ready": ("stored", "", 160.0),
        "other-pool": ("stored", "", 220.0),
    }[case]
    assert outcome == expected[:2]
    assert (-300.0, expected[2], "config") in history
