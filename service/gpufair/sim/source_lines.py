"""YAML read with the line of every field, so a scenario error names the line and the field.

A field path is written as in the rest of gpufair: `generators[2].duration_s`,
`cluster.queues[0].quotas[1].deserved_cu`. `SourceLines.line_of(path)` gives the 1-based line of
the deepest part of the path that exists in the document: a misspelt key points at its own line,
a bad value at the line of its key, a problem with a list item at the item's first line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import yaml

# One step of a field path: `.name`, `name` at the start, or `[index]`/`["key"]`/`[key]`.
_STEP_RE = re.compile(r"\.?([^.\[\]]+)|\[([^\]]*)\]")


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a scenario: where (field path, line if known) and why."""

    path: str
    message: str
    line: int | None = None
    source: str | None = None  # another file than the scenario's (a cluster_file)


class ScenarioError(ValueError):
    """A scenario that cannot be simulated; every problem found is listed with its line."""

    def __init__(self, source: str, problems: Iterable[Problem]) -> None:
        self.source = source
        self.problems = tuple(problems)
        lines = []
        for p in self.problems:
            where = p.source or source
            if p.line is not None:
                where += f":{p.line}"
            lines.append(f"{where}: {p.path}: {p.message}")
        super().__init__("\n".join(lines))


def path_steps(path: str) -> list[str]:
    """`a.b[0]["c"]` -> ["a", "b", "0", "c"]."""
    steps = []
    for match in _STEP_RE.finditer(path):
        name, index = match.groups()
        steps.append(name if name is not None else index.strip("\"'"))
    return steps


def join_path(steps: Iterable[str | int]) -> str:
    """The inverse of `path_steps`, with list indices in brackets: ("a", 0, "b") -> a[0].b."""
    out = ""
    for step in steps:
        if isinstance(step, int):
            out += f"[{step}]"
        else:
            out += f".{step}" if out else str(step)
    return out


@dataclass(slots=True)
class SourceLines:
    """Field path steps -> 1-based line, for every mapping key and list item of a document."""

    lines: dict[tuple[str, ...], int] = field(default_factory=dict)

    def line_of(self, path: str | Iterable[str | int]) -> int | None:
        steps = tuple(path_steps(path) if isinstance(path, str) else (str(s) for s in path))
        while steps:
            line = self.lines.get(steps)
            if line is not None:
                return line
            steps = steps[:-1]
        return self.lines.get((), None)

    def within(self, prefix: Iterable[str | int]) -> SourceLines:
        """The lines of a sub-document, with paths relative to `prefix`."""
        head = tuple(str(s) for s in prefix)
        return SourceLines(
            {key[len(head) :]: line for key, line in self.lines.items() if key[: len(head)] == head}
        )


def _walk(node: yaml.Node, steps: tuple[str, ...], out: dict[tuple[str, ...], int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            here = (*steps, str(key_node.value))
            out.setdefault(here, key_node.start_mark.line + 1)
            _walk(value_node, here, out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            here = (*steps, str(index))
            out.setdefault(here, item.start_mark.line + 1)
            _walk(item, here, out)


class DuplicateKeyError(yaml.YAMLError):
    """A mapping that gives one key twice: YAML loaders keep the last without a word."""

    def __init__(self, steps: tuple[str | int, ...], line: int, first_line: int) -> None:
        super().__init__(f"{join_path(steps)} given twice (lines {first_line} and {line})")
        self.steps = steps
        self.line = line
        self.first_line = first_line


def _check_unique_keys(node: yaml.Node, steps: tuple[str | int, ...], seen: set[int]) -> None:
    """Raise `DuplicateKeyError` for the first key a mapping of `node` gives twice; keys
    merged in with `<<` are not its own, and may be overridden."""
    if id(node) in seen:  # an alias of a node already checked
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if key in first:
                raise DuplicateKeyError((*steps, key), line, first[key])
            first[key] = line
            _check_unique_keys(value_node, (*steps, key), seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _check_unique_keys(item, (*steps, index), seen)


def load_yaml_with_lines(text: str) -> tuple[Any, SourceLines]:
    """The document's data, as `yaml.safe_load` gives it, and the line of each of its fields.

    Raises `yaml.YAMLError` for text that is not YAML, `DuplicateKeyError` (one) for a mapping
    that gives a key twice.
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, SourceLines()
        _check_unique_keys(node, (), set())
        data = loader.construct_document(node)
    finally:
        loader.dispose()
    lines: dict[tuple[str, ...], int] = {(): node.start_mark.line + 1}
    _walk(node, (), lines)
    return data, SourceLines(lines)
