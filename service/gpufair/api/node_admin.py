"""UpsertNodes and SetNodesReady: nodes owned by a controller, the rest of the config by others.

A node-sync controller (the Slurm bridge, a Kubernetes operator) reports the nodes it sees; it
never sends pools, queues or budgets, so it cannot delete them, and a GitOps repository applying
queues and budgets with `kinds` cannot delete its nodes. Both go through the same config lock,
version counter, deletion rules and capacity history as ApplyConfig (api/config_write.py).

UpsertNodes: each listed node is created or updated as given, except that a node sent without
`ready` keeps its stored flag (a new one is ready), so a controller that syncs hardware does not
undo a drain. With `prune_pools`, the stored nodes of those pools that the list leaves out are
deleted, refused while work uses them; a prune that would leave a pool with no node where some
are stored needs `confirm_delete_all`, as an empty ApplyConfig does, so a controller whose list
came back empty by mistake cannot wipe a pool. SetNodesReady flips the flag only.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable

from sqlalchemy import Connection

from gpufair.api.config_write import check_version, repeated_violations, write
from gpufair.api.convert_cluster import changes_to_proto, config_from_proto
from gpufair.domain.config_diff import diff_configs
from gpufair.domain.config_rules import validate_config
from gpufair.domain.config_scope import in_scope
from gpufair.domain.errors import FailedPrecondition, InvalidInputError, NotFound, Violation
from gpufair.domain.limits import MAX_NODES_PER_UPSERT
from gpufair.domain.model import ClusterConfig, Node
from gpufair.domain.request_rules import object_names_violations, prune_pools_violations
from gpufair.store import config_repo
from gpufair.v1 import cluster_pb2 as pb


def upsert_nodes(
    conn: Connection, request: pb.UpsertNodesRequest, now_s: float
) -> pb.UpsertNodesResponse:
    stored = config_repo.load_config(conn)
    check_version(conn, request)
    sent, problems = config_from_proto(pb.ClusterConfig(nodes=request.nodes))
    # The nodes checked against the stored GPU types and pools; violations of those are not
    # the caller's, so only the nodes' are kept (paths `nodes[i]...`, as in the request).
    checked = ClusterConfig(gpu_types=stored.gpu_types, pools=stored.pools, nodes=sent.nodes)
    violations = problems + in_scope(validate_config(checked), {"node"})
    known_pools = {p.name for p in stored.pools}
    for i, pool in enumerate(request.prune_pools):
        if pool not in known_pools:
            violations.append(Violation(f"prune_pools[{i}]", f"unknown pool {pool[:80]!r}"))
    if violations:
        raise InvalidInputError(violations)

    before = {n.name: n for n in stored.nodes}
    listed: dict[str, Node] = {}
    for msg, node in zip(request.nodes, sent.nodes, strict=True):
        keep_flag = not msg.HasField("ready") and node.name in before
        listed[node.name] = (
            dataclasses.replace(node, ready=before[node.name].ready) if keep_flag else node
        )
    prune = set(request.prune_pools)
    kept = [n for n in stored.nodes if n.name not in listed and n.pool not in prune]
    final = dataclasses.replace(
        stored, nodes=tuple(sorted([*kept, *listed.values()], key=lambda n: n.name))
    )
    emptied = emptied_pools(stored.nodes, final.nodes, prune)
    if emptied and not request.confirm_delete_all:
        raise FailedPrecondition(
            f"this upsert would delete every stored node of pool{'s' if len(emptied) > 1 else ''} "
            f"{', '.join(emptied)} and keep none: set confirm_delete_all if that is meant. "
            "Nothing was changed."
        )
    changes = diff_configs(stored, final)
    version = write(conn, final, changes, dry_run=request.dry_run, now_s=now_s)
    return pb.UpsertNodesResponse(
        changes=changes_to_proto(changes), applied=not request.dry_run, config_version=version
    )


def emptied_pools(before: Iterable[Node], after: Iterable[Node], pruned: set[str]) -> list[str]:
    """The pools of `pruned` that hold nodes `before` and none `after`, by name, each with how
    many it holds: "main (3 nodes)"."""
    held = Counter(n.pool for n in before if n.pool in pruned)
    for n in after:
        held.pop(n.pool, None)
    return [f"{pool} ({n} node{'s' if n > 1 else ''})" for pool, n in sorted(held.items())]


def set_nodes_ready(
    conn: Connection, request: pb.SetNodesReadyRequest, now_s: float
) -> pb.SetNodesReadyResponse:
    stored = config_repo.load_config(conn)
    check_version(conn, request)
    known = {n.name for n in stored.nodes}
    for name in request.names:
        if name not in known:
            raise NotFound("node", name[:200])
    names = set(request.names)
    final = dataclasses.replace(
        stored,
        nodes=tuple(
            dataclasses.replace(n, ready=request.ready) if n.name in names else n
            for n in stored.nodes
        ),
    )
    changes = diff_configs(stored, final)
    version = write(conn, final, changes, dry_run=request.dry_run, now_s=now_s)
    return pb.SetNodesReadyResponse(
        changes=changes_to_proto(changes), applied=not request.dry_run, config_version=version
    )


def set_ready_violations(request: pb.SetNodesReadyRequest) -> list[Violation]:
    """The node names: 1 to MAX_OBJECTS, each a bounded string without control characters,
    none listed twice."""
    return object_names_violations("names", "node", request.names) + repeated_violations(
        "names", request.names
    )


def upsert_violations(request: pb.UpsertNodesRequest) -> list[Violation]:
    """The list sizes and the pool names to prune (domain/limits.py), none listed twice; the
    nodes themselves are checked against the stored config by `upsert_nodes`, as ApplyConfig
    checks them."""
    violations = []
    if len(request.nodes) > MAX_NODES_PER_UPSERT:
        violations.append(Violation("nodes", f"at most {MAX_NODES_PER_UPSERT} per call"))
    violations += prune_pools_violations(request.prune_pools)
    violations += repeated_violations("prune_pools", request.prune_pools)
    return violations
