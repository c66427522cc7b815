"""Reading a client stream ahead: messages in order, "not yet" without waiting, the end and the
errors of the stream where they occur."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from gpufair.api.prefetch import Pending, Prefetch


def test_messages_in_order_then_the_end_every_time() -> None:
    inbox = Prefetch(iter(["a", "b", "c"]))
    assert [inbox.take(wait=True) for _ in range(3)] == ["a", "b", "c"]
    assert inbox.take(wait=True) is None
    assert inbox.take(wait=False) is None
    inbox.close()


def test_not_yet_until_the_client_sends() -> None:
    gate = threading.Event()

    def slow() -> Iterator[str]:
        gate.wait(10)
        yield "late"

    inbox = Prefetch(slow())
    assert inbox.take(wait=False) is Pending.NOT_YET
    gate.set()
    assert inbox.take(wait=True) == "late"
    assert inbox.take(wait=True) is None


def test_what_broke_the_stream_is_raised_after_what_came_before() -> None:
    def broken() -> Iterator[str]:
        yield "first"
        raise ConnectionError("client went away")

    inbox = Prefetch(broken())
    assert inbox.take(wait=True) == "first"
    with pytest.raises(ConnectionError, match="client went away"):
        inbox.take(wait=True)


def test_close_stops_reading_ahead() -> None:
    pulled: list[int] = []

    def endless() -> Iterator[int]:
        n = 0
        while True:
            pulled.append(n)
            yield n
            n += 1

    inbox = Prefetch(endless())
    assert inbox.take(wait=True) == 0
    inbox.close()
    inbox._thread.join(timeout=5)
    assert not inbox._thread.is_alive()
    assert len(pulled) <= 4  # one in hand, one queued, one waiting to be queued
