"""Workloads a server has seen to exist, so that a heartbeat of running work needs no lookup.

A heartbeat needs nothing of its workload but that it exists, and in a busy cluster nearly every
event is one: without this, each would cost an index probe in the batch's reads. Workloads are
never deleted, so a uid seen once stays true. One set per server (per database): tests and tools
that point one process at several databases keep one per engine.
"""

from __future__ import annotations

from collections.abc import Iterable

DEFAULT_LIMIT = 200_000  # about 20 MB of uids; beyond it the set starts over


class KnownWorkloads:
    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self._uids: set[str] = set()
        self._limit = limit

    def __contains__(self, uid: object) -> bool:
        return uid in self._uids

    def __len__(self) -> int:
        return len(self._uids)

    def unknown(self, uids: set[str]) -> set[str]:
        """Those of `uids` not known to exist (a set difference, in C)."""
        return uids - self._uids

    def add(self, uids: Iterable[str]) -> None:
        """Remember `uids`, seen to exist. Past the limit the set is emptied first: the cost is
        one lookup per workload the next time it reports, and no bookkeeping per hit."""
        fresh = [u for u in uids if u not in self._uids]
        if len(self._uids) + len(fresh) > self._limit:
            self._uids.clear()
        self._uids.update(fresh[: self._limit])
