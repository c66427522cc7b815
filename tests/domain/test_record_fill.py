"""Records built the fast way (`record_fill`: a plain twin filled, then given the frozen class)
are the values their constructors build, in every way a caller can look at one, and stay
frozen; `fill_class` refuses, at import, a class the trick would not copy faithfully."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from gpufair.domain.decisions import (
    bind_decision,
    evict_decision,
    evicted_capacity,
    pending_reason,
)
from gpufair.domain.model import PodBinding, pod_binding
from gpufair.domain.record_fill import fill_class
from gpufair.domain.snapshot import (
    BindDecision,
    EvictDecision,
    EvictReason,
    PendingCode,
    PendingReason,
    Reservation,
    ReservationKind,
)

_BINDINGS = (PodBinding(0, "n0", (1, 2)), PodBinding(1, "n1", (0,), 0.5, 3))

# (fast build, the constructor's value of the same arguments): every field a distinct value,
# so a builder that sets one field from another's argument differs.
CASES: dict[str, tuple[Callable[[], Any], Any]] = {
    "PodBinding whole GPUs": (
        lambda: pod_binding(2, "n7", (3, 4), 1.0, None),
        PodBinding(pod_index=2, node="n7", gpu_indices=(3, 4)),
    ),
    "PodBinding partition": (
        lambda: pod_binding(0, "n1", (5,), 0.25, 3),
        PodBinding(pod_index=0, node="n1", gpu_indices=(5,), gpu_fraction=0.25, partition_start=3),
    ),
    "BindDecision": (
        lambda: bind_decision("w1", "team-a", "a100", _BINDINGS, 20.0, True),
        BindDecision(
            workload_uid="w1",
            queue="team-a",
            gpu_type="a100",
            bindings=_BINDINGS,
            cu=20.0,
            over_fair_share=True,
        ),
    ),
    "Reservation": (
        lambda: evicted_capacity("w2", "v100", ("n0", "n1"), _BINDINGS),
        Reservation(
            workload_uid="w2",
            kind=ReservationKind.EVICTED_CAPACITY,
            gpu_type="v100",
            nodes=("n0", "n1"),
            held=_BINDINGS,
        ),
    ),
    "Reservation of one pod": (
        lambda: evicted_capacity("w3", "h100", ("n9",), (pod_binding(0, "n9", (6,), 0.5, 2),)),
        Reservation(
            "w3",
            ReservationKind.EVICTED_CAPACITY,
            "h100",
            ("n9",),
            (PodBinding(0, "n9", (6,), 0.5, 2),),
        ),
    ),
    "EvictDecision": (
        lambda: evict_decision("v1", "team-b", EvictReason.RECLAIM, "why", "w1", 4.0),
        EvictDecision(
            workload_uid="v1",
            queue="team-b",
            reason=EvictReason.RECLAIM,
            message="why",
            beneficiary_uid="w1",
            cu=4.0,
        ),
    ),
    "PendingReason": (
        lambda: pending_reason(PendingCode.NO_CAPACITY, "needs 8 GPUs"),
        PendingReason(code=PendingCode.NO_CAPACITY, message="needs 8 GPUs"),
    ),
}


def _built(case: str) -> tuple[Any, Any]:
    fast, plain = CASES[case]
    return fast(), plain


@pytest.mark.parametrize("case", CASES)
def test_same_class_and_fields(case: str) -> None:
    made, plain = _built(case)
    cls = type(plain)
    assert type(made) is cls
    assert isinstance(made, cls)
    assert made.__class__ is cls
    assert dataclasses.fields(made) == dataclasses.fields(plain)
    for field in dataclasses.fields(cls):
        assert getattr(made, field.name) == getattr(plain, field.name), field.name
    assert dataclasses.asdict(made) == dataclasses.asdict(plain)
    assert made == plain
    assert plain == made
    assert repr(made) == repr(plain)


@pytest.mark.parametrize("case", CASES)
def test_same_hash(case: str) -> None:
    made, plain = _built(case)
    if isinstance(plain, BindDecision):  # its `gpus_by_type` is a dict: unhashable, as built
        with pytest.raises(TypeError):
            hash(made)
        with pytest.raises(TypeError):
            hash(plain)
    else:
        assert hash(made) == hash(plain)
        assert {made: 1}[plain] == 1


@pytest.mark.parametrize("case", CASES)
def test_pickle_and_copies_give_the_same_value(case: str) -> None:
    made, plain = _built(case)
    cls = type(plain)
    for again in (
        pickle.loads(pickle.dumps(made)),
        pickle.loads(pickle.dumps(made, protocol=0)),
        copy.copy(made),
        copy.deepcopy(made),
    ):
        assert type(again) is cls
        assert again == plain
        assert repr(again) == repr(plain)
    assert pickle.dumps(made) == pickle.dumps(plain)


@pytest.mark.parametrize("case", CASES)
def test_replace_gives_the_constructors_value(case: str) -> None:
    made, plain = _built(case)
    first = dataclasses.fields(plain)[0].name
    changed = dataclasses.replace(made, **{first: getattr(plain, first)})
    assert type(changed) is type(plain)
    assert changed == plain
    assert changed is not made


@pytest.mark.parametrize("case", CASES)
def test_still_frozen(case: str) -> None:
    made, plain = _built(case)
    for field in dataclasses.fields(plain):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(made, field.name, getattr(plain, field.name))
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(made, field.name)
    with pytest.raises((AttributeError, TypeError)):
        made.extra = 1
    assert made == plain


def test_a_fresh_default_mapping_per_bind() -> None:
    one = bind_decision("w1", "q", "a100", (), 1.0, False)
    other = bind_decision("w2", "q", "a100", (), 1.0, False)
    assert one.gpus_by_type == {} and other.gpus_by_type == {}
    assert one.gpus_by_type is not other.gpus_by_type


@dataclasses.dataclass(frozen=True, slots=True)
class _Pair:
    left: int
    right: str = ""


def test_fill_class_makes_a_twin_that_becomes_the_class() -> None:
    twin = fill_class(_Pair, ("left", "right"))
    assert twin is not _Pair
    record = twin()
    record.left = 7
    record.right = "r"
    record.__class__ = _Pair
    assert type(record) is _Pair
    assert record == _Pair(7, "r")
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.left = 8  # type: ignore[misc]


def test_fill_class_refuses_other_field_lists() -> None:
    with pytest.raises(TypeError, match="has fields"):
        fill_class(_Pair, ("right", "left"))
    with pytest.raises(TypeError, match="has fields"):
        fill_class(_Pair, ("left",))


@dataclasses.dataclass(slots=True)
class _Mutable:
    left: int


@dataclasses.dataclass(frozen=True)
class _WithDict:
    left: int


@dataclasses.dataclass(frozen=True, slots=True, weakref_slot=True)
class _WithWeakref:
    left: int


@dataclasses.dataclass(frozen=True, slots=True)
class _WithPostInit:
    left: int

    def __post_init__(self) -> None:  # a check the fast way would skip
        if self.left < 0:
            raise ValueError("left must not be negative")


@dataclasses.dataclass(frozen=True, slots=True)
class _Derived(_Pair):
    extra: int = 0


@pytest.mark.parametrize(
    ("cls", "names"),
    [
        (_Mutable, ("left",)),
        (_WithDict, ("left",)),
        (_WithWeakref, ("left",)),
        (_WithPostInit, ("left",)),
        (_Derived, ("left", "right", "extra")),
    ],
)
def test_fill_class_refuses_what_it_would_not_copy(cls: type[Any], names: tuple[str, ...]) -> None:
    with pytest.raises(TypeError):
        fill_class(cls, names)
