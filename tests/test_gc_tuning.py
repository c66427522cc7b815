"""The server's garbage-collector settings: startup objects frozen, the young pass less often;
a scheduling cycle run with the collector paused."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from gpufair.gc_tuning import YOUNG_THRESHOLD, collector_paused, tune_for_serving


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_tuning_freezes_what_exists_and_raises_only_the_young_threshold(restored_gc: None) -> None:
    _, older, oldest = gc.get_threshold()
    before = object()  # tracked objects alive now are moved out of the collector's sight
    survivor = [before]
    tune_for_serving()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, older, oldest)
    assert gc.get_freeze_count() > 0
    assert not any(o is survivor for o in gc.get_objects())  # frozen: not in any generation
    later = [object()]
    assert any(o is later for o in gc.get_objects())


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_a_paused_block_runs_uncollected_and_its_reference_cycles_go_after_it() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        first, second = _Node(), _Node()
        first.other, second.other = second, first  # a reference cycle: only the collector frees it
        gone = weakref.ref(first)
        del first, second
        assert gone() is not None
    assert gc.isenabled()
    assert gone() is None  # freed by the one young pass at the end of the block


def test_a_paused_block_leaves_a_collector_that_was_off_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            first = _Node()
            first.other = first
            gone = weakref.ref(first)
            del first
        assert not gc.isenabled()
        assert gone() is not None  # no pass was made: the caller had turned the collector off
    finally:
        gc.enable()
        gc.collect()
