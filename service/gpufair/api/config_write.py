"""What every config mutation (ApplyConfig, DeleteObjects, UpsertNodes, SetNodesReady) shares:
its request checks, the optimistic-concurrency check, the deletion rules and the write.

Each runs in one transaction under the config lock (api/idempotent.py). A dry run goes through the
very same steps, writes included, and checks the deferred foreign keys before its transaction is
rolled back: it refuses exactly what the real call would, and leaves nothing behind.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from sqlalchemy import Connection, text

from gpufair.api.idempotent import MAX_REQUEST_ID_LEN
from gpufair.domain.config_diff import ConfigChange
from gpufair.domain.errors import FailedPrecondition, Violation
from gpufair.domain.model import ClusterConfig
from gpufair.store import capacity_repo, config_repo
from gpufair.store.deletion_guard import refuse_unsafe_deletions
from gpufair.v1 import cluster_pb2 as pb

Mutation = (
    pb.ApplyConfigRequest
    | pb.DeleteObjectsRequest
    | pb.UpsertNodesRequest
    | pb.SetNodesReadyRequest
)

MAX_OBJECTS = 100_000


def request_violations(request: Mutation) -> list[Violation]:
    """The checks of the fields every mutation has: `request_id` and `expected_version`."""
    violations = []
    if len(request.request_id) > MAX_REQUEST_ID_LEN:
        violations.append(Violation("request_id", f"longer than {MAX_REQUEST_ID_LEN} characters"))
    expected = expected_version(request)
    if expected is not None and expected < 0:
        violations.append(Violation("expected_version", f"must be >= 0, got {expected}"))
    return violations


def expected_version(request: Mutation) -> int | None:
    if not request.HasField("expected_version"):
        return None
    return request.expected_version


def check_version(conn: Connection, request: Mutation) -> int:
    """The stored config version; FailedPrecondition naming it when the request expected
    another (someone else changed the config since the caller read it)."""
    current = config_repo.config_version(conn)
    expected = expected_version(request)
    if expected is not None and expected != current:
        raise FailedPrecondition(
            f"config version is {current}, not the expected {expected}: the config changed "
            "since it was read. Nothing was changed: read it again and retry."
        )
    return current


def write(
    conn: Connection,
    final: ClusterConfig,
    changes: Sequence[ConfigChange],
    *,
    dry_run: bool,
) -> int:
    """Make `changes` (the diff from the stored config to `final`) once the deletion rules
    allow them; returns the config version after them (for a dry run: the current one)."""
    refuse_unsafe_deletions(conn, final, changes)
    version = config_repo.config_version(conn)
    if not changes:
        return version
    config_repo.apply_changes(conn, final, changes)
    new_version = config_repo.record_version(conn, changes)
    capacity_repo.record_if_changed(conn, time.time(), "config")
    if dry_run:
        # What the commit would check, checked now; the caller's transaction is rolled back.
        conn.execute(text("SET CONSTRAINTS ALL IMMEDIATE"))
        return version
    return new_version
