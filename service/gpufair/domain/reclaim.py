"""Choosing what to evict so a workload fits (DESIGN §4.3 reclaim and §4.4 preempt).

Who may be a victim is the caller's business (`cycle`): reclaim offers preemptible work past its
`min_runtime_s` from queues above max(deserved, fair share); preempt offers lower-priority
preemptible work of the workload's own queue. Non-preemptible work is never offered. This module
answers: which of those, at least cost, make the workload fit — and nothing more.

`VictimBudget` keeps each victim queue at or above its floor: reclaim never pushes a queue below
max(deserved, fair share), nor below a per-type guarantee (`deserved_gpus_by_type`, DESIGN §3.5).

The search, per GPU type (cheapest first, decided by the caller) and per topology domain:

1. Greedy by node. For every node, the cheapest *prefix* of its victims (lowest priority tier, then
   lowest priority class, then most recently started) that lets one more pod fit is an option,
   scored by (highest victim tier in it, CU evicted per pod gained). The best option is taken, its
   victims are released from the capacity (everywhere they run), and options are re-scored lazily.
   Scoring by tier first makes a high tier reclaim from the lowest tier first (P0 takes from P2
   before P1); scoring by CU per pod picks the fewest CU.
2. The workload is then placed for real on the capacity with those victims released.
3. Pruning: victims are put back one at a time, last chosen first; any the placement does not need
   stays. The result is minimal: removing any one victim breaks the fit ("never evict more than
   needed").

Domains are tried separately (a required topology must hold the gang in one domain) and the
cheapest outcome wins; a preferred topology falls back to the whole pool.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpufair.domain.capacity import EPS, Capacity, Journal, PodUse
from gpufair.domain.model import PlacementStrategy
from gpufair.domain.placement import (
    Ask,
    Exclusion,
    fit_on,
    nodes_with_room,
    place,
    pods_fit,
)


@dataclass(frozen=True, slots=True, eq=False)
class Victim:
    """A running workload that may be evicted, with what it holds (compared by identity)."""

    uid: str
    queue: str
    tier: int
    priority_class: int
    started_at_s: float
    cu: float
    gpus: float
    gpu_type: str
    uses: tuple[PodUse, ...]
    nodes: tuple[int, ...]  # distinct nodes of `uses`

    def preference(self) -> tuple[int, int, float, float, str]:
        """Evicted first: lowest tier, lowest priority class, most recent, smallest."""
        return (self.tier, self.priority_class, -self.started_at_s, self.cu, self.uid)


class VictimBudget:
    """How much each victim queue may still lose: CU above its floor, and GPUs above its
    guarantee on the type being reclaimed."""

    def __init__(self, cu_left: Mapping[str, float], gpus_left: Mapping[str, float]) -> None:
        self.cu_left = dict(cu_left)
        self.gpus_left = dict(gpus_left)

    def allows(self, victim: Victim, spent_cu: float = 0.0, spent_gpus: float = 0.0) -> bool:
        cu_left = self.cu_left.get(victim.queue, 0.0) - spent_cu
        gpus_left = self.gpus_left.get(victim.queue, math.inf) - spent_gpus
        return victim.cu <= cu_left + EPS and victim.gpus <= gpus_left + EPS

    def spend(self, victim: Victim, sign: float = 1.0) -> None:
        self.cu_left[victim.queue] = self.cu_left.get(victim.queue, 0.0) - sign * victim.cu
        if victim.queue in self.gpus_left:
            self.gpus_left[victim.queue] -= sign * victim.gpus

    def copy(self) -> VictimBudget:
        return VictimBudget(self.cu_left, self.gpus_left)


class VictimIndex:
    """Candidate victims by node, each node's list in eviction-preference order. The cycle keeps
    one per GPU type for the whole cycle and removes victims as it evicts them."""

    def __init__(self, victims: Iterable[Victim]) -> None:
        self.on_node: dict[int, list[Victim]] = {}
        self.gpus_on_node: dict[int, float] = {}  # GPUs the node's victims hold on it
        # Per node, the parts of a lower bound of any eviction option the node offers, whatever
        # the budgets: lowest victim tier, cheapest CU per GPU, lowest priority class, latest
        # start.
        self.floor_on_node: dict[int, tuple[int, float, int, float]] = {}
        self.by_queue: dict[str, list[Victim]] = {}
        for victim in sorted(victims, key=Victim.preference):
            for node in victim.nodes:
                self.on_node.setdefault(node, []).append(victim)
            self.by_queue.setdefault(victim.queue, []).append(victim)
        for node in self.on_node:
            self._refresh(node)

    def prune(self, queue: str, max_cu: float) -> None:
        """Drop `queue`'s victims bigger than `max_cu`: its budget can only shrink."""
        for victim in [v for v in self.by_queue.get(queue, ()) if v.cu > max_cu + EPS]:
            self.remove(victim)

    def remove(self, victim: Victim) -> None:
        queued = self.by_queue.get(victim.queue)
        if queued is not None and victim in queued:
            queued.remove(victim)
        for node in victim.nodes:
            found = self.on_node.get(node)
            if found is not None and victim in found:
                found.remove(victim)
                self._refresh(node)

    def _refresh(self, node: int) -> None:
        victims = self.on_node[node]
        if not victims:
            del self.on_node[node]
            del self.gpus_on_node[node]
            del self.floor_on_node[node]
            return
        self.gpus_on_node[node] = sum(
            use.gpu_amount * len(use.gpu_indices)
            for victim in victims
            for use in victim.uses
            if use.node == node
        )
        self.floor_on_node[node] = (
            victims[0].tier,
            min(victim.cu / victim.gpus if victim.gpus > 0 else 0.0 for victim in victims),
            min(victim.priority_class for victim in victims),
            max(victim.started_at_s for victim in victims),
        )

    def __bool__(self) -> bool:
        return bool(self.on_node)


@dataclass(frozen=True, slots=True)
class Selection:
    victims: tuple[Victim, ...]
    plan: list[PodUse]  # where the workload would go once the victims have stopped

    @property
    def cu(self) -> float:
        return sum(victim.cu for victim in self.victims)


def select_victims(
    capacity: Capacity,
    ask: Ask,
    strategy: PlacementStrategy,
    exclusion: Exclusion,
    *,
    index: VictimIndex,
    budget: VictimBudget,
    already_leaving: Sequence[Sequence[PodUse]] = (),
) -> Selection | None:
    """The least-cost victims from `index` whose eviction lets `ask` fit (`ask.pods_min` pods).

    `already_leaving`: capacity of workloads already evicted for this workload; it counts as
    free for the search. The capacity is left exactly as it was found.
    """
    ask = Ask(ask.shape, ask.gpu_type, ask.pods_min, ask.pods_min, ask.topology)
    base: Journal = {}
    for uses in already_leaving:
        capacity.release(uses, base)
    try:
        best: Selection | None = None
        best_key: tuple[int, float] | None = None
        for subset, constrained in _subsets(capacity, ask, exclusion, index):
            if not constrained and best is not None:
                break  # a preferred topology falls back to the pool only when no domain works
            found = _search(
                capacity, ask, strategy, exclusion, subset=subset, index=index, budget=budget
            )
            if found is None:
                continue
            key = (max((victim.tier for victim in found.victims), default=-(1 << 30)), found.cu)
            if best_key is None or key < best_key:
                best, best_key = found, key
        return best
    finally:
        capacity.restore(base)


def _subsets(
    capacity: Capacity, ask: Ask, exclusion: Exclusion, index: VictimIndex
) -> list[tuple[list[int], bool]]:
    """Node sets worth searching, each flagged whether it is one topology domain.

    Only nodes with eligible victims or free room matter; a set is dropped at once when even
    evicting every victim it holds could not free the GPUs the gang needs."""
    relevant: dict[int, float] = {}  # node → GPUs free now plus GPUs its victims hold there
    nodes = capacity.nodes
    whole_pods = ask.shape.gpus_per_pod >= 1.0  # whole-GPU pods cannot use shared GPUs' rest
    for node in nodes_with_room(capacity, ask.shape, ask.gpu_type):
        if not exclusion.blocks(node):
            state = nodes[node]
            relevant[node] = state.free_whole if whole_pods else state.free_gpus()
    for node, held in index.gpus_on_node.items():
        state = nodes[node]
        if state.gpu_type == ask.gpu_type and not exclusion.blocks(node):
            relevant[node] = (state.free_whole if whole_pods else state.free_gpus()) + held
    needed_gpus = ask.pods_min * ask.shape.gpus_per_pod
    topology = ask.topology
    whole: list[tuple[list[int], bool]] = []
    if sum(relevant.values()) >= needed_gpus - EPS:
        whole = [(list(relevant), False)]
    if topology is None:
        return whole
    domains: dict[str, list[int]] = {}
    for node in relevant:
        value = capacity.nodes[node].labels.get(topology.level)
        if value is not None:
            domains.setdefault(value, []).append(node)
    subsets = [
        (members, True)
        for _, members in sorted(domains.items())
        if sum(relevant[node] for node in members) >= needed_gpus - EPS
    ]
    return subsets if topology.required else subsets + whole


def _search(
    capacity: Capacity,
    ask: Ask,
    strategy: PlacementStrategy,
    exclusion: Exclusion,
    *,
    subset: list[int],
    index: VictimIndex,
    budget: VictimBudget,
) -> Selection | None:
    trial: Journal = {}
    try:
        chosen = _greedy(capacity, ask, subset, index, budget=budget.copy(), trial=trial)
        if chosen is None:
            return None
        plan = place(capacity, ask, strategy, exclusion)
        if plan is None:
            return None
        needed: list[Victim] = []
        for victim in reversed(chosen):
            capacity.take(victim.uses, trial)
            still = place(capacity, ask, strategy, exclusion)
            if still is None:
                capacity.release(victim.uses, trial)
                needed.append(victim)
            else:
                plan = still
        needed.reverse()
        return Selection(tuple(needed), plan)
    finally:
        capacity.restore(trial)


def _greedy(
    capacity: Capacity,
    ask: Ask,
    subset: list[int],
    index: VictimIndex,
    *,
    budget: VictimBudget,
    trial: Journal,
) -> list[Victim] | None:
    shape, pods = ask.shape, ask.pods_min
    on_node = index.on_node
    nodes = capacity.nodes
    in_subset = set(subset)
    # Pods that fit now, per node; only nodes with GPU room can have any (the index says which).
    fits: dict[int, int] = dict.fromkeys(subset, 0)
    for node in nodes_with_room(capacity, shape, ask.gpu_type):
        if node in in_subset:
            fits[node] = pods_fit(nodes[node], shape)
    total = sum(fits.values())
    released: set[str] = set()
    chosen: list[Victim] = []

    def option(node: int) -> tuple[tuple[int, float, int, float, int], list[Victim]] | None:
        state = capacity.nodes[node]
        used = state.gpu_used.copy()
        cpu, memory = state.cpu_free, state.memory_free
        spent_cu: dict[str, float] = {}
        spent_gpus: dict[str, float] = {}
        prefix: list[Victim] = []
        cost = 0.0
        for victim in on_node.get(node, ()):
            if victim.uid in released or not budget.allows(
                victim, spent_cu.get(victim.queue, 0.0), spent_gpus.get(victim.queue, 0.0)
            ):
                continue
            prefix.append(victim)
            cost += victim.cu
            spent_cu[victim.queue] = spent_cu.get(victim.queue, 0.0) + victim.cu
            spent_gpus[victim.queue] = spent_gpus.get(victim.queue, 0.0) + victim.gpus
            for use in victim.uses:
                if use.node == node:
                    for gpu in use.gpu_indices:
                        used[gpu] -= use.gpu_amount
                    cpu += use.cpu_millicores
                    memory += use.memory_mib
            free_whole = sum(1 for amount in used if amount <= EPS)
            gained = fit_on(used, free_whole, cpu, memory, shape) - fits[node]
            if gained > 0:
                key = (
                    max(v.tier for v in prefix),
                    cost / gained,
                    max(v.priority_class for v in prefix),
                    -max(v.started_at_s for v in prefix),
                    node,
                )
                return key, prefix
        return None

    # Lazy evaluation: every node enters with a cheap lower bound of its score, component by
    # component; only nodes that reach the top are simulated exactly. Exact scores are
    # re-checked when popped, since an earlier pick may have spent a victim queue's budget or
    # freed room on the node.
    heap: list[tuple[tuple[int, float, int, float, int], bool, int]] = []
    floors = index.floor_on_node
    whole = shape.whole_gpus
    for node in subset:
        floor = floors.get(node)
        if floor is None or whole > nodes[node].gpu_count:
            continue
        # One more pod needs at least `whole - free` more GPUs freed, each costing at least
        # the node's cheapest CU per GPU (shared and GPU-less pods: no such bound).
        missing = max(whole - nodes[node].free_whole, 0)
        bound = (floor[0], floor[1] * missing, floor[2], -floor[3], node)
        heap.append((bound, False, node))
    heapq.heapify(heap)
    while total < pods and heap:
        key, exact, node = heapq.heappop(heap)
        found = option(node)
        if found is None:
            continue
        if not exact or found[0] != key:
            heapq.heappush(heap, (found[0], True, node))
            continue
        touched: set[int] = set()
        for victim in found[1]:
            capacity.release(victim.uses, trial)
            released.add(victim.uid)
            budget.spend(victim)
            chosen.append(victim)
            touched.update(use.node for use in victim.uses)
        for other in touched:
            if other in fits:
                now = pods_fit(nodes[other], shape)
                total += now - fits[other]
                fits[other] = now
                again = option(other)
                if again is not None:
                    heapq.heappush(heap, (again[0], True, other))
    return chosen if total >= pods else None
