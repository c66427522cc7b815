"""Reading and writing the declared cluster state.

`apply` writes exactly the objects a diff names, so queue creation times (rounding tie-breaks) and
anything else not in the config survive updates. Foreign keys are deferred: the order of writes
inside the transaction does not matter, only the state at commit.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import fields
from datetime import datetime
from typing import Any, get_type_hints

from sqlalchemy import Connection, delete, func, insert, select, text, tuple_
from sqlalchemy.dialects.postgresql import insert as pg_insert

from gpufair.domain.config_diff import ChangeAction, ConfigChange, budget_key
from gpufair.domain.model import (
    Budget,
    BudgetPeriod,
    ClusterConfig,
    FairSharePolicy,
    GpuType,
    Node,
    NodePool,
    PartitionProfile,
    PlacementStrategy,
    Queue,
    QueueQuota,
    frozen_map,
)
from gpufair.store import tables as t
from gpufair.store.commit_watch import wrote_read_key


def load_config(conn: Connection) -> ClusterConfig:
    """The stored state, every list sorted by name."""
    gpu_types = tuple(
        GpuType(
            name=r.name,
            memory_gib=r.memory_gib,
            compute_weight=r.compute_weight,
            partition_profiles=tuple(_profile_from_json(p) for p in r.partition_profiles),
        )
        for r in conn.execute(select(t.gpu_types).order_by(t.gpu_types.c.name))
    )
    pools = tuple(
        _pool_from_row(r) for r in conn.execute(select(t.node_pools).order_by(t.node_pools.c.name))
    )
    nodes = tuple(
        Node(
            name=r.name,
            pool=r.pool,
            gpu_type=r.gpu_type,
            gpu_count=r.gpu_count,
            cpu_millicores=r.cpu_millicores,
            memory_mib=r.memory_mib,
            labels=frozen_map(r.labels),
            ready=r.ready,
        )
        for r in conn.execute(select(t.nodes).order_by(t.nodes.c.name))
    )
    quotas: dict[str, dict[str, QueueQuota]] = {}
    for r in conn.execute(select(t.queue_quotas).order_by(t.queue_quotas.c.pool)):
        quotas.setdefault(r.queue, {})[r.pool] = QueueQuota(
            pool=r.pool,
            deserved_cu=r.deserved_cu,
            deserved_gpus_by_type=frozen_map(r.deserved_gpus_by_type),
            over_quota_weight=r.over_quota_weight,
            limit_cu=r.limit_cu,
            limit_gpus_by_type=frozen_map(r.limit_gpus_by_type),
            priority=r.priority,
            max_borrow_s=r.max_borrow_s,
        )
    queues = tuple(
        Queue(
            name=r.name,
            parent=r.parent,
            quotas=frozen_map(quotas.get(r.name, {})),
            created_at_s=_epoch(r.created_at),
        )
        for r in conn.execute(select(t.queues).order_by(t.queues.c.name))
    )
    budgets = tuple(
        Budget(
            queue=r.queue,
            period=BudgetPeriod(r.period),
            cu_hours=r.cu_hours,
            pool=r.pool or None,
        )
        for r in conn.execute(
            select(t.budgets).order_by(t.budgets.c.queue, t.budgets.c.period, t.budgets.c.pool)
        )
    )
    return ClusterConfig(gpu_types, pools, nodes, queues, budgets)


def pool_exists(conn: Connection, name: str) -> bool:
    return (
        conn.execute(select(t.node_pools.c.name).where(t.node_pools.c.name == name)).first()
        is not None
    )


def parent_queue_names(conn: Connection) -> set[str]:
    """The stored queues that have children."""
    return set(
        conn.execute(
            select(t.queues.c.parent).where(t.queues.c.parent.is_not(None)).distinct()
        ).scalars()
    )


def config_version(conn: Connection) -> int:
    return int(
        conn.execute(select(func.coalesce(func.max(t.config_versions.c.version), 0))).one()[0]
    )


def record_version(conn: Connection, changes: Sequence[ConfigChange]) -> int:
    version = config_version(conn) + 1
    wrote_read_key(conn)  # GetConfig's and GetFairShare's cached replies check again
    conn.execute(
        insert(t.config_versions).values(
            version=version, changes=[_change_json(c) for c in changes]
        )
    )
    return version


def apply_changes(
    conn: Connection, desired: ClusterConfig, changes: Sequence[ConfigChange]
) -> None:
    """Write the creates and updates in `changes` from `desired`, and perform its deletes."""
    by_kind: dict[str, Mapping[str, object]] = {
        "gpu_type": {x.name: x for x in desired.gpu_types},
        "pool": {x.name: x for x in desired.pools},
        "node": {x.name: x for x in desired.nodes},
        "queue": {x.name: x for x in desired.queues},
        "budget": {budget_key(x): x for x in desired.budgets},
    }
    for change in changes:
        if change.action is ChangeAction.DELETE:
            delete_object(conn, change.kind, change.name)
        else:
            _upsert(conn, change.kind, by_kind[change.kind][change.name])


def delete_object(conn: Connection, kind: str, name: str) -> None:
    if kind == "gpu_type":
        conn.execute(delete(t.gpu_types).where(t.gpu_types.c.name == name))
    elif kind == "pool":
        conn.execute(delete(t.node_pools).where(t.node_pools.c.name == name))
    elif kind == "node":
        conn.execute(delete(t.nodes).where(t.nodes.c.name == name))
    elif kind == "queue":
        conn.execute(delete(t.queues).where(t.queues.c.name == name))
    elif kind == "budget":
        queue, period, pool = name.split("/")
        conn.execute(
            delete(t.budgets).where(
                tuple_(t.budgets.c.queue, t.budgets.c.period, t.budgets.c.pool)
                == (queue, period, "" if pool == "*" else pool)
            )
        )
    else:
        raise ValueError(f"unknown kind {kind!r}")


def _upsert(conn: Connection, kind: str, obj: object) -> None:
    if isinstance(obj, GpuType):
        _merge(
            conn,
            t.gpu_types,
            ["name"],
            {
                "name": obj.name,
                "memory_gib": obj.memory_gib,
                "compute_weight": obj.compute_weight,
                "partition_profiles": [_profile_json(p) for p in obj.partition_profiles],
            },
        )
    elif isinstance(obj, NodePool):
        _merge(conn, t.node_pools, ["name"], _pool_row(obj))
    elif isinstance(obj, Node):
        _merge(
            conn,
            t.nodes,
            ["name"],
            {
                "name": obj.name,
                "pool": obj.pool,
                "gpu_type": obj.gpu_type,
                "gpu_count": obj.gpu_count,
                "cpu_millicores": obj.cpu_millicores,
                "memory_mib": obj.memory_mib,
                "labels": dict(obj.labels),
                "ready": obj.ready,
            },
        )
    elif isinstance(obj, Queue):
        _merge(conn, t.queues, ["name"], {"name": obj.name, "parent": obj.parent})
        conn.execute(delete(t.queue_quotas).where(t.queue_quotas.c.queue == obj.name))
        rows = [
            {
                "queue": obj.name,
                "pool": pool,
                "deserved_cu": q.deserved_cu,
                "deserved_gpus_by_type": dict(q.deserved_gpus_by_type),
                "over_quota_weight": q.over_quota_weight,
                "limit_cu": q.limit_cu,
                "limit_gpus_by_type": dict(q.limit_gpus_by_type),
                "priority": q.priority,
                "max_borrow_s": q.max_borrow_s,
            }
            for pool, q in obj.quotas.items()
        ]
        if rows:
            conn.execute(insert(t.queue_quotas), rows)
    elif isinstance(obj, Budget):
        _merge(
            conn,
            t.budgets,
            ["queue", "period", "pool"],
            {
                "queue": obj.queue,
                "period": obj.period.value,
                "pool": obj.pool or "",
                "cu_hours": obj.cu_hours,
            },
        )
    else:
        raise ValueError(f"cannot store {kind} {obj!r}")


def _merge(conn: Connection, table: Any, keys: list[str], row: dict[str, Any]) -> None:
    stmt = pg_insert(table).values(**row)
    updates = {k: stmt.excluded[k] for k in row if k not in keys}
    conn.execute(stmt.on_conflict_do_update(index_elements=keys, set_=updates))


# node_pools holds the policy field by field, under the field's name except where noted here; a
# new policy field needs its column (and migration), no line here.
_POLICY_COLUMNS = {
    f.name: {"window_anchor_unix_s": "window_anchor_s"}.get(f.name, f.name)
    for f in fields(FairSharePolicy)
}
_POLICY_TYPES = get_type_hints(FairSharePolicy)


def _pool_row(pool: NodePool) -> dict[str, Any]:
    row: dict[str, Any] = {
        "name": pool.name,
        "placement": pool.placement.value,
        "gang_reservation_after_s": pool.gang_reservation_after_s,
        "max_borrow_s": pool.max_borrow_s,
        "topology_levels": list(pool.topology_levels),
        "max_moved_share_per_hour": pool.max_moved_share_per_hour,
        "gang_entitlement": pool.gang_entitlement,
    }
    for name, column in _POLICY_COLUMNS.items():
        value = getattr(pool.policy, name)
        row[column] = value.value if isinstance(value, enum.Enum) else value
    return row


def _pool_from_row(r: Any) -> NodePool:
    policy: dict[str, Any] = {}
    for name, column in _POLICY_COLUMNS.items():
        kind = _POLICY_TYPES[name]
        value = getattr(r, column)
        policy[name] = (
            kind(value) if isinstance(kind, type) and issubclass(kind, enum.Enum) else value
        )
    return NodePool(
        name=r.name,
        policy=FairSharePolicy(**policy),
        placement=PlacementStrategy(r.placement),
        gang_reservation_after_s=r.gang_reservation_after_s,
        max_borrow_s=r.max_borrow_s,
        topology_levels=tuple(r.topology_levels),
        max_moved_share_per_hour=r.max_moved_share_per_hour,
        gang_entitlement=r.gang_entitlement,
    )


def _epoch(value: datetime) -> float:
    return value.timestamp()


def _change_json(change: ConfigChange) -> dict[str, Any]:
    return {
        "kind": change.kind,
        "name": change.name,
        "action": change.action.value,
        "fields": [{"field": f.field, "before": f.before, "after": f.after} for f in change.fields],
    }


def check_constraints_now(conn: Connection) -> None:
    """Check the deferred foreign keys now rather than at commit: what a dry run, rolled back
    afterwards, must still be refused for."""
    conn.execute(text("SET CONSTRAINTS ALL IMMEDIATE"))


def _profile_json(profile: PartitionProfile) -> dict[str, Any]:
    """A profile as stored; the slice geometry only when declared, so profiles stored before it
    existed read back equal."""
    found: dict[str, Any] = {
        "name": profile.name,
        "gpu_fraction": profile.gpu_fraction,
        "memory_gib": profile.memory_gib,
    }
    if profile.memory_slices:
        found["memory_slices"] = profile.memory_slices
        found["starts"] = list(profile.starts)
    return found


def _profile_from_json(stored: dict[str, Any]) -> PartitionProfile:
    return PartitionProfile(
        stored["name"],
        stored["gpu_fraction"],
        stored["memory_gib"],
        stored.get("memory_slices", 0),
        tuple(stored.get("starts", ())),
    )
