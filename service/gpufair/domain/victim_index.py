"""Candidate victims of one GPU type (`VictimIndex`), what each victim queue may still lose
(`VictimBudget`) and the victims themselves (`Victim`): what the victim search reads
(`victim_search`, whose docstring has the design, and `victim_greedy`, whose docstring has
the bounds kept here).

The cycle keeps one index per GPU type (per queue and type for preemption) for a whole phase and
removes victims from it as they are evicted; the index only ever shrinks, which keeps every bound
valid. Per node it keeps the victims in eviction-preference order with their uses on that node,
a floor of any option's score, the tier it takes to free one whole GPU and the GPUs wholly
freeable; walks of the nodes sorted by floor are brought up to date when next read; and the
options searches found, kept for the next search while a node, its victims and the budgets they
read are unchanged.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpufair.domain.capacity import EPS, Capacity, NodeState, PodUse
from gpufair.domain.placement_ask import PodShape


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


# A walk with fewer than this many nodes per node changed since it was read is filtered and
# sorted again (a pass over the walk, in Python, and a sort) rather than patched node by node
# (per node, two bisects and two moves of the list's tail, in C). At 16 (chosen on the steady
# mix before the tier walks) a walk of 1,000 nodes was sorted again past 62 changed nodes;
# patching up to a quarter of the walk costs fewer instructions in the scrambled and steady
# cycles at 1,000 and 4,000 nodes (bench/results/cycle.md, round 27).
_PATCHED_PER_STALE = 4
# A tier no victim has: a node where no GPU can ever be wholly freed.
NEVER = 1 << 30
NO_VICTIMS: dict[Victim, tuple[PodUse, ...]] = {}
WalkKey = tuple[int, float, int, float, int]
Key = tuple[int, float, int, float, int]
Option = tuple[Key, list[Victim]] | None
# Per node, its last option: the version of the node's capacity it was computed at, the
# (queue, CU budget, GPU budget) it read, the option, and the victims its budget tests passed
# (the option's prefix; for None, every victim that passed).
OptionTable = dict[int, tuple[int, tuple[tuple[str, float, float], ...], Option, list[Victim]]]


class VictimIndex:
    """Candidate victims of one GPU type by node, each node's list in eviction-preference order.
    The cycle keeps one per GPU type for the whole cycle and removes victims as it evicts them;
    the index only ever shrinks, which keeps every bound below valid."""

    # Per walk for pods of several GPUs (`tier_walk_order`), each node's key in it: the key it
    # is found by when the node changes. Made with the first such walk (most indexes have none).
    _tier_keys: dict[int, dict[int, WalkKey]] | None = None
    # Per count of GPUs wholly freeable (`freeable_on_node`), how many nodes have it: made at
    # the first `freeable_pods` (only preemption's room test asks) and kept by every change
    # after it.
    _freeable_counts: dict[int, int] | None = None

    def __init__(
        self, victims: Iterable[Victim], capacity: Capacity, partitions: bool | None = None
    ) -> None:
        self._capacity = capacity
        # Whether the pool offers partitions at all (`offers_partitions`; `partitions`: the
        # caller's answer, asked once for many indexes). Where it does not (the common pool),
        # no node holds or ever held one, and neither the index nor the search reads a node's
        # slices or the partitioned nodes: the plain path branches once, here.
        self.partitions = offers_partitions(capacity) if partitions is None else partitions
        # Per node, its victims in preference order, each with its uses on that node (all of
        # them for a victim on one node): the search reads a node's part of a gang without
        # filtering the gang's uses, and a victim leaves a node in one step.
        self.on_node: dict[int, dict[Victim, tuple[PodUse, ...]]] = {}
        # Per node, the parts of a lower bound of any eviction option the node offers, whatever
        # the budgets, as the node's key in the walk for shared pods (`walk_order`): the first
        # victim's tier, the cheapest CU per GPU, the first victim's priority class and its
        # start negated, and the node. Removing victims only raises a floor.
        self.floor_on_node: dict[int, WalkKey] = {}
        # Per node, its key in the walk for whole-GPU pods: the floor with the highest tier
        # among the victims that must go, in preference order, before one GPU is wholly free
        # (a bound on the tier of any option for whole-GPU pods), and its CU per GPU the
        # cheapest of the floor's and, for each GPU shares leave wholly free, their CU per
        # pod summed (a share beside free room frees its whole GPU for its own CU).
        self._whole_key: dict[int, WalkKey] = {}
        # Per node, for each count n of GPUs wholly free, the tier it takes to have n: the tier of
        # the victim, in preference order, whose going frees the n-th (a node's free GPUs take
        # its first victim's), none past the GPUs freeable (`whole_tier`).
        self._whole_tiers: dict[int, tuple[int, ...]] = {}
        # Per node, the GPUs wholly free once every victim on it has gone: no option of the
        # node frees more for whole-GPU pods. Counted against the capacity when the node's
        # victims last changed; capacity taken since (binds, holds) only lowers the truth, so
        # it stays a bound as long as nothing outside the index is released
        # (`victim_greedy.greedy`).
        self.freeable_on_node: dict[int, int] = {}
        # Per queue, its victims (a dict as an ordered set: one leaves in one step).
        self.by_queue: dict[str, dict[Victim, None]] = {}
        # Per queue, its largest victim's CU and how many victims have it (`prune`): made at
        # the first prune, kept by `remove` until the last of them leaves.
        self._top_cu: dict[str, list[float]] = {}
        self.total_gpus = 0.0
        self._domain_gpus: dict[str, dict[str, float]] = {}
        # Per level counted in `_domain_gpus`, each node's value of it (`Capacity.domain_of`).
        self._domain_of: dict[str, list[str | None]] = {}
        self._domain_order: dict[str, list[str]] = {}  # `domain_order`
        # Options kept between searches (`option_table`), emptied for a node when its victims
        # change.
        self._options: dict[tuple[PodShape, int | None, bool], OptionTable] = {}
        # The same tables by the shape object's identity (the object is kept, so its id is not
        # reused while the entry stands).
        self._last_table: dict[tuple[int, int | None, bool], tuple[PodShape, OptionTable]] = {}
        on_node = self.on_node
        by_queue = self.by_queue
        ordered = sorted(victims, key=Victim.preference)
        total_gpus = 0.0
        queue: str | None = None
        queued: dict[Victim, None] = {}
        for victim in ordered:
            nodes = victim.nodes
            if len(nodes) == 1:
                here = on_node.get(nodes[0])
                if here is None:
                    on_node[nodes[0]] = {victim: victim.uses}
                else:
                    here[victim] = victim.uses
            else:
                split: dict[int, list[PodUse]] = {}
                for use in victim.uses:
                    split.setdefault(use.node, []).append(use)
                for node in nodes:
                    on_node.setdefault(node, {})[victim] = tuple(split.get(node, ()))
            if victim.queue != queue:  # tier by tier, a queue in one: neighbours mostly share it
                queue = victim.queue
                found = by_queue.get(queue)
                if found is None:
                    found = by_queue[queue] = {}
                queued = found
            queued[victim] = None
            total_gpus += victim.gpus  # summed in this order, as `remove` takes them back
        self.total_gpus = total_gpus
        # Nodes sorted by their keys, one list for whole-GPU pods and one for shared ones (the
        # keys are kept per node as victims leave: a walk is made or patched without building
        # any), brought up to date when next read: the nodes whose key changed since are moved
        # (bisect: the list moves in C), or, when many did (evictions between two searches
        # often remove many victims), the list keeps its other keys and is sorted with the new
        # ones after them (one sorted run and a short tail: about one comparison per key).
        self._walks: dict[int, list[WalkKey]] = {}
        # Per walk, the nodes changed since it was read, each with its key in the walk.
        self._stale: dict[int, dict[int, WalkKey]] = {}
        # Each CU per GPU in the keys once, as one float object (`_set_keys`): nodes' keys
        # often tie on it (victims of whole GPUs of a type: its weight), and a comparison of
        # two keys (the walks' sorts and bisects) passes equal fields by identity without
        # reading the floats, objects of their own spread over memory.
        self._cu_values: dict[float, float] = {}
        self._set_keys(on_node)

    def walk_order(self, whole_gpus: bool) -> list[WalkKey]:
        """Nodes in the order of their bound as full nodes: (tier, CU per GPU, priority class,
        -start, node). `whole_gpus`: the tier is that of freeing one whole GPU."""
        found = self._walks.get(whole_gpus)
        if found is None:
            found = sorted((self._whole_key if whole_gpus else self.floor_on_node).values())
            self._walks[whole_gpus] = found
            self._stale[whole_gpus] = {}
        elif self._stale[whole_gpus]:
            self._update_walk(whole_gpus, found)
        return found

    def tier_walk_order(self, gpus: int) -> list[WalkKey]:
        """`walk_order` for pods of `gpus` (more than one) whole GPUs: the tier is that of
        freeing `gpus` GPUs (`whole_tier`), and only the nodes that can free them
        (`freeable_on_node`) are in it: a walk that neither passes a node that cannot free a
        pod's GPUs nor meets one whose first GPU is cheap and the rest are not."""
        found = self._walks.get(gpus)
        if found is None:
            whole_keys = self._whole_key
            if self._tier_keys is None:
                self._tier_keys = {}
            in_walk = self._tier_keys[gpus] = {}
            for node, tiers in self._whole_tiers.items():
                if len(tiers) >= gpus:
                    key = whole_keys[node]
                    tier = tiers[gpus - 1]
                    # The key for one GPU itself when the tiers agree: one tuple fewer a node.
                    in_walk[node] = key if tier == key[0] else (tier, *key[1:])
            found = self._walks[gpus] = sorted(in_walk.values())
            self._stale[gpus] = {}
        elif self._stale[gpus]:
            self._update_tier_walk(gpus, found, self._stale[gpus])
        return found

    def _update_walk(self, whole_gpus: bool, order: list[WalkKey]) -> None:
        """Bring the walk `order` up to date with the nodes changed since it was read."""
        stale = self._stale[whole_gpus]
        keys = self._whole_key if whole_gpus else self.floor_on_node
        if len(stale) * _PATCHED_PER_STALE > len(order):
            order[:] = [key for key in order if key[4] not in stale]
            order += [keys[node] for node in stale if node in keys]
            order.sort()
        else:
            for node, old in stale.items():
                new = keys.get(node)
                if new == old:
                    continue  # its victims changed, not its key
                _drop(order, old)
                if new is not None:
                    bisect.insort(order, new)
        stale.clear()

    def _update_tier_walk(self, gpus: int, order: list[WalkKey], stale: dict[int, WalkKey]) -> None:
        """`_update_walk` for the walk of pods of `gpus` whole GPUs: its keys in the walk are
        kept per node (`_tier_keys`; `stale` has the nodes changed, their keys for one GPU:
        `remove` keeps every walk's stale nodes alike)."""
        assert self._tier_keys is not None
        in_walk = self._tier_keys[gpus]
        whole_keys = self._whole_key
        now_tiers = self._whole_tiers
        patch = len(stale) * _PATCHED_PER_STALE <= len(order)
        if not patch:
            order[:] = [key for key in order if key[4] not in stale]
        for node in stale:
            old = in_walk.get(node)
            tiers = now_tiers.get(node)
            if tiers is not None and len(tiers) >= gpus:
                key = whole_keys[node]
                tier = tiers[gpus - 1]
                new = in_walk[node] = key if tier == key[0] else (tier, *key[1:])
                if patch:
                    if new == old:
                        continue
                    if old is not None:
                        _drop(order, old)
                    bisect.insort(order, new)
                else:
                    order.append(new)
            elif old is not None:
                del in_walk[node]
                if patch:
                    _drop(order, old)
        if not patch:
            order.sort()
        stale.clear()

    def freeable_pods(self, whole: int) -> int:
        """A bound on the pods of `whole` GPUs the index's nodes could hold, each node's GPUs
        wholly freeable (`freeable_on_node`, its free GPUs among them) with every victim gone:
        a bound while no capacity has been released on them since, outside the index. From a
        count of the nodes per GPUs freeable (`_freeable_counts`), a few terms, not a read of
        every node."""
        counts = self._freeable_counts
        if counts is None:
            counts = self._freeable_counts = {}
            for freeable in self.freeable_on_node.values():
                counts[freeable] = counts.get(freeable, 0) + 1
        return sum([count * (freeable // whole) for freeable, count in counts.items()])

    def whole_tier(self, node: int, gpus: int) -> int:
        """A bound on the tier of any option that leaves `gpus` GPUs of `node` wholly free,
        counted against its capacity when its victims last changed (NEVER if none can): a
        bound while no capacity has been released on the node since, outside the index. An
        option takes its victims in preference order, tier by tier, so it frees no more GPUs
        than all the victims of its highest tier and below."""
        tiers = self._whole_tiers[node]
        return tiers[gpus - 1] if 0 < gpus <= len(tiers) else NEVER

    def floor(self, node: int, whole_gpus: bool) -> tuple[int, float, int, float]:
        """The node's floor: (tier, CU per GPU, priority class, start) of its walk's key.
        `whole_gpus`: the key for whole-GPU pods, its tier that of freeing one whole GPU and
        its CU per GPU wholly freed (`_set_keys`)."""
        tier, cu_per_gpu, priority_class, late, _ = (
            self._whole_key if whole_gpus else self.floor_on_node
        )[node]
        return (tier, cu_per_gpu, priority_class, -late)

    def domain_gpus(self, level: str) -> dict[str, float]:
        """GPUs held by victims per value of topology label `level`: counted from the victims
        at the first call for a level, then kept current by `remove`."""
        found = self._domain_gpus.get(level)
        if found is None:
            found = {}
            values = self._domain_of[level] = self._capacity.domain_of(level)
            for node, here in self.on_node.items():
                value = values[node]
                if value is not None:
                    gpus = sum(
                        use.gpu_amount * len(use.gpu_indices)
                        for uses in here.values()
                        for use in uses
                    )
                    found[value] = found.get(value, 0.0) + gpus
            self._domain_gpus[level] = found
            self._domain_order[level] = sorted(found)
        return found

    def domain_order(self, level: str) -> list[str]:
        """The values of `level` that `domain_gpus(level)` counts, sorted: made with it (a
        value is never added once counted, only its GPUs taken back)."""
        found = self._domain_order.get(level)
        if found is None:
            self.domain_gpus(level)
            found = self._domain_order[level]
        return found

    def prune(self, queue: str, max_cu: float) -> None:
        """Drop `queue`'s victims bigger than `max_cu`: its budget can only shrink. Usually
        none is: the queue's largest victim, remembered, says so without a scan (the queue's
        victims are read again only once every victim of that CU has left)."""
        queued = self.by_queue.get(queue)
        if not queued:
            return
        top = self._top_cu.get(queue)
        if top is None:
            most, count = -math.inf, 0
            for victim in queued:
                cu = victim.cu
                if cu > most:
                    most, count = cu, 1
                elif cu == most:
                    count += 1
            top = self._top_cu[queue] = [most, count]
        if top[0] <= max_cu + EPS:
            return
        for victim in [v for v in queued if v.cu > max_cu + EPS]:
            self.remove(victim)

    def remove(self, victim: Victim) -> None:
        queued = self.by_queue.get(victim.queue)
        if queued is None or victim not in queued:
            return
        del queued[victim]
        top = self._top_cu.get(victim.queue)
        if top is not None and victim.cu >= top[0]:  # one of the queue's largest
            top[1] -= 1
            if not top[1]:
                del self._top_cu[victim.queue]
        self.total_gpus -= victim.gpus
        if self._domain_gpus:  # kept only once a topology search asked for them
            domain_of = self._domain_of
            for use in victim.uses:
                gpus = use.gpu_amount * len(use.gpu_indices)
                for level, totals in self._domain_gpus.items():
                    value = domain_of[level][use.node]
                    if value is not None:
                        totals[value] -= gpus
        for node in victim.nodes:
            here = self.on_node.get(node)
            if here is not None and victim in here:
                del here[victim]
                for whole_gpus, stale in self._stale.items():
                    if node not in stale:  # its key in the walk: the one before its first change
                        stale[node] = (self._whole_key if whole_gpus else self.floor_on_node)[node]
                if here:
                    for table in self._options.values():
                        table.pop(node, None)
                    self._set_keys((node,))
                else:
                    # The node leaves the index; its kept options stay, unread: searches read
                    # the options of nodes with victims only.
                    del self.on_node[node]
                    del self.floor_on_node[node]
                    del self._whole_key[node]
                    del self._whole_tiers[node]
                    freeable = self.freeable_on_node.pop(node)
                    if self._freeable_counts is not None:
                        self._freeable_counts[freeable] -= 1

    def option_table(self, shape: PodShape, below: int | None, bounded: bool) -> OptionTable:
        """The options found so far for pods of `shape` (victims of a priority class below
        `below`; budgets tested or not): per node, the last option computed, with the version
        of the node's capacity it was computed at and the budgets it read (one per node: an
        option of a state a search made, victims released, is of no use once the search is
        over). An option is a function of the node's
        capacity, its victims, the shape and the answers of its budget tests, and nothing
        else: a search finding an entry at the node's current version whose budgets are
        unchanged has the option without computing it, and one whose budgets changed (another
        eviction from a queue it read) has it when each test, asked again, answers as before
        (`victim_greedy.greedy`'s `same_tests`)."""
        same = self._last_table.get((id(shape), below, bounded))
        if same is not None and same[0] is shape:
            return same[1]  # the shape object of an earlier search: no hash of its fields
        key = (shape, below, bounded)
        found = self._options.get(key)
        if found is None:
            found = self._options[key] = {}
        self._last_table[(id(shape), below, bounded)] = (shape, found)
        return found

    def _set_keys(self, nodes: Iterable[int]) -> None:
        """Make the floor, the key for whole-GPU pods and the GPUs wholly freeable of each of
        `nodes`, from its victims now (all nodes in one call when the index is built, not one
        call per node).

        The floor's CU per GPU is the cheapest victim's CU per GPU it holds: a plain share
        frees exactly its fraction of a GPU's use, so room for a pod that shares a GPU costs
        at least that. A whole-GPU pod needs GPUs wholly freed, and a share's going frees its
        whole GPU when the rest of it is free or goes too: each share's pod can wholly free
        at most its one GPU, so an option that frees a GPU holding shares spends at least the
        CU per pod of the shares on it (a victim's CU spread over its pods, none counted
        twice), and one that frees a whole-GPU victim's GPUs at least its CU per GPU. The
        key for whole-GPU pods takes the cheaper of the two (its bound: the CU per GPU
        wholly freed of any option). Shares filling a GPU cost at least the floor's CU per
        GPU (their CU per pod is their CU per GPU times their fraction, and the fractions make
        the GPU): only a GPU used in part, shares beside free room, can be freed for less, so
        only a node with one is read again (`_beside_room`)."""
        on_node = self.on_node
        floors = self.floor_on_node
        whole_keys = self._whole_key
        whole_tiers = self._whole_tiers
        freeable_on = self.freeable_on_node
        counts = self._freeable_counts  # None while no room test asked (`freeable_pods`)
        states = self._capacity.nodes
        partitions = self.partitions  # False: no node's slices to read (`offers_partitions`)
        same = self._cu_values
        for node in nodes:
            here = on_node[node]
            # Victims come in preference order, so any option's first victim is this one or
            # one that sorts after it: its tier, class and start bound the option's key.
            first = next(iter(here))
            tier = first.tier
            priority_class = first.priority_class
            late = -first.started_at_s
            state = states[node]
            if partitions and state.slices is not None:  # a node that holds or held partitions
                self._set_partition_keys(node, here, state)
                continue
            freeable = state.free_whole  # GPUs used at most EPS, counted on as victims go
            if len(here) == 1:
                cheapest = first.cu / first.gpus if first.gpus > 0 else 0.0
                cheapest = same.setdefault(cheapest, cheapest)
                floors[node] = key = (tier, cheapest, priority_class, late, node)
                uses = here[first]
                if len(uses) == 1 and len((use := uses[0]).gpu_indices) == 1:
                    # One victim holding one GPU of the node (three nodes in four of a
                    # queue's preemption index): its GPU alone is read, no copy of them all.
                    amount = use.gpu_amount
                    before = state.gpu_used[use.gpu_indices[0]]
                    if before > EPS and before - amount <= EPS:
                        freeable += 1
                        if amount < 1.0:
                            # A share leaving its GPU empty: the GPU for its CU per pod.
                            key = (tier, min(cheapest, first.cu / len(first.uses)), *key[2:])
                    whole_keys[node] = (
                        key if freeable else (NEVER, cheapest, priority_class, late, node)
                    )
                    whole_tiers[node] = (tier,) * freeable
                    if counts is not None:
                        _recount(counts, freeable_on[node], freeable)
                    freeable_on[node] = freeable
                    continue
            else:
                cheapest = min(v.cu / v.gpus if v.gpus > 0 else 0.0 for v in here)
                cheapest = same.setdefault(cheapest, cheapest)
                floors[node] = (tier, cheapest, priority_class, late, node)
            used = state.gpu_used.copy()
            tiers = [tier] * freeable  # GPUs free already: any option's first victim's tier
            for victim, uses in here.items():
                for use in uses:
                    amount = use.gpu_amount
                    for gpu in use.gpu_indices:
                        before = used[gpu]
                        after = used[gpu] = before - amount
                        if before > EPS and after <= EPS:
                            tiers.append(victim.tier)
            if state.partial_gpus:  # none in a full pool: the floor's CU per GPU holds
                cheapest = _beside_room(here, state.gpu_used, cheapest)
                cheapest = same.setdefault(cheapest, cheapest)
            first_tier = tiers[0] if tiers else NEVER
            floor = floors[node]
            # The floor itself when the two agree (a GPU freed at the first victim's tier, at the
            # floor's CU per GPU): one tuple fewer a node, and walks that share it.
            whole_keys[node] = (
                floor
                if first_tier == tier and cheapest == floor[1]
                else (first_tier, cheapest, priority_class, late, node)
            )
            whole_tiers[node] = tuple(tiers)
            if counts is not None:
                _recount(counts, freeable_on[node], len(tiers))
            freeable_on[node] = len(tiers)

    def _set_partition_keys(
        self, node: int, here: dict[Victim, tuple[PodUse, ...]], state: NodeState
    ) -> None:
        """`_set_keys` for a node whose GPUs hold or held partitions. A partition's going frees
        none of its GPU while other partitions stay there, and the whole GPU when the last one
        goes (`capacity`), whatever its fraction: the GPUs wholly freeable are counted so
        (`release_on`). A victim's pod can free at most its GPUs, so its CU per GPU slot its
        pods hold (a partition's or a share's pod: one GPU; a whole pod: its GPUs) bounds the
        CU per GPU freed: the cheapest of them is the node's floor (a partition of 1/7 that
        frees its GPU costs 1/7 of a GPU's CU)."""
        first = next(iter(here))
        tier = first.tier
        priority_class = first.priority_class
        late = -first.started_at_s
        cheapest = min(
            victim.cu / max(sum(len(use.gpu_indices) for use in victim.uses), 1) for victim in here
        )
        self.floor_on_node[node] = (tier, cheapest, priority_class, late, node)
        used = state.gpu_used.copy()
        slices = (state.slices or []).copy()
        tiers = [tier] * state.free_whole  # GPUs free already: any option's first victim's tier
        for victim, uses in here.items():
            freed = release_on(used, slices, uses)
            tiers.extend([victim.tier] * freed)
        self._whole_key[node] = (tiers[0] if tiers else NEVER, cheapest, priority_class, late, node)
        self._whole_tiers[node] = tuple(tiers)
        if self._freeable_counts is not None:
            _recount(self._freeable_counts, self.freeable_on_node[node], len(tiers))
        self.freeable_on_node[node] = len(tiers)

    def __bool__(self) -> bool:
        return bool(self.on_node)


def _recount(counts: dict[int, int], old: int, new: int) -> None:
    """A node's GPUs wholly freeable went from `old` to `new`: `counts` (nodes per count,
    `VictimIndex._freeable_counts`) moves it."""
    counts[old] -= 1
    counts[new] = counts.get(new, 0) + 1


def _drop(order: list[WalkKey], key: WalkKey) -> None:
    """Take `key` out of the walk `order`: the walk's first entry when it is that object (the
    node a search took first, whose victims were evicted: at 4,000 nodes, scrambled, a third
    of the patches; a bisect compares keys field by field, log2 of the walk's length of them),
    else the entry a bisect finds."""
    if order and order[0] is key:
        del order[0]
    else:
        del order[bisect.bisect_left(order, key)]


def offers_partitions(capacity: Capacity) -> bool:
    """Whether some GPU type of the capacity's pool offers a partition profile (its nodes'
    `geometry`, one per type). Where none does, no node holds or ever held a partition: a use
    covering slices is made only from its node's geometry (`capacity.uses_of`,
    `partitions.assign`), so every node's `slices` stays None and `partitioned_nodes` empty,
    and the victim search and the tests before it can pass over every partition case without
    reading a node (`VictimIndex.partitions`). A few reads per GPU type."""
    nodes = capacity.nodes
    return any(nodes[members[0]].geometry for members in capacity.by_type.values())


def _beside_room(
    here: dict[Victim, tuple[PodUse, ...]], gpu_used: list[float], cheapest: float
) -> float:
    """`cheapest` (a node's floor's CU per GPU), or less: the CU per pod of the shares on a GPU
    used in part that the node's victims (`here`) leave wholly free, summed per GPU, for the
    cheapest such GPU (`VictimIndex._set_keys`). A GPU used in part holds shares only; their
    uses are taken off in the order `_set_keys` takes them, so the GPUs found freed are its."""
    left: dict[int, float] = {}
    spent: dict[int, float] = {}
    for victim, uses in here.items():
        for use in uses:
            amount = use.gpu_amount
            if amount >= 1.0:
                continue
            for gpu in use.gpu_indices:
                used = left.get(gpu)
                if used is None:
                    used = gpu_used[gpu]
                    if not EPS < used < 1.0 - EPS:
                        continue  # free, or full: no room beside its shares
                left[gpu] = used - amount
                spent[gpu] = spent.get(gpu, 0.0) + victim.cu / len(victim.uses)
    for gpu, used in left.items():
        if used <= EPS:
            cheapest = min(cheapest, spent[gpu])
    return cheapest


def release_on(used: list[float], slices: list[int], uses: Iterable[PodUse]) -> int:
    """Release `uses` from one node's GPUs as `Capacity.release` does, on copies of its
    `gpu_used` and `slices` (a node that holds or held partitions); returns the GPUs it left
    wholly free (used at most EPS) that were not. A partition gives back its slices, and its
    GPU's 1.0 only when its slices are the last (`capacity._apply_partition`); other pods
    give back their amount."""
    freed = 0
    for use in uses:
        mask = use.slice_mask
        if mask:
            gpu = use.gpu_indices[0]
            held = slices[gpu]
            slices[gpu] = left = held & ~mask
            if held and not left:
                before = used[gpu]
                after = used[gpu] = before - 1.0
                if before > EPS and after <= EPS:
                    freed += 1
            continue
        amount = use.gpu_amount
        for gpu in use.gpu_indices:
            before = used[gpu]
            after = used[gpu] = before - amount
            if before > EPS and after <= EPS:
                freed += 1
    return freed
