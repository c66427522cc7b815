"""Which bound decisions give way to runs and to earlier decisions (domain/overlap.py)."""

from __future__ import annotations

from gpufair.domain.model import PodBinding
from gpufair.domain.overlap import Holding, holds_within, withdrawals


def on(node: str, *gpus: int, fraction: float = 1.0) -> tuple[PodBinding, ...]:
    return (PodBinding(0, node, gpus, fraction),)


def test_a_run_takes_its_gpus_from_a_bind_and_the_bind_gives_way() -> None:
    [w] = withdrawals(
        [Holding("rogue", on("n0", 2, 3))], [Holding("planned", on("n0", *range(8)), 7)]
    )
    assert (w.uid, w.node, w.gpu_index, w.holders) == ("planned", "n0", 2, ("rogue",))
    assert "GPU 2 of node n0" in w.message() and "rogue" in w.message()


def test_the_later_decision_gives_way_whatever_the_order_of_the_rows() -> None:
    early, late = Holding("b-early", on("n0", 0), 3), Holding("a-late", on("n0", 0), 9)
    assert [w.uid for w in withdrawals([], [late, early])] == ["a-late"]
    assert [w.uid for w in withdrawals([], [early, late])] == ["a-late"]
    same_cycle = [Holding("y", on("n0", 1), 4), Holding("x", on("n0", 1), 4)]
    assert [w.uid for w in withdrawals([], same_cycle)] == ["y"]  # then by uid


def test_a_withdrawn_decision_frees_its_gpus_for_the_decisions_after_it() -> None:
    running = [Holding("r", on("n0", 0))]
    bound = [Holding("wide", on("n0", 0, 1), 1), Holding("narrow", on("n0", 1), 2)]
    assert [w.uid for w in withdrawals(running, bound)] == ["wide"]


def test_shared_gpus_overlap_only_beyond_one_whole_gpu() -> None:
    running = [Holding("r1", on("n0", 4, fraction=0.5)), Holding("r2", on("n0", 4, fraction=0.2))]
    fits = Holding("b1", on("n0", 4, fraction=0.3), 1)
    over = Holding("b2", on("n0", 4, fraction=0.1), 2)
    [w] = withdrawals(running, [fits, over])
    assert (w.uid, w.holders) == ("b2", ("r1", "r2", "b1"))


def test_runs_are_never_withdrawn_even_where_they_overlap_each_other() -> None:
    running = [Holding("r1", on("n0", 0)), Holding("r2", on("n0", 0))]
    assert withdrawals(running, []) == []
    # A bind of a workload that has started meanwhile counts as its run only.
    assert withdrawals(running, [Holding("r1", on("n1", 0), 5)]) == []


def test_a_run_holds_within_its_binding_only_on_the_same_gpus_and_shares() -> None:
    binding = (PodBinding(0, "n0", (0, 1), 1.0), PodBinding(1, "n1", (4,), 0.5))
    assert holds_within(on("n0", 1), binding)
    assert holds_within(on("n0", 0, 1) + on("n1", 4, fraction=0.5), binding)
    assert holds_within(on("n1", 4, fraction=0.2) + on("n1", 4, fraction=0.3), binding)
    assert not holds_within(on("n0", 2), binding)  # another GPU of the node
    assert not holds_within(on("n2", 0), binding)  # another node
    assert not holds_within(on("n1", 4), binding)  # a whole GPU where half was bound
    assert not holds_within(on("n1", 4, fraction=0.3) * 2, binding)  # 0.6 of it, together
    assert holds_within((), binding)
