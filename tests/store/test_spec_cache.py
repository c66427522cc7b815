"""The parsed-spec cache under concurrent use: a call that starts the cache over must not take
the entries another call has just loaded (that call failed with KeyError, an INTERNAL error)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Connection

from gpufair.domain.model import Workload
from gpufair.store.workload_repo import SpecCache, spec_digest, spec_json


@dataclass
class Row:
    uid: str
    spec_digest: str
    spec: dict[str, Any]


class FakeConnection:
    """Answers the cache's one query from `stored`; `during` runs inside the query, where
    another RPC thread may get in."""

    def __init__(self, stored: Sequence[Workload], during: Callable[[], None]) -> None:
        self.stored = {w.uid: w for w in stored}
        self.during = during

    def execute(self, _statement: object, params: dict[str, list[str]]) -> list[Row]:
        self.during()
        found = [self.stored[u] for u in params["uids"] if u in self.stored]
        return [Row(w.uid, spec_digest(w), spec_json(w)) for w in found]


def connection(stored: Sequence[Workload], during: Callable[[], None] = lambda: None) -> Connection:
    return cast(Connection, FakeConnection(stored, during))


def keys(batch: Sequence[Workload]) -> list[tuple[str, str]]:
    return [(w.uid, spec_digest(w)) for w in batch]


def test_starting_over_meanwhile_does_not_take_a_calls_entries() -> None:
    cache = SpecCache(limit=2)
    mine = [Workload(uid, "q", "main", 1, 1.0, 1000.0) for uid in ("a", "b")]
    theirs = [Workload(uid, "q", "main", 1, 1.0, 1000.0) for uid in ("c", "d")]
    cache.workloads(connection(mine), keys(mine[:1]))

    def another_call() -> None:
        # One spec cached ("a"), two more would pass the limit: this call starts over.
        cache.workloads(connection(theirs), keys(theirs))

    pending = [another_call]
    during = connection(mine, lambda: pending.pop()() if pending else None)
    assert [w.uid for w in cache.workloads(during, keys(mine))] == ["a", "b"]
    assert [w.uid for w in cache.workloads(connection(theirs), keys(theirs))] == ["c", "d"]
