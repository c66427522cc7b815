"""Errors the domain raises; the API maps each to one gRPC status (see api/errors.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Violation:
    """One problem with one field, named by its path in the request (`queues[2].parent`)."""

    field: str
    description: str


class DomainError(Exception):
    """Base of errors about what a caller sent or asked for."""


class InvalidInput(DomainError):
    """The request is malformed; every problem is listed, nothing was written."""

    def __init__(self, violations: Sequence[Violation]) -> None:
        self.violations = tuple(violations)
        summary = "; ".join(f"{v.field}: {v.description}" for v in self.violations[:5])
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
