"""Topology levels with fallback: a gang goes into the smallest domain that holds it, the next
level up when none does, never past a required level; without a constraint a gang that one node
holds goes there whole. The numbers are GPUs and node names a user would check."""

from __future__ import annotations

from cycle_builders import POOL, bound_uids, queue, running, snapshot, workload

from gpufair.domain.cycle import run_cycle
from gpufair.domain.model import Node, TopologyConstraint, Workload
from gpufair.domain.snapshot import CycleResult, PendingCode
from gpufair.domain.topology import Ladder, ladder

LEVELS = ("nvlink-domain", "rack", "zone")
BIG = {"q": 1000.0}


def _labelled(name: str, nvlink: str, rack: str, zone: str) -> Node:
    labels = {"nvlink-domain": nvlink, "rack": rack, "zone": zone}
    return Node(name, POOL, "unit", 4, 64_000, 512_000, labels)


# 8 nodes of 4 GPUs: zone z1 = rack r1 (nvlink nv1: n1 n2; nv2: n3 n4) + rack r2 (nv3: n5 n6);
# zone z2 = rack r3 (nv4: n7 n8).
NODES = [
    _labelled("n1", "nv1", "r1", "z1"),
    _labelled("n2", "nv1", "r1", "z1"),
    _labelled("n3", "nv2", "r1", "z1"),
    _labelled("n4", "nv2", "r1", "z1"),
    _labelled("n5", "nv3", "r2", "z1"),
    _labelled("n6", "nv3", "r2", "z1"),
    _labelled("n7", "nv4", "r3", "z2"),
    _labelled("n8", "nv4", "r3", "z2"),
]
# One GPU busy on n1 and two on n7: nv1 has 7 free, nv4 6, nv2 and nv3 8 each.
BUSY = [
    running(workload("busy-1", "q"), [("n1", (0,))]),
    running(workload("busy-7", "q", pods=2), [("n7", (0,)), ("n7", (1,))]),
]


def _nodes_of(result: CycleResult, uid: str) -> set[str]:
    (bind,) = [b for b in result.binds if b.workload_uid == uid]
    return {binding.node for binding in bind.bindings}


def _cycle(*pending: Workload, levels: tuple[str, ...] = LEVELS) -> CycleResult:
    return run_cycle(
        snapshot(
            NODES,
            [queue("q", 1000)],
            BIG,
            running_work=BUSY,
            pending=pending,
            topology_levels=levels,
        )
    )


def test_the_ladder_from_pool_levels_and_a_constraint() -> None:
    assert ladder(LEVELS, None) == Ladder(LEVELS, False)
    assert ladder((), None) == Ladder((), False)
    assert ladder(LEVELS, TopologyConstraint("rack", required=True)) == Ladder(
        ("nvlink-domain", "rack"), True
    )
    assert ladder(LEVELS, TopologyConstraint("rack")) == Ladder(LEVELS, False)
    assert ladder(LEVELS, TopologyConstraint("switch", required=True)) == Ladder(("switch",), True)


def test_a_gang_goes_into_the_smallest_domain_that_holds_it() -> None:
    """8 GPUs: an NVLink domain holds it; nv2 and nv3 (8 free each) hold it, nv1 (7) does not.
    Binpack takes the tightest that holds it: both hold exactly 8, the first by name wins."""
    result = _cycle(workload("g8", "q", pods=8))
    assert _nodes_of(result, "g8") == {"n3", "n4"}
    # Without levels binpack fills the fullest nodes first (n7: 2 free, n1: 3, n2: 4) and
    # splits the gang over two NVLink domains in two zones.
    flat = _cycle(workload("g8", "q", pods=8), levels=())
    assert _nodes_of(flat, "g8") == {"n1", "n2", "n7"}


def test_a_gang_no_domain_of_a_level_holds_goes_one_level_up() -> None:
    """12 GPUs: no NVLink domain (8 at most) holds it; rack r1 has 15 free, r2 8, r3 6: r1."""
    result = _cycle(workload("g12", "q", pods=12))
    assert _nodes_of(result, "g12") <= {"n1", "n2", "n3", "n4"}
    assert sum(len(b.bindings) for b in result.binds) == 12
    # 20 GPUs: no rack holds it (15 at most); zone z1 has 23 free: z1, never z2's n7 n8.
    result = _cycle(workload("g20", "q", pods=20))
    assert _nodes_of(result, "g20") <= {"n1", "n2", "n3", "n4", "n5", "n6"}
    # 26 GPUs: no zone holds it (23 at most); the pool (29 free) does.
    result = _cycle(workload("g26", "q", pods=26))
    assert _nodes_of(result, "g26") == {f"n{index}" for index in range(1, 9)}


def test_a_required_level_bounds_the_fallback_and_explain_names_it() -> None:
    """12 GPUs, required within a rack: r1 (15 free) holds it. When a 4-GPU job binds first on
    n2, r1 has 11 free and no rack holds 12 although the pool has 25 free: the gang waits and
    its reason names the topology."""
    rack = TopologyConstraint("rack", required=True)
    result = _cycle(workload("g12", "q", pods=12, topology=rack))
    assert _nodes_of(result, "g12") <= {"n1", "n2", "n3", "n4"}
    filler = workload("filler", "q", pods=4, submit_time_s=-1.0)  # binds first, on n2 (one node)
    result = _cycle(filler, workload("g12", "q", pods=12, topology=rack))
    assert bound_uids(result) == {"filler"}
    assert _nodes_of(result, "filler") == {"n2"}  # the first node with exactly 4 free
    reason = result.pending["g12"]
    assert reason.code is PendingCode.NO_CAPACITY
    assert "no domain of nvlink-domain → rack holds them (required rack" in reason.message
    assert "the roomiest rack domain takes 11 now" in reason.message
    # Preferred instead of required: it goes one level up, into zone z1 (19 free).
    preferred = TopologyConstraint("rack")
    result = _cycle(filler, workload("g12", "q", pods=12, topology=preferred))
    assert bound_uids(result) == {"filler", "g12"}
    assert _nodes_of(result, "g12") <= {"n1", "n3", "n4", "n5", "n6"}


def test_without_a_constraint_a_gang_one_node_holds_goes_there_whole() -> None:
    """4 GPUs: n1 (3 free) and n7 (2 free) are part-full. Binpack alone would take n7's 2 and
    n1's 3 pieces; one node with 4 free holds the gang, so it goes there, and n1, n7 keep their
    room for small jobs."""
    result = _cycle(workload("g4", "q", pods=4), levels=())
    nodes = _nodes_of(result, "g4")
    assert len(nodes) == 1 and not nodes & {"n1", "n7"}
    # 3 GPUs: the part-full n1 (exactly 3 free) is the tightest node that holds it whole.
    result = _cycle(workload("g3", "q", pods=3), levels=())
    assert _nodes_of(result, "g3") == {"n1"}
