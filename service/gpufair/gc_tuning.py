"""The garbage collector's settings for a long-running server process.

Ingesting a message makes a few objects per event (the domain event, its pod tuples, the tuple
that carries it through the write), none of them in a reference cycle, all freed by reference
counting once the message is committed. CPython's cyclic collector still walks them: it starts a
young-generation pass every 700 net allocations of container objects, and every tenth and
hundredth of those passes walks the older generations, which hold everything the process
imported. Measured in `bench/bench_ingest.py`, that was about 2 µs of the server's 14 µs of CPU
per event. A server therefore moves what it built at startup out of the collector's sight
(`gc.freeze`) and runs the young pass less often; cycles are still collected.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000


def tune_for_serving(young_threshold: int = YOUNG_THRESHOLD) -> None:
    """Call once, after startup: freezes what exists now and sets the young threshold."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(young_threshold, older, oldest)
