"""The garbage collector's settings for a long-running server process.

Ingesting a message makes a few objects per event (the domain event, its pod tuples, the tuple
that carries it through the write), none of them in a reference cycle, all freed by reference
counting once the message is committed. CPython's cyclic collector still walks them: it starts a
young-generation pass every 700 net allocations of container objects, and every tenth and
hundredth of those passes walks the older generations, which hold everything the process
imported. Measured in `bench/bench_ingest.py`, that was about 2 µs of the server's 14 µs of CPU
per event. A server therefore moves what it built at startup out of the collector's sight
(`gc.freeze`) and runs the young pass less often; cycles are still collected.

A scheduling cycle is the other case (`collector_paused`): it builds hundreds of thousands of
objects (a record per running and pending workload, per pod placed, per decision) that all live
until the cycle ends, so every young pass it triggers finds nothing to free, and every tenth
and hundredth pass walks the older generations, which by then hold the cycle's own records and
the snapshot's rows. At 4,000 nodes that walking cost as much as a third of the cycle, more the
bigger the pool (`bench/results/cycle.md`). The service and the simulator therefore run a cycle
with the collector paused and make one young pass after it, which frees whatever cycle of
references the cycle left behind.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 50_000


def tune_for_serving(young_threshold: int = YOUNG_THRESHOLD) -> None:
    """Call once, after startup: freezes what exists now and sets the young threshold."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(young_threshold, older, oldest)


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off for the block (if it was on), then one young-generation pass.
    Reference counting still frees what the block drops; only reference cycles wait for the
    pass at the end. Process-wide, like every collector setting: other threads of the process
    are not collected meanwhile either, which for a cycle's second or so costs them nothing."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect(0)
