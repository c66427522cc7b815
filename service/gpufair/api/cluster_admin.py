"""ClusterAdmin: declarative apply of the cluster config, reading it back, deleting objects."""

from __future__ import annotations

import time

import grpc
from sqlalchemy import Connection, Engine

from gpufair.api.convert_cluster import (
    changes_to_proto,
    config_from_proto,
    config_to_proto,
    map_violations,
)
from gpufair.api.idempotent import run_mutation
from gpufair.domain.config_diff import diff_configs, objects_by_kind
from gpufair.domain.config_rules import config_warnings, validate_config
from gpufair.domain.errors import FailedPrecondition, InvalidInputError, NotFound, Violation
from gpufair.domain.limits import MAX_OBJECTS
from gpufair.domain.model import ClusterConfig
from gpufair.domain.request_rules import (
    kind_violations,
    kinds_violations,
    object_names_violations,
    request_id_violations,
)
from gpufair.store import capacity_repo, config_repo, locks
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


def _dangling_references(config: ClusterConfig, kind: str, names: set[str]) -> list[str]:
    """What would still point at the objects being deleted."""
    refs: list[str] = []
    if kind == "gpu_type":
        refs += [f"node {n.name}" for n in config.nodes if n.gpu_type in names]
        refs += [
            f"queue {q.name}"
            for q in config.queues
            for quota in q.quotas.values()
            if names & (quota.deserved_gpus_by_type.keys() | quota.limit_gpus_by_type.keys())
        ]
    elif kind == "pool":
        refs += [f"node {n.name}" for n in config.nodes if n.pool in names]
        refs += [f"queue {q.name}" for q in config.queues if names & q.quotas.keys()]
        refs += [f"budget of {b.queue}" for b in config.budgets if b.pool in names]
    elif kind == "queue":
        refs += [
            f"queue {q.name}" for q in config.queues if q.parent in names and q.name not in names
        ]
        refs += [f"budget of {b.queue}" for b in config.budgets if b.queue in names]
    return refs


class ClusterAdminServicer(cluster_pb2_grpc.ClusterAdminServicer):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def ApplyConfig(
        self, request: pb.ApplyConfigRequest, context: grpc.ServicerContext
    ) -> pb.ApplyConfigResponse:
        desired, conversion_problems = config_from_proto(request.config)
        violations = map_violations(conversion_problems, "config.")
        violations += request_id_violations(request.request_id)
        violations += kinds_violations("kinds", request.kinds)
        total = sum(
            len(x)
            for x in (
                desired.gpu_types,
                desired.pools,
                desired.nodes,
                desired.queues,
                desired.budgets,
            )
        )
        if total > MAX_OBJECTS:
            violations.append(Violation("config", f"more than {MAX_OBJECTS} objects"))
        else:
            violations += map_violations(validate_config(desired), "config.")
        if violations:
            raise InvalidInputError(violations)
        warnings = config_warnings(desired)

        def work(conn: Connection) -> pb.ApplyConfigResponse:
            stored = config_repo.load_config(conn)
            changes = diff_configs(stored, desired)
            version = config_repo.config_version(conn)
            if changes and not request.dry_run:
                config_repo.apply_changes(conn, desired, changes)
                version = config_repo.record_version(conn, changes)
                capacity_repo.record_if_changed(conn, time.time(), "config")
            return pb.ApplyConfigResponse(
                changes=changes_to_proto(changes),
                warnings=warnings,
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
        with self.engine.connect() as conn:
            config = config_repo.load_config(conn)
            version = config_repo.config_version(conn)
        return pb.GetConfigResponse(config=config_to_proto(config), config_version=version)

    def DeleteObjects(
        self, request: pb.DeleteObjectsRequest, context: grpc.ServicerContext
    ) -> pb.DeleteObjectsResponse:
        violations = request_id_violations(request.request_id)
        violations += kind_violations("kind", request.kind)
        violations += object_names_violations("names", request.kind, request.names)
        if violations:
            raise InvalidInputError(violations)
        names = set(request.names)

        def work(conn: Connection) -> pb.DeleteObjectsResponse:
            stored = config_repo.load_config(conn)
            existing = objects_by_kind(stored)[request.kind]
            missing = sorted(names - existing.keys())
            if missing:
                raise NotFound(request.kind, missing[0])
            dangling = _dangling_references(stored, request.kind, names)
            if dangling:
                shown = ", ".join(dangling[:10])
                raise FailedPrecondition(
                    f"cannot delete {request.kind} {', '.join(sorted(names))}: still used by {shown}"
                    + (f" and {len(dangling) - 10} more" if len(dangling) > 10 else "")
                )
            desired = _without(stored, request.kind, names)
            changes = diff_configs(stored, desired)
            version = config_repo.config_version(conn)
            if not request.dry_run:
                config_repo.apply_changes(conn, desired, changes)
                version = config_repo.record_version(conn, changes)
                capacity_repo.record_if_changed(conn, time.time(), "config")
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
