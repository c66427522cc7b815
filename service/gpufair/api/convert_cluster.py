"""ClusterConfig between proto and domain.

`config_from_proto` applies the documented defaults of unset optional fields and reports what no
domain value can hold (unknown enum numbers, two quotas for one pool, two partition profiles of
one name on a GPU type) as field violations; the domain rules in `config_rules` then check the
values themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import Any, TypeVar, overload

from google.protobuf.message import Message

from gpufair.domain.config_diff import ChangeAction, ConfigChange
from gpufair.domain.errors import Violation
from gpufair.domain.model import (
    Budget,
    BudgetPeriod,
    ClusterConfig,
    Division,
    FairSharePolicy,
    GpuType,
    Node,
    NodePool,
    PartitionProfile,
    PlacementStrategy,
    Queue,
    QueueQuota,
    Rounding,
    UsageBasis,
    WindowKind,
    frozen_map,
)
from gpufair.v1 import cluster_pb2 as pb

E = TypeVar("E")

_WINDOW = {
    pb.WINDOW_KIND_UNSPECIFIED: WindowKind.SLIDING,
    pb.WINDOW_KIND_SLIDING: WindowKind.SLIDING,
    pb.WINDOW_KIND_TUMBLING: WindowKind.TUMBLING,
    pb.WINDOW_KIND_NONE: WindowKind.NONE,
}
_BASIS = {
    pb.USAGE_BASIS_UNSPECIFIED: UsageBasis.OVER_QUOTA,
    pb.USAGE_BASIS_OVER_QUOTA: UsageBasis.OVER_QUOTA,
    pb.USAGE_BASIS_TOTAL: UsageBasis.TOTAL,
}
_ROUNDING = {
    pb.ROUNDING_UNSPECIFIED: Rounding.CONTINUOUS,
    pb.ROUNDING_CONTINUOUS: Rounding.CONTINUOUS,
    pb.ROUNDING_WHOLE_GPUS: Rounding.WHOLE_GPUS,
}
_DIVISION = {
    pb.DIVISION_UNSPECIFIED: Division.GPUFAIR,
    pb.DIVISION_GPUFAIR: Division.GPUFAIR,
    pb.DIVISION_KAI: Division.KAI,
}
_PLACEMENT = {
    pb.PLACEMENT_STRATEGY_UNSPECIFIED: PlacementStrategy.BINPACK,
    pb.PLACEMENT_STRATEGY_BINPACK: PlacementStrategy.BINPACK,
    pb.PLACEMENT_STRATEGY_SPREAD: PlacementStrategy.SPREAD,
}
_PERIOD = {
    pb.BUDGET_PERIOD_DAY: BudgetPeriod.DAY,
    pb.BUDGET_PERIOD_WEEK: BudgetPeriod.WEEK,
    pb.BUDGET_PERIOD_MONTH: BudgetPeriod.MONTH,
}
_ACTION = {
    ChangeAction.CREATE: pb.CHANGE_ACTION_CREATE,
    ChangeAction.UPDATE: pb.CHANGE_ACTION_UPDATE,
    ChangeAction.DELETE: pb.CHANGE_ACTION_DELETE,
}


def _inverse(table: Mapping[Any, E]) -> dict[E, Any]:
    inverse: dict[E, Any] = {}
    for number, value in table.items():
        if number != 0:
            inverse.setdefault(value, number)
    return inverse


class _Collector:
    """Gathers conversion problems so that all of them are reported at once."""

    def __init__(self) -> None:
        self.violations: list[Violation] = []

    def enum(self, table: Mapping[Any, E], number: int, path: str, default: E) -> E:
        if number in table:
            return table[number]
        self.violations.append(Violation(path, f"unknown enum value {number}"))
        return default

    def unique_names(self, items: Iterable[Any], path: str) -> None:
        """Each name once: a workload asks for a partition profile by its name alone."""
        seen: set[str] = set()
        for j, item in enumerate(items):
            if item.name in seen:
                self.violations.append(
                    Violation(f"{path}[{j}].name", f"duplicate name {item.name[:80]!r}")
                )
            seen.add(item.name)


def config_from_proto(msg: pb.ClusterConfig) -> tuple[ClusterConfig, list[Violation]]:
    c = _Collector()
    gpu_types = tuple(
        GpuType(
            name=g.name,
            memory_gib=g.memory_gib,
            compute_weight=g.compute_weight,
            partition_profiles=tuple(
                PartitionProfile(
                    p.name, p.gpu_fraction, p.memory_gib, p.memory_slices, tuple(p.starts)
                )
                for p in g.partition_profiles
            ),
        )
        for g in msg.gpu_types
    )
    for i, g in enumerate(msg.gpu_types):
        c.unique_names(g.partition_profiles, f"gpu_types[{i}].partition_profiles")
    pools = tuple(_pool_from_proto(p, f"pools[{i}]", c) for i, p in enumerate(msg.pools))
    nodes = tuple(node_from_proto(n) for n in msg.nodes)
    queues = tuple(_queue_from_proto(q, f"queues[{i}]", c) for i, q in enumerate(msg.queues))
    budgets = tuple(
        Budget(
            queue=b.queue,
            period=c.enum(_PERIOD, b.period, f"budgets[{i}].period", BudgetPeriod.MONTH),
            cu_hours=b.cu_hours,
            pool=b.pool or None,
        )
        for i, b in enumerate(msg.budgets)
    )
    return ClusterConfig(gpu_types, pools, nodes, queues, budgets), c.violations


def node_from_proto(n: pb.Node) -> Node:
    """One node with its defaults (ready unless said otherwise); `config_rules.validate_nodes`
    checks a batch of them as ApplyConfig does (UpsertNodes takes the same)."""
    return Node(
        name=n.name,
        pool=n.pool,
        gpu_type=n.gpu_type,
        gpu_count=n.gpu_count,
        cpu_millicores=n.cpu_millicores,
        memory_mib=n.memory_mib,
        labels=frozen_map(dict(n.labels)),
        ready=n.ready if n.HasField("ready") else True,
    )


@overload
def _opt(msg: Message, name: str, default: float) -> float: ...
@overload
def _opt(msg: Message, name: str, default: float | None) -> float | None: ...
def _opt(msg: Message, name: str, default: float | None) -> float | None:
    """An optional number field of `msg`, or `default` when the field is unset."""
    return float(getattr(msg, name)) if msg.HasField(name) else default


# The policy's enum fields and their proto tables; every other field is an optional number of
# the same name in FairSharePolicy and its message, so a new one needs no line here.
_POLICY_ENUMS: Mapping[str, Mapping[Any, Any]] = {
    "window_kind": _WINDOW,
    "usage_basis": _BASIS,
    "rounding": _ROUNDING,
    "division": _DIVISION,
}


def _pool_from_proto(p: pb.NodePool, path: str, c: _Collector) -> NodePool:
    d = FairSharePolicy()
    pol = p.policy
    values: dict[str, Any] = {}
    for f in fields(FairSharePolicy):
        default = getattr(d, f.name)
        table = _POLICY_ENUMS.get(f.name)
        if table is not None:
            values[f.name] = c.enum(table, getattr(pol, f.name), f"{path}.policy.{f.name}", default)
        else:
            values[f.name] = _opt(pol, f.name, default)
    policy = FairSharePolicy(**values)
    reservation = _opt(p, "gang_reservation_after_s", NodePool("").gang_reservation_after_s)
    return NodePool(
        name=p.name,
        policy=policy,
        placement=c.enum(_PLACEMENT, p.placement, f"{path}.placement", PlacementStrategy.BINPACK),
        gang_reservation_after_s=None if reservation == 0 else reservation,
        max_borrow_s=_opt(p, "max_borrow_s", None),
        topology_levels=tuple(p.topology_levels),
        max_moved_share_per_hour=_opt(p, "max_moved_share_per_hour", None),
        gang_entitlement=p.gang_entitlement if p.HasField("gang_entitlement") else False,
    )


def _queue_from_proto(q: pb.Queue, path: str, c: _Collector) -> Queue:
    quotas: dict[str, QueueQuota] = {}
    for j, qq in enumerate(q.quotas):
        if qq.pool in quotas:
            c.violations.append(
                Violation(f"{path}.quotas[{j}].pool", f"a second quota for pool {qq.pool!r}")
            )
            continue
        quotas[qq.pool] = QueueQuota(
            pool=qq.pool,
            deserved_cu=qq.deserved_cu,
            deserved_gpus_by_type=frozen_map(dict(qq.deserved_gpus_by_type)),
            over_quota_weight=_opt(qq, "over_quota_weight", 1.0),
            limit_cu=_opt(qq, "limit_cu", None),
            limit_gpus_by_type=frozen_map(dict(qq.limit_gpus_by_type)),
            priority=qq.priority,
            max_borrow_s=_opt(qq, "max_borrow_s", None),
        )
    return Queue(name=q.name, parent=q.parent or None, quotas=frozen_map(quotas))


def config_to_proto(config: ClusterConfig) -> pb.ClusterConfig:
    policy_enums = {name: _inverse(table) for name, table in _POLICY_ENUMS.items()}
    placement, period = _inverse(_PLACEMENT), _inverse(_PERIOD)
    msg = pb.ClusterConfig()
    for g in config.gpu_types:
        msg.gpu_types.add(
            name=g.name,
            memory_gib=g.memory_gib,
            compute_weight=g.compute_weight,
            partition_profiles=[
                pb.PartitionProfile(
                    name=p.name,
                    gpu_fraction=p.gpu_fraction,
                    memory_gib=p.memory_gib,
                    memory_slices=p.memory_slices,
                    starts=list(p.starts),
                )
                for p in g.partition_profiles
            ],
        )
    for p in config.pools:
        policy = pb.FairSharePolicy()
        for f in fields(FairSharePolicy):
            value = getattr(p.policy, f.name)
            if f.name in _POLICY_ENUMS:
                setattr(policy, f.name, policy_enums[f.name][value])
            elif value is not None:
                setattr(policy, f.name, value)
        pool_msg = msg.pools.add(
            name=p.name,
            policy=policy,
            placement=placement[p.placement],
            gang_reservation_after_s=p.gang_reservation_after_s or 0.0,
            gang_entitlement=p.gang_entitlement,
        )
        if p.max_borrow_s is not None:
            pool_msg.max_borrow_s = p.max_borrow_s
        pool_msg.topology_levels.extend(p.topology_levels)
        if p.max_moved_share_per_hour is not None:
            pool_msg.max_moved_share_per_hour = p.max_moved_share_per_hour
    for n in config.nodes:
        msg.nodes.add(
            name=n.name,
            pool=n.pool,
            gpu_type=n.gpu_type,
            gpu_count=n.gpu_count,
            cpu_millicores=n.cpu_millicores,
            memory_mib=n.memory_mib,
            labels=dict(n.labels),
            ready=n.ready,
        )
    for q in config.queues:
        qmsg = msg.queues.add(name=q.name, parent=q.parent or "")
        for quota in q.quotas.values():
            qq = qmsg.quotas.add(
                pool=quota.pool,
                deserved_cu=quota.deserved_cu,
                deserved_gpus_by_type=dict(quota.deserved_gpus_by_type),
                over_quota_weight=quota.over_quota_weight,
                limit_gpus_by_type=dict(quota.limit_gpus_by_type),
                priority=quota.priority,
            )
            if quota.limit_cu is not None:
                qq.limit_cu = quota.limit_cu
            if quota.max_borrow_s is not None:
                qq.max_borrow_s = quota.max_borrow_s
    for b in config.budgets:
        msg.budgets.add(
            queue=b.queue, period=period[b.period], cu_hours=b.cu_hours, pool=b.pool or ""
        )
    return msg


def changes_to_proto(changes: Iterable[ConfigChange]) -> list[pb.ConfigChange]:
    return [
        pb.ConfigChange(
            kind=c.kind,
            name=c.name,
            action=_ACTION[c.action],
            fields=[
                pb.FieldChange(field=f.field, before=f.before, after=f.after) for f in c.fields
            ],
        )
        for c in changes
    ]


def map_violations(violations: Iterable[Violation], prefix: str) -> list[Violation]:
    """Prefix domain field paths with where the object sits in the request (`config.`)."""
    return [Violation(f"{prefix}{v.field_path}", v.message) for v in violations]
