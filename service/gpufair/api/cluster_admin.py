"""ClusterAdmin: declarative apply of the cluster config, reading it back, deleting objects, and
the node RPCs of controllers (api/node_admin.py).

ApplyConfig makes the stored config equal the one sent, within its `kinds` (all by default):
the config it compares with is the caller's objects of those kinds plus the stored ones of the
others (domain/config_scope.py), so references across the boundary are checked against what is
stored. Every mutation here shares api/config_write.py: `expected_version`, the deletion rules of
store/deletion_guard.py (an apply deletes only what DeleteObjects would), and dry runs that take
exactly the path of the real call. An apply that would leave no object of its scope where some
are stored, as an empty config (or a message that decodes as one) asks, needs
`confirm_delete_all`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

import grpc
from sqlalchemy import Connection, Engine

from gpufair.api import node_admin
from gpufair.api.config_write import (
    check_version,
    repeated_violations,
    request_violations,
    write,
)
from gpufair.api.convert_cluster import (
    changes_to_proto,
    config_from_proto,
    config_to_proto,
    map_violations,
)
from gpufair.api.idempotent import run_mutation
from gpufair.api.read_cache import ReadCache
from gpufair.domain.config_diff import KINDS, ChangeAction, diff_configs, objects_by_kind
from gpufair.domain.config_rules import config_warnings, validate_config
from gpufair.domain.config_scope import (
    deletes_whole_scope,
    in_scope,
    kinds_violations,
    out_of_scope_objects,
    scope_of,
    scoped,
)
from gpufair.domain.errors import FailedPrecondition, InvalidInputError, NotFound, Violation
from gpufair.domain.limits import MAX_OBJECTS
from gpufair.domain.model import ClusterConfig
from gpufair.domain.request_rules import kind_violations, object_names_violations
from gpufair.store import config_repo, locks
from gpufair.store.commit_watch import key_commit_count
from gpufair.store.read_versions import KeyReader
from gpufair.v1 import cluster_pb2 as pb
from gpufair.v1 import cluster_pb2_grpc


def _without(config: ClusterConfig, kind: str, names: set[str]) -> ClusterConfig:
    keep = objects_by_kind(config)
    for name in names:
        keep[kind].pop(name, None)
    return ClusterConfig(
        gpu_types=tuple(t for t in config.gpu_types if t.name in keep["gpu_type"]),
        pools=tuple(p for p in config.pools if p.name in keep["pool"]),
        nodes=tuple(n for n in config.nodes if n.name in keep["node"]),
        queues=tuple(q for q in config.queues if q.name in keep["queue"]),
        budgets=tuple(b for b in config.budgets if b in keep["budget"].values()),
    )


def _count(config: ClusterConfig) -> int:
    return sum(
        len(x)
        for x in (config.gpu_types, config.pools, config.nodes, config.queues, config.budgets)
    )


class ClusterAdminServicer(cluster_pb2_grpc.ClusterAdminServicer):
    def __init__(
        self,
        engine: Engine,
        clock: Callable[[], float] = time.time,
        configs: ReadCache[None, pb.GetConfigResponse] | None = None,
        keys: KeyReader | None = None,
    ) -> None:
        self.engine = engine
        self.clock = clock
        # GetConfig's reply, current with what any replica applied.
        self.keys = keys if keys is not None else KeyReader(engine)
        self.configs = configs if configs is not None else ReadCache(key_commit_count(engine))

    def ApplyConfig(
        self, request: pb.ApplyConfigRequest, context: grpc.ServicerContext
    ) -> pb.ApplyConfigResponse:
        desired, conversion_problems = config_from_proto(request.config)
        violations = map_violations(conversion_problems, "config.")
        violations += request_violations(request)
        violations += kinds_violations(request.kinds)
        if _count(desired) > MAX_OBJECTS:
            violations.append(Violation("config", f"more than {MAX_OBJECTS} objects"))
        if violations:
            raise InvalidInputError(violations)
        scope = scope_of(request.kinds)
        outside = map_violations(out_of_scope_objects(desired, scope), "config.")
        if outside:
            raise InvalidInputError(outside)

        def work(conn: Connection) -> pb.ApplyConfigResponse:
            stored = config_repo.load_config(conn)
            check_version(conn, request)
            final = scoped(stored, desired, scope)
            problems = in_scope(validate_config(final), scope)
            if problems:
                raise InvalidInputError(map_violations(problems, "config."))
            changes = diff_configs(stored, final)
            if not request.confirm_delete_all and deletes_whole_scope(stored, final, scope):
                deleted = sum(
                    1 for c in changes if c.kind in scope and c.action is ChangeAction.DELETE
                )
                raise FailedPrecondition(
                    f"this apply would delete all {deleted} stored objects of "
                    f"{'its kinds' if request.kinds else 'the config'} "
                    f"({', '.join(k for k in KINDS if k in scope)}) and keep none: "
                    "set confirm_delete_all if that is meant. Nothing was changed."
                )
            version = write(conn, final, changes, dry_run=request.dry_run, now_s=self.clock())
            return pb.ApplyConfigResponse(
                changes=changes_to_proto(changes),
                warnings=config_warnings(final),
                applied=not request.dry_run,
                config_version=version,
            )

        return run_mutation(
            self.engine,
            method="ApplyConfig",
            request=request,
            request_id=request.request_id,
            dry_run=request.dry_run,
            lock_key=locks.CONFIG,
            reply_type=pb.ApplyConfigResponse,
            work=work,
        )

    def GetConfig(
        self, request: pb.GetConfigRequest, context: grpc.ServicerContext
    ) -> pb.GetConfigResponse:
        """From memory (`api/read_cache.py`), current with what any replica applied; the reply
        is shared: nothing may change it."""
        return self.configs.get(None, self._config, context.time_remaining)

    def _config(self, held: Hashable) -> tuple[Hashable, pb.GetConfigResponse | None]:
        """The check of `configs`: the latest version's key, and the reply when it is not
        `held`. The key is read first, so a reply is never older than its key; the version is
        read before the config, so it is never newer than the config it comes with. Read after
        (each statement sees what is committed when it starts), an apply committed between the
        two paired the new version with the old config, and a client's read-modify-write with
        that `expected_version` undid the apply it never saw."""
        key = self.keys.config_key()
        if key is not None and key == held:
            return key, None
        with self.engine.connect() as conn:
            version = config_repo.config_version(conn)
            config = config_repo.load_config(conn)
        return key, pb.GetConfigResponse(config=config_to_proto(config), config_version=version)

    def DeleteObjects(
        self, request: pb.DeleteObjectsRequest, context: grpc.ServicerContext
    ) -> pb.DeleteObjectsResponse:
        violations = request_violations(request)
        violations += kind_violations("kind", request.kind)
        violations += object_names_violations("names", request.kind, request.names)
        violations += repeated_violations("names", request.names)
        if violations:
            raise InvalidInputError(violations)
        names = set(request.names)

        def work(conn: Connection) -> pb.DeleteObjectsResponse:
            stored = config_repo.load_config(conn)
            check_version(conn, request)
            existing = objects_by_kind(stored)[request.kind]
            missing = sorted(names - existing.keys())
            if missing:
                raise NotFound(request.kind, missing[0][:200])
            final = _without(stored, request.kind, names)
            changes = diff_configs(stored, final)
            version = write(conn, final, changes, dry_run=request.dry_run, now_s=self.clock())
            return pb.DeleteObjectsResponse(
                changes=changes_to_proto(changes),
                applied=not request.dry_run,
                config_version=version,
            )

        return run_mutation(
            self.engine,
            method="DeleteObjects",
            request=request,
            request_id=request.request_id,
            dry_run=request.dry_run,
            lock_key=locks.CONFIG,
            reply_type=pb.DeleteObjectsResponse,
            work=work,
        )

    def UpsertNodes(
        self, request: pb.UpsertNodesRequest, context: grpc.ServicerContext
    ) -> pb.UpsertNodesResponse:
        violations = request_violations(request)
        violations += node_admin.upsert_violations(request)
        if violations:
            raise InvalidInputError(violations)
        return run_mutation(
            self.engine,
            method="UpsertNodes",
            request=request,
            request_id=request.request_id,
            dry_run=request.dry_run,
            lock_key=locks.CONFIG,
            reply_type=pb.UpsertNodesResponse,
            work=lambda conn: node_admin.upsert_nodes(conn, request, self.clock()),
        )

    def SetNodesReady(
        self, request: pb.SetNodesReadyRequest, context: grpc.ServicerContext
    ) -> pb.SetNodesReadyResponse:
        violations = request_violations(request)
        violations += node_admin.set_ready_violations(request)
        if violations:
            raise InvalidInputError(violations)
        return run_mutation(
            self.engine,
            method="SetNodesReady",
            request=request,
            request_id=request.request_id,
            dry_run=request.dry_run,
            lock_key=locks.CONFIG,
            reply_type=pb.SetNodesReadyResponse,
            work=lambda conn: node_admin.set_nodes_ready(conn, request, self.clock()),
        )
