"""A pool's capacity history as a property, on PostgreSQL: random small histories (2 to 4 nodes
of two GPU types in pools `p` and `r`, some configured only later; node capacity reports and
config applies: nodes added, removed, drained and undrained, moved to the other pool, their
declared GPUs changed, a GPU type's weight changed) delivered in time order, and in shuffled
orders. Every delivery must leave the outcomes, the stored reports and the `pool_capacity_changes`
rows that time order leaves.

Reports include what their node's config refuses: a node not configured at their instant (not
yet added, or removed), more GPUs than it declared then. Some share their instant with a config
apply (either may come first) or with another report of their node. A report is judged against
the config in force just before its instant, and two of one node at one instant count the fewer
GPUs.

Which orders can happen: a config apply is stamped with the server's clock as it commits, so
applies come in their own order, and a report comes after every apply older than it (it was sent
after them) but may come after later ones (late). Reports come one a message or several in one
(in any order among themselves), and some twice (a replay under the same id changes nothing).
Reports stamped later than an apply that comes after them (a batch system's clock ahead of the
server's) are a case of their own below.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.api import config_write
from gpufair.domain.config_diff import diff_configs
from gpufair.domain.ledger import EventKind, LedgerEvent
from gpufair.domain.model import (
    ClusterConfig,
    GpuType,
    Node,
    NodePool,
    Queue,
    QueueQuota,
    frozen_map,
)
from gpufair.store import config_repo, ingest_pipeline
from tests.store.ingest_support import NOW

HISTORIES = 30
ORDERS = 4
POOLS = ("p", "r")
TYPES = {"a100": 10.0, "h100": 20.0}


@dataclass
class Report:
    event: LedgerEvent

    @property
    def at(self) -> float:
        return self.event.occurred_at_s


@dataclass
class Apply:
    at: float
    config: ClusterConfig


@dataclass
class History:
    steps: list[Report | Apply] = field(default_factory=list)  # in time order

    @property
    def applies(self) -> list[Apply]:
        return [s for s in self.steps if isinstance(s, Apply)]

    @property
    def reports(self) -> list[Report]:
        return [s for s in self.steps if isinstance(s, Report)]


def _config(nodes: dict[str, Node], weights: dict[str, float]) -> ClusterConfig:
    return ClusterConfig(
        gpu_types=tuple(GpuType(name, 80, w) for name, w in sorted(weights.items())),
        pools=tuple(NodePool(p) for p in POOLS),
        nodes=tuple(nodes[n] for n in sorted(nodes)),
        queues=(Queue("q", None, frozen_map({p: QueueQuota(p, deserved_cu=10) for p in POOLS})),),
    )


def _history(rng: random.Random) -> History:
    h = History()
    names = [f"n{i}" for i in range(rng.randint(2, 4))]
    nodes = {
        n: Node(n, rng.choice(POOLS), rng.choice(sorted(TYPES)), 8, 64000, 512000)
        for n in names[: rng.randint(1, len(names))]  # the others may be added later
    }
    weights = dict(TYPES)
    at = NOW - 5000.0
    h.steps.append(Apply(at, _config(nodes, weights)))
    for _ in range(rng.randint(4, 10)):
        # Now and then at the instant of the step before: a report and an apply, or two reports.
        at += 0 if len(h.steps) > 1 and rng.random() < 0.2 else rng.randint(1, 50)
        same_instant = h.steps[-1].at == at
        if rng.random() < 0.6:
            node, gpus = rng.choice(names), rng.randint(0, 8)
            event = LedgerEvent(
                str(uuid.uuid4()), EventKind.NODE_CAPACITY, at, node=node, gpu_count=gpus
            )
            h.steps.append(Report(event))
            continue
        if same_instant and isinstance(h.steps[-1], Apply):
            at += 1  # applies are stamped with the server's clock: one a commit
        op = rng.choice(("add", "remove", "ready", "move", "declared", "weight"))
        name = rng.choice(names)
        if op == "add" and name not in nodes:
            nodes[name] = Node(name, rng.choice(POOLS), rng.choice(sorted(TYPES)), 8, 64000, 512000)
        elif op == "remove" and name in nodes and len(nodes) > 1:
            del nodes[name]
        elif op == "ready" and name in nodes:
            nodes[name] = replace(nodes[name], ready=not nodes[name].ready)
        elif op == "move" and name in nodes:
            other = POOLS[1 - POOLS.index(nodes[name].pool)]
            nodes[name] = replace(nodes[name], pool=other)
        elif op == "declared" and name in nodes:
            nodes[name] = replace(nodes[name], gpu_count=14 - nodes[name].gpu_count)  # 8 <-> 6
        elif op == "weight":
            gpu_type = rng.choice(sorted(weights))
            base = TYPES[gpu_type]
            weights[gpu_type] = base + 5.0 if weights[gpu_type] == base else base
        else:
            continue
        h.steps.append(Apply(at, _config(nodes, weights)))
    return h


Outcome = tuple[str, str]  # status, error


def _judged(report: Report, config: ClusterConfig) -> Outcome:
    """The outcome of `report` by the config in force just before its instant."""
    declared = {n.name: n.gpu_count for n in config.nodes}.get(report.event.node)
    if declared is None:
        return "rejected", f"unknown node {report.event.node!r}"
    if report.event.gpu_count > declared:
        return "rejected", f"gpu_count must be between 0 and the node's {declared} GPUs"
    return "stored", ""


def _expected(h: History) -> dict[str, Outcome]:
    """Each report's outcome, by event id."""
    return {
        r.event.event_id: _judged(r, [a for a in h.applies if a.at < r.at][-1].config)
        for r in h.reports
    }


def _admitted_throughout(h: History) -> History:
    """Only the reports every config until their instant admits: one that comes ahead of the
    applies before it is judged by the config of its arrival, the only one known then."""
    kept: list[Report | Apply] = []
    for step in h.steps:
        if isinstance(step, Report):
            configs = [a.config for a in h.applies if a.at < step.at]
            if any(_judged(step, c)[0] != "stored" for c in configs):
                continue
        kept.append(step)
    return History(kept)


Delivery = list[Apply | list[Report]]  # config applies, and messages of reports


def _in_order(h: History) -> Delivery:
    return [s if isinstance(s, Apply) else [s] for s in h.steps]


def _late(h: History, rng: random.Random, *, batched: bool) -> Delivery:
    """Applies in their order; each report after every apply older than it, at a random place
    after those; several reports in one message when `batched`; a few sent twice."""
    applies = h.applies
    slots: list[list[Report]] = [[] for _ in applies]
    for report in h.reports:
        earliest = max(i for i, a in enumerate(applies) if a.at < report.at)
        slots[rng.randint(earliest, len(applies) - 1)].append(report)
        if rng.random() < 0.2:
            slots[rng.randint(earliest, len(applies) - 1)].append(report)  # a replay
    delivery: Delivery = []
    for apply, reports in zip(applies, slots, strict=True):
        delivery.append(apply)
        rng.shuffle(reports)
        i = 0
        while i < len(reports):
            size = rng.randint(1, len(reports) - i) if batched else 1
            delivery.append(reports[i : i + size])
            i += size
    return delivery


def _early(h: History, rng: random.Random) -> Delivery:
    """Applies in their order, every report at a random place among them, whatever its time."""
    reports: Delivery = [[r] for r in h.reports]
    rng.shuffle(reports)
    steps: Delivery = [*reports, *h.applies[1:]]  # the first apply made the nodes
    places = sorted(rng.sample(range(len(steps)), len(h.applies) - 1))
    delivery: Delivery = [h.applies[0]]
    applies, rest = iter(h.applies[1:]), iter(reports)
    for i in range(len(steps)):
        delivery.append(next(applies) if i in places else next(rest))
    return delivery


End = tuple[dict[str, Outcome], list[tuple[object, ...]], list[tuple[object, ...]]]


def _deliver(conn: Connection, delivery: Delivery) -> End:
    """Each event's outcome (a replay in a later message must say duplicate when the first was
    stored, else the same; in the same message, duplicate), the stored reports and the capacity
    rows."""
    outcomes: dict[str, Outcome] = {}
    for step in delivery:
        if isinstance(step, Apply):
            changes = diff_configs(config_repo.load_config(conn), step.config)
            config_write.write(conn, step.config, changes, dry_run=False, now_s=step.at)
            continue
        earlier = set(outcomes)
        for report, o in zip(
            step, ingest_pipeline.ingest(conn, [r.event for r in step], NOW), strict=True
        ):
            outcome = (o.status.value, o.error)
            first = outcomes.setdefault(report.event.event_id, outcome)
            if outcome == first:
                continue
            if report.event.event_id in earlier:
                assert (first, outcome) == (("stored", ""), ("duplicate", "")), (first, outcome)
            else:
                assert outcome == ("duplicate", ""), (first, outcome)
    reports = conn.execute(
        text(
            "SELECT node, extract(epoch FROM reported_at)::float8 - :now, gpu_count "
            "FROM node_capacity_reports ORDER BY node, reported_at"
        ),
        {"now": NOW},
    ).all()
    rows = conn.execute(
        text(
            "SELECT pool, extract(epoch FROM changed_at)::float8 - :now, capacity_cu, "
            "capacity_gpus_by_type, source FROM pool_capacity_changes ORDER BY pool, changed_at"
        ),
        {"now": NOW},
    ).all()
    conn.rollback()
    return outcomes, [tuple(r) for r in reports], [tuple(r) for r in rows]


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    with db.connect() as connection:
        yield connection
        connection.rollback()


@pytest.mark.parametrize("seed", range(HISTORIES))
def test_late_reports_give_the_outcomes_and_history_of_time_order(
    conn: Connection, seed: int
) -> None:
    rng = random.Random(seed)
    h = _history(rng)
    expected = _deliver(conn, _in_order(h))
    assert expected[0] == _expected(h)
    for i in range(ORDERS):
        delivery = _late(h, rng, batched=i % 2 == 1)
        assert _deliver(conn, delivery) == expected, (seed, i)


@pytest.mark.parametrize("seed", range(HISTORIES))
def test_reports_ahead_of_the_servers_clock_give_the_history_of_time_order(
    conn: Connection, seed: int
) -> None:
    rng = random.Random(1000 + seed)
    h = _admitted_throughout(_history(rng))
    expected = _deliver(conn, _in_order(h))
    assert set(expected[0].values()) <= {("stored", "")}
    for i in range(ORDERS):
        assert _deliver(conn, _early(h, rng)) == expected, (seed, i)
