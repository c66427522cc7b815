"""The field path and message of an error `config_file.parse_config` raised on a scenario's
cluster section.

Protobuf's JSON parser names the path of most bad values ("... at ClusterConfig.nodes[0].gpu_count")
but not all: a value Python itself cannot convert ("gpu_count: eight", a queue named 2024 read as
a number) comes as "Failed to parse nodes field: Failed to parse gpu_count field: invalid literal
for int() with base 10: 'eight'", with the field names and no index. The element is then found in
the data: the first one on that chain of names whose value the message quotes (a text) or names the
kind of (another value).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from gpufair.sim.source_lines import join_path

_WITH_PATH = re.compile(r"(?:Failed to parse \w+ field: )*(.*?) at ClusterConfig\.(\S+?)\.*$")
_FIELD = re.compile(r"Failed to parse (\w+) field: ")


def split_config_error(message: str, data: Any) -> tuple[str, str]:
    """(field path, message) of a `ConfigFileError` raised on the cluster section `data`."""
    text = message.removeprefix("cluster: ")
    found = _WITH_PATH.search(text)
    if found:
        return found.group(2), found.group(1)
    names = []
    while (field := _FIELD.match(text)) is not None:
        names.append(field.group(1))
        text = text[field.end() :]
    if names:
        text = text.rstrip(".")
        for steps, value in _candidates(data, names, []):
            if _quoted(value, text):
                return join_path(steps), text
        return ".".join(names), text
    path, sep, rest = text.partition(": ")
    return (path, rest) if sep else ("(cluster)", text)


def _candidates(
    node: Any, names: list[str], steps: list[str | int]
) -> Iterator[tuple[list[str | int], Any]]:
    """Every (path, value) reached from `node` along `names`, through the items of lists."""
    if isinstance(node, list):
        for index, item in enumerate(node):
            yield from _candidates(item, names, [*steps, index])
    elif not names:
        yield steps, node
    elif isinstance(node, dict) and names[0] in node:
        yield from _candidates(node[names[0]], names[1:], [*steps, names[0]])


def _quoted(value: Any, message: str) -> bool:
    if isinstance(value, str):
        return repr(value) in message
    return f"'{type(value).__name__}'" in message
