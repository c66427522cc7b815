"""The set of workloads a server has seen to exist: bounded, and only what was seen."""

from __future__ import annotations

from gpufair.store.known_workloads import KnownWorkloads


def test_remembers_what_it_is_given() -> None:
    known = KnownWorkloads(limit=10)
    known.add(["a", "b"])
    known.add(["b", "c"])
    assert ("a" in known, "c" in known, "d" in known, len(known)) == (True, True, False, 3)


def test_starts_over_when_full() -> None:
    known = KnownWorkloads(limit=3)
    known.add(["a", "b", "c"])
    known.add(["c", "d"])  # "c" is known already: only "d" is new, and it does not fit
    assert sorted(u for u in "abcd" if u in known) == ["d"]
    known.add([f"w{i}" for i in range(5)])  # more than the limit at once: the first ones
    assert len(known) == 3 and "w0" in known and "w4" not in known


def test_unknown_are_those_not_seen() -> None:
    known = KnownWorkloads(limit=10)
    known.add(["a", "b"])
    assert known.unknown({"a", "c", "d"}) == {"c", "d"}
    assert known.unknown({"a", "b"}) == set()
    assert KnownWorkloads(0).unknown({"a"}) == {"a"}  # a set that keeps nothing knows nothing
