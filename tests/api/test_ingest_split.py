"""How a stream divides the preparation of its next message between the COPY and the writes."""

from __future__ import annotations

import pytest

from gpufair.api.ingest import _Split


def test_share_moves_toward_the_longer_wait_and_stays_within_bounds() -> None:
    split = _Split(0.5)
    split.update(copy_wait_s=0.004, writes_wait_s=0.001)  # idle during the COPY: do more there
    assert split.share == pytest.approx(0.55)
    split.update(copy_wait_s=0.0, writes_wait_s=0.002)
    split.update(copy_wait_s=0.0, writes_wait_s=0.002)
    assert split.share == pytest.approx(0.45)
    split.update(copy_wait_s=0.001, writes_wait_s=0.001)  # balanced: stays
    assert split.share == pytest.approx(0.45)
    for _ in range(30):
        split.update(copy_wait_s=0.003, writes_wait_s=0.0)
    assert split.share == 1.0
    for _ in range(30):
        split.update(copy_wait_s=0.0, writes_wait_s=0.003)
    assert split.share == 0.0
