"""A frozen record filled the fast way: through a plain twin class of the same slots.

A frozen dataclass's constructor sets each field by `object.__setattr__` (its own `__setattr__`
refuses), and setting a slot through its descriptor's `__set__` is a method-wrapper call: about
0.9 k instructions per field either way. The twin `fill_class(cls, names)` makes is a plain class
with exactly `cls`'s slots (same names, hence the same layout: CPython orders slots by name) and
no `__setattr__`, so a builder fills an instance of it by plain attribute stores (a few dozen
instructions each) and then assigns `cls` to its `__class__`: from then on the object *is* a
`cls`, indistinguishable from `cls(*values)` (type, equality, hash, repr, pickling, copying,
`dataclasses.replace`, frozen). The builder must set every field, defaults included.

`fill_class` checks at import what the trick relies on and raises `TypeError` otherwise: `names`
are all of `cls`'s fields in their order; `cls` is a frozen dataclass whose own slots are those
fields alone (no `__weakref__`), without `__post_init__` (the constructor would call it); and a
probe twin filled with one marker per field takes `cls` as its `__class__` (Python refuses when
the layouts differ: other slots, a base with a `__dict__` or slots of its own) and then reads
each marker back from its own field.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any


def fill_class(cls: type[Any], names: tuple[str, ...]) -> type[Any]:
    """The plain twin of frozen dataclass `cls`, whose fields must be `names` in order."""
    declared = tuple(field.name for field in fields(cls))
    if declared != names:
        raise TypeError(f"{cls.__name__} has fields {declared}, not {names}")
    if not (is_dataclass(cls) and cls.__dataclass_params__.frozen):  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__} is not a frozen dataclass")
    if sorted(getattr(cls, "__slots__", ())) != sorted(names):
        raise TypeError(f"{cls.__name__}'s slots are not its fields {names} alone")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has a __post_init__ the fast way would skip")
    twin: type[Any] = type(
        f"{cls.__name__}Fill", (), {"__slots__": names, "__module__": cls.__module__}
    )
    probe = twin()
    markers = [object() for _ in names]
    for name, marker in zip(names, markers, strict=True):
        setattr(probe, name, marker)
    probe.__class__ = cls  # TypeError here when the two layouts differ
    if [getattr(probe, name) for name in names] != markers:
        raise TypeError(f"{cls.__name__}Fill does not lay out {cls.__name__}'s fields")
    return twin
