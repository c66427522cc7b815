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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpufair.domain.capacity import EPS, Capacity, Journal, PodUse
from gpufair.domain.model import PlacementStrategy
from gpufair.domain.placement import (
    Ask,
    Exclusion,
    fit_on,
    place,
    pods_fit,
    pods_fit_empty,
)


@dataclass(frozen=True, slots=True)
class Victim:
    """A running workload that may be evicted, with what it holds."""

    uid: str
    queue: str
    tier: int
    priority_class: int
    started_at_s: float
    cu: float
    gpus: float
    gpu_type: str
    uses: tuple[PodUse, ...]

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
    victims: Sequence[Victim],
    budget: VictimBudget,
    already_leaving: Sequence[Sequence[PodUse]] = (),
) -> Selection | None:
    """The least-cost victims whose eviction lets `ask` fit (exactly `ask.pods_min` pods).

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
        for subset, constrained in _node_subsets(capacity, ask, exclusion):
            if not constrained and best is not None:
                break  # a preferred topology falls back to the pool only when no domain works
            found = _search(
                capacity, ask, strategy, exclusion, subset=subset, victims=victims, budget=budget
            )
            if found is None:
                continue
            key = (max((victim.tier for victim in found.victims), default=-(1 << 30)), found.cu)
            if best_key is None or key < best_key:
                best, best_key = found, key
        return best
    finally:
        capacity.restore(base)


def _node_subsets(
    capacity: Capacity, ask: Ask, exclusion: Exclusion
) -> list[tuple[list[int], bool]]:
    """Node sets to search, each flagged whether it is one topology domain."""
    usable = [
        index for index in capacity.by_type.get(ask.gpu_type, []) if not exclusion.blocks(index)
    ]
    topology = ask.topology
    if topology is None:
        return [(usable, False)]
    subsets: list[tuple[list[int], bool]] = []
    for _, members in sorted(capacity.domains(topology.level).get(ask.gpu_type, {}).items()):
        allowed = [index for index in members if not exclusion.blocks(index)]
        room = sum(pods_fit_empty(capacity.nodes[index], ask.shape) for index in allowed)
        if room >= ask.pods_min:
            subsets.append((allowed, True))
    if not topology.required:
        subsets.append((usable, False))
    return subsets


def _search(
    capacity: Capacity,
    ask: Ask,
    strategy: PlacementStrategy,
    exclusion: Exclusion,
    *,
    subset: list[int],
    victims: Sequence[Victim],
    budget: VictimBudget,
) -> Selection | None:
    in_subset = set(subset)
    on_node: dict[int, list[Victim]] = {}
    for victim in sorted(victims, key=Victim.preference):
        for node in {use.node for use in victim.uses}:
            if node in in_subset:
                on_node.setdefault(node, []).append(victim)
    trial: Journal = {}
    try:
        chosen = _greedy(capacity, ask, subset, on_node, budget=budget.copy(), trial=trial)
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
    on_node: dict[int, list[Victim]],
    *,
    budget: VictimBudget,
    trial: Journal,
) -> list[Victim] | None:
    shape, pods = ask.shape, ask.pods_min
    fits = {index: pods_fit(capacity.nodes[index], shape) for index in subset}
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

    heap: list[tuple[tuple[int, float, int, float, int], int]] = []
    for node in on_node:
        found = option(node)
        if found is not None:
            heap.append((found[0], node))
    heapq.heapify(heap)
    while total < pods and heap:
        key, node = heapq.heappop(heap)
        found = option(node)
        if found is None:
            continue
        if found[0] != key:
            heapq.heappush(heap, (found[0], node))  # stale score: re-rank, decide later
            continue
        touched: set[int] = set()
        for victim in found[1]:
            capacity.release(victim.uses, trial)
            released.add(victim.uid)
            budget.spend(victim)
            chosen.append(victim)
            touched.update(use.node for use in victim.uses)
        for index in touched:
            if index in fits:
                now = pods_fit(capacity.nodes[index], shape)
                total += now - fits[index]
                fits[index] = now
                again = option(index)
                if again is not None:
                    heapq.heappush(heap, (again[0], index))
    return chosen if total >= pods else None
