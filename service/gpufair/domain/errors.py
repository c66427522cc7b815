"""Errors the domain raises; the API maps each to one gRPC status (see api/errors.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple


class Violation(NamedTuple):
    """One problem with one field, named by its path (`queues[2].parent`): relative to the object
    a domain function was given; the API prefixes where that object sits in the request."""

    field_path: str
    message: str


class DomainError(Exception):
    """Base of errors about what a caller sent or asked for."""


class InvalidInputError(DomainError, ValueError):
    """Input that fails validation; every problem is listed, nothing was written."""

    def __init__(self, violations: Iterable[Violation]) -> None:
        self.violations = tuple(violations)
        summary = "; ".join(f"{v.field_path}: {v.message}" for v in self.violations[:5])
        more = len(self.violations) - 5
        super().__init__(summary + (f"; and {more} more" if more > 0 else ""))


class NotFound(DomainError):
    def __init__(self, kind: str, name: str) -> None:
        self.kind = kind
        self.name = name
        super().__init__(f"{kind} {name!r} not found")


class FailedPrecondition(DomainError):
    """The request is well formed but the stored state does not allow it now."""


class Conflict(DomainError):
    """The request contradicts something already stored (e.g. an idempotency key reused)."""
