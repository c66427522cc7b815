"""The queue tree, checked and indexed once, for code that walks it top-down or bottom-up."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpufair.domain.errors import InvalidInputError
from gpufair.domain.model import Queue
from gpufair.domain.policy import queue_structure_violations


@dataclass(frozen=True, slots=True)
class QueueTree:
    """A forest of queues. `children[None]` are the top-level queues.

    Siblings are kept in name order so every walk, and so every float sum, is deterministic.
    """

    queues: Mapping[str, Queue]
    children: Mapping[str | None, tuple[str, ...]]
    preorder: tuple[str, ...]  # parents before their children

    @classmethod
    def build(cls, queues: Iterable[Queue]) -> QueueTree:
        """Index `queues`; raises `InvalidInputError` on duplicates, unknown parents or cycles."""
        queue_list = list(queues)
        by_name = {q.name: q for q in queue_list}
        if len(by_name) != len(queue_list):  # checked first: a duplicate could make a loop
            raise InvalidInputError(queue_structure_violations(queue_list))
        children_lists: dict[str | None, list[str]] = {None: []}
        for queue in queue_list:
            children_lists.setdefault(queue.parent, []).append(queue.name)
        children = {key: tuple(sorted(names)) for key, names in children_lists.items()}
        preorder: list[str] = []
        stack = list(reversed(children[None]))
        while stack:
            name = stack.pop()
            preorder.append(name)
            stack.extend(reversed(children.get(name, ())))
        # With unique names, the walk from the top level reaches every queue of a forest; an
        # unknown parent or a cycle leaves some unreached. Only then is the full check run, for
        # its messages.
        if len(preorder) != len(queue_list):
            raise InvalidInputError(queue_structure_violations(queue_list))
        return cls(queues=by_name, children=children, preorder=tuple(preorder))

    def is_leaf(self, name: str) -> bool:
        return name not in self.children

    def children_of(self, name: str | None) -> tuple[str, ...]:
        return self.children.get(name, ())

    def postorder(self) -> tuple[str, ...]:
        """Children before their parents: the order for aggregating upwards."""
        return self.preorder[::-1]

    def inner_groups(self) -> tuple[str | None, ...]:
        """Sibling-group keys top-down: None (the top level), then each parent in pre-order."""
        return (None, *(name for name in self.preorder if name in self.children))
