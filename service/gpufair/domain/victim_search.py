"""The victim search: what to evict so a workload fits (DESIGN §4.3 reclaim, §4.4 preempt).

Who may be a victim is the caller's business (`cycle_reclaim`, `cycle_preempt`): reclaim offers
preemptible work past its `min_runtime_s` from queues above max(deserved, fair share); preempt
offers lower-priority preemptible work of the workload's own queue. Non-preemptible work is
never offered. This module answers: which of those, at least cost, make the workload fit — and
nothing more.

`VictimBudget` keeps each victim queue at or above its floor: reclaim never pushes a queue below
max(deserved, fair share), nor below a per-type guarantee (`deserved_gpus_by_type`, DESIGN §3.5).

The search, per GPU type (cheapest first, decided by the caller) and per node set:

1. Greedy by node. For every node, the shortest *prefix* of its victims in preference order
   (lowest priority tier, then lowest priority class, then most recently started) that lets one
   more pod fit is an option, scored by (highest victim tier in it, CU evicted per pod gained,
   then its first victim's class and start). The best option is taken, its victims are released
   from the capacity (everywhere they run), and options are re-scored lazily. Scoring by tier
   first makes a high tier reclaim from the lowest tier first (P0 takes from P2 before P1);
   scoring by CU per pod picks the fewest CU. A best-effort queue's work (weight 0) ranks below
   every tier (`Victim.tier`): it is reclaimed first (DESIGN §3.3).
2. The workload is then placed for real on the capacity with those victims released.
3. Pruning: victims are put back one at a time, last chosen first; any the placement does not need
   stays. The result is minimal: removing any one victim breaks the fit ("never evict more than
   needed").

Node sets: the whole type, or with a topology constraint each domain that could hold the gang,
freest first; the cheapest of the first three domains that work wins (a bound on the work in a
pool of hundreds of domains), and a preferred topology falls back to the whole type.

Speed: the greedy never scores every node. `VictimIndex` keeps, per node, a floor of any option's
score (its first victim's tier, class and start, its cheapest CU per GPU, and the tier it takes
to free one whole GPU), and a list of nodes sorted by floor, brought up to date when a search
next reads it. Nodes enter the heap with their floor as a lower bound and are scored exactly only
when they reach its top; full nodes are walked from that sorted list one at a time, beside the
heap (the walk's next node is taken when it sorts before the heap's top). A reclaim in a large
busy pool therefore reads a handful of nodes. A node that could not free one pod's whole GPUs
even with all its victims gone (`freeable_on_node`) is passed over without being scored. Each
node's victims are kept with their uses on that node; a node's option found in one search is
kept for the next while the node, its victims and the budgets it read are unchanged
(`option_table`).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from gpufair.domain.capacity import EPS, Capacity, Journal, PodUse
from gpufair.domain.model import PlacementStrategy
from gpufair.domain.placement import (
    Ask,
    Exclusion,
    PodShape,
    fit_on,
    free_pods,
    nodes_with_room,
    place,
    pods_fit,
)


@dataclass(slots=True, eq=False)
class Victim:
    """A running workload that may be evicted, with what it holds (compared by identity).
    Never changed once made; not a frozen dataclass only because the cycle makes one per
    running workload, and a frozen one takes three times as long to build."""

    uid: str
    queue: str
    tier: int  # its queue's eviction rank: the priority tier, below all tiers if best effort
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
    guarantee on the type being reclaimed; for preemption, only work of a priority class below
    `below_priority_class` may go."""

    def __init__(
        self,
        cu_left: Mapping[str, float],
        gpus_left: Mapping[str, float],
        below_priority_class: int | None = None,
    ) -> None:
        self.cu_left = dict(cu_left)
        self.gpus_left = dict(gpus_left)
        self.below_priority_class = below_priority_class

    def allows(self, victim: Victim, spent_cu: float = 0.0, spent_gpus: float = 0.0) -> bool:
        if self.below_priority_class is not None and (
            victim.priority_class >= self.below_priority_class
        ):
            return False
        cu_left = self.cu_left.get(victim.queue, 0.0) - spent_cu
        gpus_left = self.gpus_left.get(victim.queue, math.inf) - spent_gpus
        return victim.cu <= cu_left + EPS and victim.gpus <= gpus_left + EPS

    def spend(self, victim: Victim, sign: float = 1.0) -> None:
        self.cu_left[victim.queue] = self.cu_left.get(victim.queue, 0.0) - sign * victim.cu
        if victim.queue in self.gpus_left:
            self.gpus_left[victim.queue] -= sign * victim.gpus

    def evicted(self, victim: Victim, gpu_type: str) -> None:
        """`victim` was evicted: its queue has that much less to give, and GPUs of its type
        less above its guarantee if this budget is for that type. A queue left with nothing
        to give drops out, as a rebuilt budget would leave it out."""
        left = self.cu_left.get(victim.queue)
        if left is not None:
            if left - victim.cu > EPS:
                self.cu_left[victim.queue] = left - victim.cu
            else:
                del self.cu_left[victim.queue]
        if victim.gpu_type == gpu_type and victim.queue in self.gpus_left:
            self.gpus_left[victim.queue] -= victim.gpus

    def copy(self) -> VictimBudget:
        return VictimBudget(self.cu_left, self.gpus_left, self.below_priority_class)


# More nodes than this changed since a walk was read: it is sorted again rather than patched.
_RESORT_STALE = 32
# A tier no victim has: a node where no GPU can ever be wholly freed.
_NEVER = 1 << 30
_NO_VICTIMS: dict[Victim, tuple[PodUse, ...]] = {}
WalkKey = tuple[int, float, int, float, int]
Key = tuple[int, float, int, float, int]
Option = tuple[Key, list[Victim]] | None
# Per node, its last option: the version of the node's capacity it was computed at, the
# (queue, CU budget, GPU budget) it read, and the option.
OptionTable = dict[int, tuple[int, tuple[tuple[str, float, float], ...], Option]]


class VictimIndex:
    """Candidate victims of one GPU type by node, each node's list in eviction-preference order.
    The cycle keeps one per GPU type for the whole cycle and removes victims as it evicts them;
    the index only ever shrinks, which keeps every bound below valid."""

    def __init__(self, victims: Iterable[Victim], capacity: Capacity) -> None:
        self._capacity = capacity
        # Per node, its victims in preference order, each with its uses on that node (all of
        # them for a victim on one node): the search reads a node's part of a gang without
        # filtering the gang's uses, and a victim leaves a node in one step.
        self.on_node: dict[int, dict[Victim, tuple[PodUse, ...]]] = {}
        # Per node, the parts of a lower bound of any eviction option the node offers, whatever
        # the budgets: the first victim's tier, priority class and start, and the cheapest CU
        # per GPU. Removing victims only raises a floor.
        self.floor_on_node: dict[int, tuple[int, float, int, float]] = {}
        # Per node, the highest tier among the victims that must go, in preference order,
        # before one GPU is wholly free: a bound on the tier of any option for whole-GPU pods.
        self.whole_tier_on_node: dict[int, int] = {}
        # Per node, the GPUs wholly free once every victim on it has gone: no option of the
        # node frees more for whole-GPU pods. Counted against the capacity when the node's
        # victims last changed; capacity taken since (binds, holds) only lowers the truth, so
        # it stays a bound as long as nothing outside the index is released (`_greedy`).
        self.freeable_on_node: dict[int, int] = {}
        # Per queue, its victims (a dict as an ordered set: one leaves in one step).
        self.by_queue: dict[str, dict[Victim, None]] = {}
        self._present: set[Victim] = set()  # by identity: `remove` of a stranger is one look-up
        self._top_cu: dict[str, float] = {}  # per queue, its largest victim's CU (`prune`)
        self.total_gpus = 0.0
        self._domain_gpus: dict[str, dict[str, float]] = {}
        # Options kept between searches (`option_table`), emptied for a node when its victims
        # change.
        self._options: dict[tuple[PodShape, int | None, bool], OptionTable] = {}
        # The same tables by the shape object's identity (the object is kept, so its id is not
        # reused while the entry stands).
        self._last_table: dict[tuple[int, int | None, bool], tuple[PodShape, OptionTable]] = {}
        on_node = self.on_node
        for victim in sorted(victims, key=Victim.preference):
            if len(victim.nodes) == 1:
                on_node.setdefault(victim.nodes[0], {})[victim] = victim.uses
            else:
                split: dict[int, list[PodUse]] = {}
                for use in victim.uses:
                    split.setdefault(use.node, []).append(use)
                for node in victim.nodes:
                    on_node.setdefault(node, {})[victim] = tuple(split.get(node, ()))
            self.by_queue.setdefault(victim.queue, {})[victim] = None
            self._present.add(victim)
            self.total_gpus += victim.gpus
        for node in self.on_node:
            self._refresh(node)
        # Nodes sorted by their floor as full nodes, one list for whole-GPU pods and one for
        # shared ones, brought up to date when next read: the nodes whose floor changed since
        # are moved (bisect: the list moves in C), or the list is sorted again when many did
        # (evictions between two searches often remove many victims).
        self._walks: dict[bool, list[WalkKey]] = {}
        self._walk_key: dict[bool, dict[int, WalkKey]] = {}
        self._stale: dict[bool, set[int]] = {}  # per walk, the nodes changed since it was read

    def walk_order(self, whole_gpus: bool) -> list[WalkKey]:
        """Nodes in the order of their bound as full nodes: (tier, CU per GPU, priority class,
        -start, node). `whole_gpus`: the tier is that of freeing one whole GPU."""
        if self._stale.get(whole_gpus):
            self._update_walk(whole_gpus)
        found = self._walks.get(whole_gpus)
        if found is None:
            keys = self._walk_keys(self.floor_on_node, whole_gpus)
            found = sorted(keys.values())
            self._walks[whole_gpus] = found
            self._walk_key[whole_gpus] = keys
            self._stale[whole_gpus] = set()
        return found

    def _walk_keys(self, nodes: Iterable[int], whole_gpus: bool) -> dict[int, WalkKey]:
        """The walk's keys of those of `nodes` that have victims."""
        floors = self.floor_on_node
        tiers = self.whole_tier_on_node if whole_gpus else None
        found: dict[int, WalkKey] = {}
        for node in nodes:
            floor = floors.get(node)
            if floor is not None:
                tier = floor[0] if tiers is None else tiers[node]
                found[node] = (tier, floor[1], floor[2], -floor[3], node)
        return found

    def _rewalk(self, node: int) -> None:
        for stale in self._stale.values():
            stale.add(node)

    def _update_walk(self, whole_gpus: bool) -> None:
        stale = self._stale[whole_gpus]
        self._stale[whole_gpus] = set()
        resort = len(stale) > _RESORT_STALE
        order = self._walks[whole_gpus]
        keys = self._walk_key[whole_gpus]
        for node in stale:
            old = keys.pop(node, None)
            if old is not None and not resort:
                del order[bisect.bisect_left(order, old)]
        fresh = self._walk_keys(stale, whole_gpus)
        keys.update(fresh)
        if resort:
            order[:] = sorted(keys.values())
        else:
            for new in fresh.values():
                bisect.insort(order, new)

    def floor(self, node: int, whole_gpus: bool) -> tuple[int, float, int, float]:
        tier, cu_per_gpu, priority_class, started_at_s = self.floor_on_node[node]
        if whole_gpus:
            tier = self.whole_tier_on_node[node]
        return (tier, cu_per_gpu, priority_class, started_at_s)

    def domain_gpus(self, level: str) -> dict[str, float]:
        """GPUs held by victims per value of topology label `level`: counted from the victims
        at the first call for a level, then kept current by `remove`."""
        found = self._domain_gpus.get(level)
        if found is None:
            found = {}
            for node, here in self.on_node.items():
                value = self._capacity.nodes[node].labels.get(level)
                if value is not None:
                    gpus = sum(
                        use.gpu_amount * len(use.gpu_indices)
                        for uses in here.values()
                        for use in uses
                    )
                    found[value] = found.get(value, 0.0) + gpus
            self._domain_gpus[level] = found
        return found

    def prune(self, queue: str, max_cu: float) -> None:
        """Drop `queue`'s victims bigger than `max_cu`: its budget can only shrink. Usually
        none is: the queue's largest victim, remembered, says so without a scan."""
        queued = self.by_queue.get(queue)
        if not queued:
            return
        top = self._top_cu.get(queue)
        if top is None:
            top = self._top_cu[queue] = max(victim.cu for victim in queued)
        if top <= max_cu + EPS:
            return
        for victim in [v for v in queued if v.cu > max_cu + EPS]:
            self.remove(victim)

    def remove(self, victim: Victim) -> None:
        if victim not in self._present:
            return
        self._present.discard(victim)
        if victim.cu >= self._top_cu.get(victim.queue, math.inf):
            del self._top_cu[victim.queue]
        del self.by_queue[victim.queue][victim]
        self.total_gpus -= victim.gpus
        for use in victim.uses:
            gpus = use.gpu_amount * len(use.gpu_indices)
            labels = self._capacity.nodes[use.node].labels
            for level, totals in self._domain_gpus.items():
                value = labels.get(level)
                if value is not None:
                    totals[value] -= gpus
        for node in victim.nodes:
            here = self.on_node.get(node)
            if here is not None and victim in here:
                del here[victim]
                self._refresh(node)
                self._rewalk(node)

    def option_table(self, shape: PodShape, below: int | None, bounded: bool) -> OptionTable:
        """The options found so far for pods of `shape` (victims of a priority class below
        `below`; budgets tested or not): per node, the last option computed, with the version
        of the node's capacity it was computed at and the budgets it read (one per node: an
        option of a state a search made, victims released, is of no use once the search is
        over). An option is a function of the node's
        capacity, its victims, the shape and the budgets of the queues of the victims it read,
        and nothing else: a search finding an entry at the node's current version whose
        budgets are unchanged has the option without computing it."""
        same = self._last_table.get((id(shape), below, bounded))
        if same is not None and same[0] is shape:
            return same[1]  # the shape object of an earlier search: no hash of its fields
        key = (shape, below, bounded)
        found = self._options.get(key)
        if found is None:
            found = self._options[key] = {}
        self._last_table[(id(shape), below, bounded)] = (shape, found)
        return found

    def _refresh(self, node: int) -> None:
        for table in self._options.values():
            table.pop(node, None)
        here = self.on_node[node]
        if not here:
            del self.on_node[node]
            del self.floor_on_node[node]
            del self.whole_tier_on_node[node]
            del self.freeable_on_node[node]
            return
        # Victims come in preference order, so any option's first victim is this one or one
        # that sorts after it: its tier, class and start bound the option's key.
        first = next(iter(here))
        if len(here) == 1:
            cheapest = first.cu / first.gpus if first.gpus > 0 else 0.0
        else:
            cheapest = min(victim.cu / victim.gpus if victim.gpus > 0 else 0.0 for victim in here)
        self.floor_on_node[node] = (
            first.tier,
            cheapest,
            first.priority_class,
            first.started_at_s,
        )
        state = self._capacity.nodes[node]
        used = state.gpu_used.copy()
        freeable = state.free_whole  # the GPUs of `used` at most EPS
        whole_tier = first.tier if freeable else _NEVER
        for victim, uses in here.items():
            for use in uses:
                amount = use.gpu_amount
                for gpu in use.gpu_indices:
                    before = used[gpu]
                    after = used[gpu] = before - amount
                    if before > EPS and after <= EPS:
                        freeable += 1
                        if whole_tier == _NEVER:
                            whole_tier = victim.tier
        self.whole_tier_on_node[node] = whole_tier
        self.freeable_on_node[node] = freeable

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
    if ask.pods_max != ask.pods_min or ask.pool_levels:
        ask = Ask(ask.shape, ask.gpu_type, ask.pods_min, ask.pods_min, ask.topology)
    base = Journal()
    for uses in already_leaving:
        capacity.release(uses, base)
    try:
        best: Selection | None = None
        best_key: tuple[int, float] | None = None  # made when a second selection is found
        found_in_domains = 0
        for subset in _subsets(capacity, ask, exclusion, index):
            if subset is None and best is not None:
                break  # a preferred topology falls back to the pool only when no domain works
            if found_in_domains >= _DOMAINS_COMPARED:
                break
            found = _search(
                capacity,
                ask,
                strategy,
                exclusion,
                subset=subset,
                index=index,
                budget=budget,
                freeable_bounds=not already_leaving,
            )
            if found is None:
                continue
            found_in_domains += subset is not None
            if best is None:
                best = found
                continue
            if best_key is None:
                best_key = _rank(best)
            key = _rank(found)
            if key < best_key:
                best, best_key = found, key
        return best
    finally:
        capacity.restore(base)


def _rank(selection: Selection) -> tuple[int, float]:
    """Selections of different node sets compare by their highest victim tier, then CU."""
    tiers = [victim.tier for victim in selection.victims]
    return (max(tiers, default=-(1 << 30)), selection.cu)


# Domains whose search succeeded, compared for the cheapest before settling: a bound on the work
# per reclaim in a pool of hundreds of domains. Domains are tried freest first.
_DOMAINS_COMPARED = 3


def _subsets(
    capacity: Capacity, ask: Ask, exclusion: Exclusion, index: VictimIndex
) -> Iterator[list[int] | None]:
    """Node sets worth searching: topology domains (lists of nodes), and None for the whole
    type. A set is dropped at once when even evicting every victim in it could not free the
    GPUs the gang needs. A domain's list of nodes is made when the search reaches it: most
    searches stop after a few."""
    needed_gpus = ask.pods_min * ask.shape.gpus_per_pod
    whole_pods = ask.shape.gpus_per_pod >= 1.0  # whole-GPU pods cannot use shared GPUs' rest
    # An upper bound of the free GPUs (held nodes included): a cheap test for the pool.
    free_gpus = float(capacity.free_whole_by_type.get(ask.gpu_type, 0))
    if not whole_pods:
        free_gpus += len(capacity.partial_nodes(ask.gpu_type))
    topology = ask.topology
    pool: list[list[int] | None] = []
    if free_gpus + index.total_gpus >= needed_gpus - EPS:
        pool = [None]
    if topology is None:
        yield from pool
        return
    nodes = capacity.nodes
    free_by_node = {
        node: nodes[node].free_whole if whole_pods else nodes[node].free_gpus()
        for node in nodes_with_room(capacity, ask.shape, ask.gpu_type)
        if not exclusion.blocks(node)
    }
    free_by_domain: dict[str, float] = {}
    for node, free in free_by_node.items():
        value = nodes[node].labels.get(topology.level)
        if value is not None:
            free_by_domain[value] = free_by_domain.get(value, 0.0) + free
    victim_gpus = index.domain_gpus(topology.level)
    domains = capacity.domains(topology.level).get(ask.gpu_type, {})
    values: Iterable[str] = domains
    if needed_gpus > EPS:
        # A domain with neither free GPUs nor victims could not hold a pod: only domains
        # that have either are tested (a handful of a pool's hundreds).
        values = [value for value in {*free_by_domain, *victim_gpus} if value in domains]
    ranked = sorted(
        (-free_by_domain.get(value, 0.0), value)
        for value in values
        if free_by_domain.get(value, 0.0) + victim_gpus.get(value, 0.0) >= needed_gpus - EPS
    )
    for _, value in ranked:
        yield [node for node in domains[value] if not exclusion.blocks(node)]
    if not topology.required:
        yield from pool


def _search(
    capacity: Capacity,
    ask: Ask,
    strategy: PlacementStrategy,
    exclusion: Exclusion,
    *,
    subset: list[int] | None,
    index: VictimIndex,
    budget: VictimBudget,
    freeable_bounds: bool,
) -> Selection | None:
    trial = Journal()
    try:
        chosen = _greedy(
            capacity,
            ask,
            subset,
            index,
            exclusion,
            budget=budget,
            trial=trial,
            freeable_bounds=freeable_bounds,
        )
        if chosen is None:
            return None
        plan = place(capacity, ask, strategy, exclusion)
        if plan is None:
            return None
        if len(chosen) == 1 and subset is None:
            # The search began because the type's free pods fell short: without its one
            # victim, nothing fits (a domain search may find room outside its domain instead).
            return Selection((chosen[0],), plan)
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


_LOWER_BOUND, _EXACT, _WALK = 0, 1, 2


def _greedy(
    capacity: Capacity,
    ask: Ask,
    subset: list[int] | None,
    index: VictimIndex,
    exclusion: Exclusion,
    *,
    budget: VictimBudget,
    trial: Journal,
    freeable_bounds: bool,
) -> list[Victim] | None:
    """Victims chosen node by node, best option first, until `ask.pods_min` pods fit in
    `subset` (None: every node of the type). Releases them in the capacity under `trial`;
    `budget` is left as it was (the picks spend a copy).

    `freeable_bounds`: the index's `freeable_on_node` bounds the whole GPUs a node can free
    (no capacity outside the index was released for the search), so a node that could not free
    one pod's GPUs, its option None whatever the budgets, never has its option computed: it
    does not enter the heap, and the walk passes it as before (so the walk reads the nodes
    after it at the same moments) without scoring it."""
    shape, pods = ask.shape, ask.pods_min
    on_node = index.on_node
    floors = index.floor_on_node
    nodes = capacity.nodes
    freeable = index.freeable_on_node
    # Whole GPUs a node must be able to free to be read at all (0: no such bound).
    least_freeable = shape.whole_gpus if freeable_bounds else 0
    members = None if subset is None else set(subset)
    blocking = exclusion.blocks_any()

    def usable(node: int) -> bool:
        return (members is None or node in members) and not (blocking and exclusion.blocks(node))

    # Pods that fit now: the total from the memo, per node on first need (and always before
    # the node changes, so every change is counted exactly once).
    fits: dict[int, int] = {}

    whole = shape.whole_gpus
    plain_whole = whole > 0 and not shape.profile  # none fits where fewer GPUs are free

    def fit_now(node: int) -> int:
        found = fits.get(node)
        if found is None:
            if plain_whole and nodes[node].free_whole < whole:
                found = 0
            else:
                found = pods_fit(nodes[node], shape) if usable(node) else 0
            fits[node] = found
        return found

    if subset is None:
        if plain_whole and capacity.free_whole_by_type.get(ask.gpu_type, 0) < whole:
            total = 0  # no node has a pod's GPUs free: the common case in a busy pool
        else:
            total = free_pods(capacity, shape, ask.gpu_type, exclusion)
    else:
        total = sum(fit_now(node) for node in subset)
    released: set[str] = set()
    chosen: list[Victim] = []
    below = budget.below_priority_class
    below_class = math.inf if below is None else below  # victims must be of a class below it
    cu_left, gpus_left = budget.cu_left, budget.gpus_left
    spending: VictimBudget | None = None  # the copy the picks spend, made at the first
    # No victim's queue has a capped loss (preemption inside one queue): the budget test
    # always passes and is skipped.
    bounded = (
        bool(gpus_left)
        or any(map(math.inf.__ne__, cu_left.values()))  # some CU budget is finite
        or not index.by_queue.keys() <= cu_left.keys()  # some victim's queue has none
    )

    table = index.option_table(shape, below, bounded)

    def option(node: int) -> Option:
        """The node's best option now: kept from an earlier search or step if the node's
        capacity, victims and the budgets it read are unchanged, else computed and kept."""
        state = nodes[node]
        version = state.version
        entry = table.get(node)
        if entry is not None and entry[0] == version:
            for queue, cu, gpus in entry[1]:
                if cu_left.get(queue, 0.0) != cu or gpus_left.get(queue, math.inf) != gpus:
                    break
            else:
                return entry[2]
        read: list[tuple[str, float, float]] = []  # the budgets read, in first-read order
        used = state.gpu_used.copy()
        free_whole = state.free_whole  # GPUs of `used` at most EPS, kept as victims go
        cpu, memory = state.cpu_free, state.memory_free
        now = fit_now(node)
        spent_cu: dict[str, float] = {}
        spent_gpus: dict[str, float] = {}
        prefix: list[Victim] = []
        cost = 0.0
        top_tier = -_NEVER
        for victim, uses in on_node.get(node, _NO_VICTIMS).items():
            if victim.uid in released or victim.priority_class >= below_class:
                continue
            if bounded:
                queue = victim.queue
                spent = spent_cu.get(queue)
                if spent is None:
                    spent = spent_gpu = spent_cu[queue] = spent_gpus[queue] = 0.0
                    read.append((queue, cu_left.get(queue, 0.0), gpus_left.get(queue, math.inf)))
                else:
                    spent_gpu = spent_gpus[queue]
                if victim.cu > cu_left.get(queue, 0.0) - spent + EPS or (
                    victim.gpus > gpus_left.get(queue, math.inf) - spent_gpu + EPS
                ):
                    continue  # `VictimBudget.allows`, inline: the innermost loop of the search
                spent_cu[queue] = spent + victim.cu
                spent_gpus[queue] = spent_gpu + victim.gpus
            prefix.append(victim)
            cost += victim.cu
            top_tier = victim.tier  # the highest so far: a node's victims come tier by tier
            for use in uses:
                amount = use.gpu_amount
                for gpu in use.gpu_indices:
                    before = used[gpu]
                    after = used[gpu] = before - amount
                    if before > EPS and after <= EPS:
                        free_whole += 1
                    elif before <= EPS and after > EPS:
                        free_whole -= 1
                cpu += use.cpu_millicores
                memory += use.memory_mib
            if whole and free_whole // whole <= now:
                continue  # no more whole-GPU pods than now, whatever CPU and memory say
            gained = fit_on(used, free_whole, cpu, memory, shape) - now
            if gained > 0:
                # Ties on tier and cost go to the option whose first victim is preferred
                # (lower priority class, then most recent): the order victims are listed in.
                key = (
                    top_tier,
                    cost / gained,
                    prefix[0].priority_class,
                    -prefix[0].started_at_s,
                    node,
                )
                table[node] = (version, tuple(read), (key, prefix))
                return key, prefix
        table[node] = (version, tuple(read), None)
        return None

    # GPU amount one pod takes from one GPU-slot view: whole GPUs, a share, or nothing.
    per_pod = float(whole) if whole else shape.gpus_per_pod if shape.shares_gpu else 0.0
    partial = capacity.partial_nodes(ask.gpu_type)

    def missing(node: int) -> float:
        """GPUs that must be freed on the node before one more pod can fit there."""
        state = nodes[node]
        if whole:
            return float(max(whole - state.free_whole, 0))
        if per_pod == 0.0:
            return 0.0
        room = max((1.0 - used for used in state.gpu_used), default=0.0)
        return max(per_pod - room, 0.0)

    def bound(node: int) -> Key | None:
        """A lower bound of the node's option, component by component: one more pod needs
        `missing(node)` GPUs freed, each costing at least the node's cheapest CU per GPU."""
        if node not in floors or whole > nodes[node].gpu_count or freeable[node] < least_freeable:
            return None
        gap = missing(node)
        tier, cu_per_gpu, priority_class, started_at_s = index.floor(node, whole > 0 and gap > 0)
        if tier == _NEVER:
            return None
        return (tier, cu_per_gpu * gap, priority_class, -started_at_s, node)

    # Lazy evaluation: nodes enter with a lower bound; only nodes that reach the top are
    # simulated exactly, and an exact score is re-checked when popped, since an earlier pick may
    # have spent a victim queue's budget or freed room on the node. Over the whole type, full
    # nodes are walked in floor order (their bound is the floor times one pod's GPUs: the same
    # order), so a reclaim reads few nodes however large the pool. The walk is a sorted stream
    # beside the heap, not in it: its next node (`head`) is taken when it sorts before the
    # heap's top, as it would pop from a heap holding it.
    heap: list[tuple[Key, int, int]] = []
    walk: Iterator[WalkKey] | None = None
    if subset is None and per_pod > 0.0:
        # Nodes with some room and victims enter directly (their bound is below the walk's);
        # read from whichever of the two sets is smaller (a node without victims has no bound).
        # Nodes with room are at most the type's free GPUs (plus its part-used nodes).
        roomy = capacity.free_whole_by_type.get(ask.gpu_type, 0) + (0 if whole else len(partial))
        starts: set[int] = set()  # none when the type has no room at all
        if roomy and len(floors) <= roomy:
            starts = {
                node
                for node in floors
                if nodes[node].free_whole > 0 or (not whole and node in partial)
            }
        elif roomy:
            rooms = [
                capacity.bucket(ask.gpu_type, free)
                for free in range(1, capacity.max_gpus.get(ask.gpu_type, 0) + 1)
            ]
            if not whole:
                rooms.append(partial)
            starts = {node for room in rooms for node in room if node in floors}
        walk = iter(index.walk_order(whole > 0))
    else:
        starts = set(subset) if subset is not None else set(floors)
    for node in starts:
        key = bound(node)
        if key is not None and usable(node):
            heap.append((key, _LOWER_BOUND, node))
    heapq.heapify(heap)

    every_node = members is None and not blocking  # `usable` holds for every node

    def advance(passing: bool) -> tuple[Key, int, int] | None:
        """The next full node of the walk, as read now (nodes with room entered the heap at
        once). `passing`: nothing changes before the walk's next node is taken (the node
        taken from it last could not free one pod's GPUs, or none was yet), so a node that
        could not either and sorts before the heap's top, to be taken and passed next, is
        passed here."""
        if walk is not None:
            for tier, cu_per_gpu, priority_class, late, node in walk:
                if passing and not heap and freeable[node] < least_freeable:
                    continue  # passed whether or not it is a full node now
                state = nodes[node]
                if (
                    state.free_whole == 0
                    and (whole or node not in partial)
                    and (every_node or usable(node))
                    and whole <= state.gpu_count
                    and tier != _NEVER
                ):
                    key = (tier, cu_per_gpu * per_pod, priority_class, late, node)
                    if (
                        passing
                        and freeable[node] < least_freeable
                        and (not heap or key < heap[0][0])
                    ):
                        continue
                    return (key, _WALK, node)
        return None

    head = advance(True)
    while total < pods:
        if head is not None and (not heap or head < heap[0]):
            key, _, node = head
            if freeable[node] < least_freeable:
                # Its option is None: the walk passes it and reads its next node now.
                head = advance(True)
                continue
            head = advance(False)
        elif heap:
            key, _, node = heapq.heappop(heap)
        else:
            break
        found = option(node)
        if found is None:
            continue
        if found[0] != key:
            # A bound that is exact is taken at once: its exact entry would be the next pop
            # (every other entry sorts after this one, and nothing changes in between).
            heapq.heappush(heap, (found[0], _EXACT, node))
            continue
        if bounded and spending is None:
            # The budget is copied at the first pick: a search that picks nothing copies none
            # (and one whose options never read the budgets spends none).
            spending = budget.copy()
            cu_left, gpus_left = spending.cu_left, spending.gpus_left
        touched: set[int] = set()
        for victim in found[1]:
            for other in victim.nodes:
                fit_now(other)  # before the node changes
            capacity.release(victim.uses, trial)
            released.add(victim.uid)
            if spending is not None:
                spending.spend(victim)
            chosen.append(victim)
            touched.update(victim.nodes)
        changed: list[int] = []
        for other in touched:
            if usable(other):
                now = pods_fit(nodes[other], shape)
                total += now - fits[other]
                fits[other] = now
                changed.append(other)
        if total < pods:  # the nodes' next options are read only if the search goes on
            for other in changed:
                again = option(other)
                if again is not None:
                    heapq.heappush(heap, (again[0], _EXACT, other))
    return chosen if total >= pods else None
