"""The rules of `api/read_cache.py` on their own, with a clock the test moves: when a call is
answered from memory, when it waits for a check, and what a check ahead of time does."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable

import pytest

from gpufair.api.read_cache import ReadCache
from gpufair.api.work_slots import WorkSlots
from gpufair.store.commit_watch import CommitCount
from gpufair.store.deadline import DeadlineExceeded


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Store:
    """What the checks read: a version, and a reply built per version."""

    def __init__(self) -> None:
        self.version = 1
        self.checks = 0
        self.builds = 0
        self.checked = threading.Event()

    def refresh(self, held: Hashable) -> tuple[Hashable, str | None]:
        self.checks += 1
        self.checked.set()
        if held == self.version:
            return self.version, None
        self.builds += 1
        return self.version, f"reply {self.version}"


def test_within_the_bound_calls_are_answered_from_memory() -> None:
    clock, store = Clock(), Store()
    cache: ReadCache[str, str] = ReadCache(staleness_s=0.02, max_age_s=5.0, monotonic=clock)
    assert cache.get("p", store.refresh) == "reply 1"
    store.version = 2  # committed elsewhere
    clock.now += 0.009  # under half the bound: no check at all
    assert [cache.get("p", store.refresh) for _ in range(50)] == ["reply 1"] * 50
    assert (store.checks, store.builds) == (1, 1)

    clock.now += 0.012  # 21 ms after the last check: past the bound, the call checks itself
    assert cache.get("p", store.refresh) == "reply 2"
    assert (store.checks, store.builds) == (2, 2)
    cache.close()


def test_past_half_the_bound_the_cache_checks_ahead_and_the_call_does_not_wait() -> None:
    clock, store = Clock(), Store()
    cache: ReadCache[str, str] = ReadCache(staleness_s=0.02, max_age_s=5.0, monotonic=clock)
    cache.get("p", store.refresh)
    store.checked.clear()
    store.version = 2
    clock.now += 0.015  # past half: answered from memory, checked on the cache's thread
    assert cache.get("p", store.refresh) == "reply 1"
    assert store.checked.wait(5)
    deadline = time.monotonic() + 5
    while cache.get("p", store.refresh) != "reply 2" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cache.get("p", store.refresh) == "reply 2"
    assert store.builds == 2
    cache.close()


def test_a_commit_of_this_process_makes_the_next_call_check() -> None:
    clock, store, commits = Clock(), Store(), CommitCount()
    cache: ReadCache[str, str] = ReadCache(
        commits, staleness_s=60.0, max_age_s=600.0, monotonic=clock
    )
    assert cache.get("p", store.refresh) == "reply 1"
    store.version = 2
    assert cache.get("p", store.refresh) == "reply 1"  # a minute's bound, nothing committed here
    commits.bump()
    assert cache.get("p", store.refresh) == "reply 2"
    assert cache.get("p", store.refresh) == "reply 2"
    assert (store.checks, store.builds) == (2, 2)
    cache.close()


def test_a_reply_is_rebuilt_after_its_max_age_even_when_the_key_stays() -> None:
    clock, store = Clock(), Store()
    cache: ReadCache[str, str] = ReadCache(staleness_s=60.0, max_age_s=1.0, monotonic=clock)
    cache.get("p", store.refresh)
    clock.now += 1.5
    assert cache.get("p", store.refresh) == "reply 1"
    assert (store.checks, store.builds) == (2, 2)  # same key, built again
    cache.close()


def test_a_failed_build_leaves_no_entry() -> None:
    clock = Clock()
    cache: ReadCache[str, str] = ReadCache(monotonic=clock)

    def missing(_held: Hashable) -> tuple[Hashable, str | None]:
        raise LookupError("no such pool")

    for _ in range(2):
        with pytest.raises(LookupError, match="no such pool"):
            cache.get("nope", missing)
    assert cache.get("nope", lambda _held: (1, "now it exists")) == "now it exists"
    cache.close()


def test_a_reply_from_memory_waits_for_no_work_slot_and_a_check_waits_for_one() -> None:
    clock, store, slots = Clock(), Store(), WorkSlots(1)
    cache: ReadCache[str, str] = ReadCache(
        staleness_s=0.02, max_age_s=5.0, monotonic=clock, slots=slots
    )
    assert cache.get("p", store.refresh, lambda: 1.0) == "reply 1"
    with slots.held(None):  # every slot busy with database work
        clock.now += 0.005
        assert [cache.get("p", store.refresh, lambda: 0.0) for _ in range(20)] == ["reply 1"] * 20
        clock.now += 0.05  # past the bound: this call must check, and no slot frees in time
        with pytest.raises(DeadlineExceeded, match="work slot"):
            cache.get("p", store.refresh, lambda: 0.05)
        assert (store.checks, store.builds) == (1, 1)
    # The slot is free again: the entry was kept, so the check confirms it and builds nothing.
    assert cache.get("p", store.refresh, lambda: 1.0) == "reply 1"
    assert (store.checks, store.builds) == (2, 1)
    cache.close()


class Listener:
    """What the cache reads of `KeyNotices`: when it last confirmed the count."""

    def __init__(self, confirmed_at: float) -> None:
        self.confirmed_at = confirmed_at


def test_the_listeners_confirmations_keep_an_entry_current_past_its_own_check() -> None:
    """With the listener confirming every 0.25 s, an entry checked once is served for minutes
    without a check; a notification (a bump of the count) makes the next call check; and if the
    listener stops confirming, the call 1 s after its last confirmation checks itself."""
    clock, store, commits = Clock(), Store(), CommitCount()
    listener = Listener(clock.now)
    cache: ReadCache[str, str] = ReadCache(
        commits,
        staleness_s=1.0,
        max_age_s=600.0,
        monotonic=clock,
        notices=listener,  # type: ignore[arg-type]
    )
    assert cache.get("p", store.refresh) == "reply 1"
    for _ in range(240):  # a minute of confirmations, 0.25 s apart
        clock.now += 0.25
        listener.confirmed_at = clock.now
        assert cache.get("p", store.refresh) == "reply 1"
    assert (store.checks, store.builds) == (1, 1)

    store.version = 2
    commits.bump()  # the notification of the commit that made version 2
    assert cache.get("p", store.refresh) == "reply 2"
    assert (store.checks, store.builds) == (2, 2)

    store.version = 3  # committed, but no notification comes: the listener went quiet
    clock.now += 0.4
    assert cache.get("p", store.refresh) == "reply 2"  # within the bound
    assert store.checks == 2
    clock.now += 0.61  # 1.01 s after the last confirmation (and the last check)
    assert cache.get("p", store.refresh) == "reply 3"
    assert (store.checks, store.builds) == (3, 3)
    cache.close()
