"""The difference between a stored and a desired cluster config, object by object and field by field.

`ApplyConfig` shows this diff (also on dry runs) and writes only what it lists, so applying the same
config twice changes nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from gpufair.domain.model import Budget, ClusterConfig


class ChangeAction(enum.StrEnum):
    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class FieldChange:
    field: str
    before: str
    after: str


@dataclass(frozen=True, slots=True)
class ConfigChange:
    kind: str  # gpu_type, pool, node, queue, budget
    name: str
    action: ChangeAction
    fields: tuple[FieldChange, ...] = ()


# Kinds in the order objects may be created; deletes go the other way.
KINDS = ("gpu_type", "pool", "node", "queue", "budget")
# Fields that describe storage, not intent: never part of a diff.
_IGNORED_FIELDS = {"created_at_s"}


def budget_key(budget: Budget) -> str:
    return f"{budget.queue}/{budget.period.value}/{budget.pool or '*'}"


def objects_by_kind(config: ClusterConfig) -> dict[str, dict[str, object]]:
    """Each kind's objects by name (budgets by `queue/period/pool`)."""
    return {
        "gpu_type": {t.name: t for t in config.gpu_types},
        "pool": {p.name: p for p in config.pools},
        "node": {n.name: n for n in config.nodes},
        "queue": {q.name: q for q in config.queues},
        "budget": {budget_key(b): b for b in config.budgets},
    }


def render(value: object) -> str:
    """A stable, readable rendering of a field value for diffs and tables."""
    if value is None:
        return ""
    if isinstance(value, bool):  # as a config file and the API's JSON write it
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={render(v)}" for k, v in sorted(value.items()))
    return str(value)


def _flatten(value: object, prefix: str) -> Iterator[tuple[str, object]]:
    if is_dataclass(value) and not isinstance(value, type):
        for f in fields(value):
            if f.name in _IGNORED_FIELDS:
                continue
            yield from _flatten(getattr(value, f.name), f"{prefix}.{f.name}" if prefix else f.name)
    elif isinstance(value, Mapping) and value and all(is_dataclass(v) for v in value.values()):
        for key in sorted(value):
            yield from _flatten(value[key], f"{prefix}[{key}]")
    elif isinstance(value, tuple) and value and all(is_dataclass(v) for v in value):
        for i, item in enumerate(value):
            yield from _flatten(item, f"{prefix}[{i}]")
    else:
        yield prefix, value


def field_changes(before: object, after: object) -> tuple[FieldChange, ...]:
    old: dict[str, Any] = dict(_flatten(before, ""))
    new: dict[str, Any] = dict(_flatten(after, ""))
    changes = []
    for path in sorted(old.keys() | new.keys()):
        if old.get(path) != new.get(path):
            changes.append(FieldChange(path, render(old.get(path)), render(new.get(path))))
    return tuple(changes)


def diff_configs(stored: ClusterConfig, desired: ClusterConfig) -> list[ConfigChange]:
    """What must change to turn `stored` into `desired`: creates and updates in dependency order,
    then deletes in reverse dependency order."""
    old, new = objects_by_kind(stored), objects_by_kind(desired)
    upserts: list[ConfigChange] = []
    deletes: list[ConfigChange] = []
    for kind in KINDS:
        for name in sorted(new[kind]):
            if name not in old[kind]:
                upserts.append(ConfigChange(kind, name, ChangeAction.CREATE))
            else:
                changed = field_changes(old[kind][name], new[kind][name])
                if changed:
                    upserts.append(ConfigChange(kind, name, ChangeAction.UPDATE, changed))
    for kind in reversed(KINDS):
        for name in sorted(old[kind].keys() - new[kind].keys()):
            deletes.append(ConfigChange(kind, name, ChangeAction.DELETE))
    return upserts + deletes
