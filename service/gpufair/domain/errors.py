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
        from gpufair.domain.limits import summary  # limits imports Violation from here

        self.violations = tuple(violations)
        super().__init__(summary(self.violations))


class NotFound(DomainError):
    """An object named in a request does not exist; the message quotes at most a short prefix
    of the name (a megabyte of name must not come back as a megabyte of status)."""

    def __init__(self, kind: str, name: str) -> None:
        from gpufair.domain.limits import echo

        self.kind = kind
        self.name = name
        super().__init__(f"{kind} {echo(name)} not found")


class FailedPrecondition(DomainError):
    """The request is well formed but the stored state does not allow it now."""


class Conflict(DomainError):
    """The request contradicts something already stored (e.g. an idempotency key reused)."""
