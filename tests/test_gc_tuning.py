"""The server's garbage-collector settings: startup objects frozen, the young pass less often."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gpufair.gc_tuning import YOUNG_THRESHOLD, tune_for_serving


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
