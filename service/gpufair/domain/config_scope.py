"""Who owns which part of the config, and which deletions a change may make.

A declarative apply may own only some kinds of objects (`kinds`): a GitOps repository owns queues
and budgets while a node controller owns nodes. The config it is compared with is then `scoped`:
its own objects of those kinds, the stored objects of every other kind. References are checked on
that whole config, so a queues-only apply may name pools it does not contain, and a violation is
reported only where it lies in the caller's part (`in_scope`).

Deletions, however requested (ApplyConfig, DeleteObjects, UpsertNodes' prune), follow one rule:
nothing that remains may still refer to what goes (`dangling_references`), and nothing that work
uses now may go (store/deletion_guard.py checks that part against the workloads).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from gpufair.domain.config_diff import KINDS, ChangeAction, ConfigChange, objects_by_kind
from gpufair.domain.errors import Violation
from gpufair.domain.model import ClusterConfig

# The field of ClusterConfig (and of the request's `config`) that holds each kind.
LIST_OF_KIND = {
    "gpu_type": "gpu_types",
    "pool": "pools",
    "node": "nodes",
    "queue": "queues",
    "budget": "budgets",
}
MAX_SHOWN = 10


def kinds_violations(kinds: Sequence[str]) -> list[Violation]:
    violations = []
    seen: set[str] = set()
    for i, kind in enumerate(kinds):
        if kind not in KINDS:
            violations.append(Violation(f"kinds[{i}]", f"must be one of {', '.join(KINDS)}"))
        elif kind in seen:
            violations.append(Violation(f"kinds[{i}]", f"{kind} listed twice"))
        seen.add(kind)
    return violations


def scope_of(kinds: Sequence[str]) -> frozenset[str]:
    """The kinds an apply owns: those named, or all of them when none is."""
    return frozenset(kinds) if kinds else frozenset(KINDS)


def out_of_scope_objects(desired: ClusterConfig, scope: Collection[str]) -> list[Violation]:
    """Objects sent for kinds the apply does not own: refused rather than silently ignored."""
    violations = []
    for kind in KINDS:
        count = len(getattr(desired, LIST_OF_KIND[kind]))
        if kind not in scope and count:
            violations.append(
                Violation(
                    LIST_OF_KIND[kind],
                    f"{count} {kind} object(s) outside this apply's kinds "
                    f"({', '.join(sorted(scope))}): leave them out or add {kind} to kinds",
                )
            )
    return violations


def scoped(stored: ClusterConfig, desired: ClusterConfig, scope: Collection[str]) -> ClusterConfig:
    """The config an apply would leave: `desired`'s objects of the kinds in `scope` (in request
    order, so violation paths stay those of the request), `stored`'s of the others."""

    d, s, own = desired, stored, scope
    return ClusterConfig(
        gpu_types=d.gpu_types if "gpu_type" in own else s.gpu_types,
        pools=d.pools if "pool" in own else s.pools,
        nodes=d.nodes if "node" in own else s.nodes,
        queues=d.queues if "queue" in own else s.queues,
        budgets=d.budgets if "budget" in own else s.budgets,
    )


def in_scope(violations: Iterable[Violation], scope: Collection[str]) -> list[Violation]:
    """The violations that lie in the caller's part of a `scoped` config. The others are in stored
    objects the caller did not send: what a deletion breaks there is `dangling_references`'."""
    lists = {LIST_OF_KIND[k] for k in scope}
    return [v for v in violations if v.field_path.split("[", 1)[0].split(".", 1)[0] in lists]


def deletions(changes: Iterable[ConfigChange]) -> dict[str, set[str]]:
    """The names each change set deletes, by kind."""
    gone: dict[str, set[str]] = {}
    for change in changes:
        if change.action is ChangeAction.DELETE:
            gone.setdefault(change.kind, set()).add(change.name)
    return gone


def deletes_whole_scope(
    stored: ClusterConfig, final: ClusterConfig, scope: Collection[str]
) -> bool:
    """Whether an apply leaves no object of the kinds in `scope` where some are stored: what an
    empty config, or a message that decodes as one, asks for. Replacing every object by new ones
    is not this: the config sent still declares something."""
    before, after = objects_by_kind(stored), objects_by_kind(final)
    return any(before[k] for k in scope) and not any(after[k] for k in scope)


def dangling_references(final: ClusterConfig, gone: Mapping[str, set[str]]) -> list[str]:
    """What in `final` (the config once the deletions are made) still refers to a deleted
    object, as "<referrer> uses <kind> <name>" lines."""
    refs: list[str] = []
    types, pools, queues = (
        gone.get("gpu_type", set()),
        gone.get("pool", set()),
        gone.get("queue", set()),
    )
    for n in final.nodes:
        if n.gpu_type in types:
            refs.append(f"node {n.name} uses gpu_type {n.gpu_type}")
        if n.pool in pools:
            refs.append(f"node {n.name} uses pool {n.pool}")
    for q in final.queues:
        if q.parent in queues:
            refs.append(f"queue {q.name} uses queue {q.parent}")
        for pool, quota in q.quotas.items():
            if pool in pools:
                refs.append(f"queue {q.name} uses pool {pool}")
            for t in sorted(
                types & (quota.deserved_gpus_by_type.keys() | quota.limit_gpus_by_type.keys())
            ):
                refs.append(f"queue {q.name} uses gpu_type {t}")
    for b in final.budgets:
        if b.queue in queues:
            refs.append(f"budget of {b.queue} uses queue {b.queue}")
        if b.pool is not None and b.pool in pools:
            refs.append(f"budget of {b.queue} uses pool {b.pool}")
    return refs


def capped(lines: Sequence[str], limit: int = MAX_SHOWN) -> str:
    """The first `limit` lines joined, and how many more there are."""
    shown = "; ".join(lines[:limit])
    return shown + (f"; and {len(lines) - limit} more" if len(lines) > limit else "")
