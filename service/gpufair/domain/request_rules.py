"""The fields of requests that are not objects of the config or workloads: request ids, names
that look something up, kinds, node names, pools to prune, time ranges. (Scopes of kinds:
`config_scope.kinds_violations`; ListWorkloads' states and pages: `api/workload_listing.py`.) Each function returns every violation
with its field path; the limits are those of `domain/limits.py`.

A name that looks something up is checked before the lookup, so a NUL byte or a megabyte of name
is INVALID_ARGUMENT naming the field, never a database error or a NOT_FOUND quoting it all.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpufair.domain import limits
from gpufair.domain.config_diff import KINDS
from gpufair.domain.errors import Violation
from gpufair.domain.limits import text_violations, texts_violations, timestamp_violations


def request_id_violations(request_id: str, path: str = "request_id") -> list[Violation]:
    return text_violations(path, request_id, limits.MAX_REQUEST_ID_LEN)


def name_violations(path: str, name: str, *, required: bool = True) -> list[Violation]:
    """A pool, queue or GPU type named to look it up (an empty optional one means "all")."""
    return text_violations(path, name, limits.MAX_NAME_LEN, required=required)


def uid_violations(path: str, uid: str) -> list[Violation]:
    """A workload uid named to look it up."""
    return text_violations(path, uid, limits.MAX_UID_LEN, required=True)


def object_names_violations(path: str, kind: str, names: Sequence[str]) -> list[Violation]:
    """Names of config objects of `kind` (DeleteObjects, SetNodesReady): at least one, at most
    MAX_OBJECTS, each a bounded string without control characters."""
    if not names:
        return [Violation(path, f"name at least one {'node' if kind == 'node' else 'object'}")]
    max_len = {
        "node": limits.MAX_NODE_NAME_LEN,
        "budget": 2 * limits.MAX_NAME_LEN + 8,  # "queue/period/pool"
    }.get(kind, limits.MAX_NAME_LEN)
    return texts_violations(path, names, limits.MAX_OBJECTS, max_len)


def kind_violations(path: str, kind: str) -> list[Violation]:
    if kind not in KINDS:
        return [Violation(path, f"must be one of {', '.join(KINDS)}, got {limits.echo(kind)}")]
    return []


def prune_pools_violations(prune_pools: Sequence[str]) -> list[Violation]:
    """UpsertNodesRequest.prune_pools: at most MAX_PRUNE_POOLS pool names."""
    return texts_violations("prune_pools", prune_pools, limits.MAX_PRUNE_POOLS, limits.MAX_NAME_LEN)


def time_range_violations(
    since: tuple[int, int] | None, until: tuple[int, int] | None
) -> list[Violation]:
    """Optional `since` and `until` Timestamps as (seconds, nanos): each within 1970-9999, and
    since before until when both are set."""
    out: list[Violation] = []
    if since is not None:
        out += timestamp_violations("since", *since)
    if until is not None:
        out += timestamp_violations("until", *until)
    if not out and since is not None and until is not None and since >= until:
        out.append(Violation("until", "must be after since"))
    return out
