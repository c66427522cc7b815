"""The victim search's greedy by node (`victim_search`'s step 1): victims chosen node by node,
the best option first, until the workload's pods fit; `victim_search` has the design (who may
be a victim, the options' scores, partitions and shares), `victim_index` what is read and kept.

Speed: the greedy never scores every node. `VictimIndex` keeps, per node, a floor of any option's
score (its first victim's tier, class and start, its cheapest CU per GPU, and the tier it takes to
free one whole GPU), and a list of nodes sorted by floor, brought up to date when a search next
reads it. Nodes enter the heap with their floor as a lower bound and are scored exactly only when
they reach its top; full nodes are walked from that sorted list one at a time, beside the heap (the
walk's next node is taken when it sorts before the heap's top). A reclaim in a large busy pool
therefore reads a handful of nodes. A node that could not free one pod's whole GPUs even with all
its victims gone (`freeable_on_node`) is passed over without being scored (the walk passes one that
sorts before the heap's top by its key alone, before reading the node). A pod of several GPUs
walks, on an index of many nodes, a list of its own (`VictimIndex.tier_walk_order`): only the nodes
that can free its GPUs, each keyed by the tier it takes to free them all
(`VictimIndex.whole_tier`), not the one that frees one GPU, so the walk neither passes nodes it
cannot use nor meets, early, nodes whose first GPU is cheap and the rest are not (both more, the
larger the pool); on a smaller index it walks the list for one GPU, and a full node it meets goes
back to the heap unread when the tier it takes to free the pod's GPUs is above its key's. Each
node's victims are kept with their uses on that node; a node's option found in one search is kept
for the next while the node, its victims and the budgets it read are unchanged (`option_table`).
The walk's next node, due when its head is taken, is read only if the search goes on past the pick
that follows (most end there), with the nodes that pick changed read as they were before it.
Capacity already leaving for the workload (`already_leaving`), released for its search, is none of
the index's: the keys of the nodes it is on were made with it held (a GPU with a leaving 0.5 and a
victim 0.5 counted as no GPU its victims free), and those nodes enter the heap with a bound of
their own (`_leaving_bound`). Steps 2 and 3 are skipped where their outcome is known: a one-pod
search whose first pick is one victim on one node places the pod there without releasing anything
(`place_one_released`), and a gang whose picks were each one victim on a node of its own keeps them
all (`Picked`).
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from gpufair.domain.capacity import EPS, Capacity, Journal, NodeState, PodUse
from gpufair.domain.partition_geometry import Geometry
from gpufair.domain.placement_ask import Ask, Exclusion, PodShape
from gpufair.domain.placement_fit import fit_on, free_pods, pods_fit
from gpufair.domain.placement_release import place_one_released
from gpufair.domain.victim_index import (
    NEVER,
    NO_VICTIMS,
    Key,
    Option,
    Victim,
    VictimBudget,
    VictimIndex,
    WalkKey,
    release_on,
)


@dataclass(frozen=True, slots=True)
class Selection:
    """The victim search's answer (`victim_search.select_victims`): the victims and where the
    workload goes once they have stopped. Made here too, for the greedy's one-victim pick."""

    victims: tuple[Victim, ...]
    plan: list[PodUse]  # where the workload would go once the victims have stopped

    @property
    def cu(self) -> float:
        return sum(victim.cu for victim in self.victims)


class Picked(NamedTuple):
    """The greedy's victims, released in the capacity. `each_needed`: no victim can be put
    back with the gang still fitting, so the pruning would keep them all: each was a pick of
    one victim on a node of its own that no other pick touched, over the whole type with
    nothing excluded, for a shape without partitions, and the picks freed exactly the pods
    the gang needs, each at least one. Putting one back takes its node's pods back to what
    they were before its pick, one or more: the gang falls short, and `place` fails a plain
    gang exactly when its pods do not fit."""

    victims: list[Victim]
    each_needed: bool


_LOWER_BOUND, _EXACT, _WALK = 0, 1, 2
# Nodes with victims from which a search for pods of several GPUs walks the index's walk for
# pods of that many GPUs (`greedy`; `VictimIndex.tier_walk_order`). Counted on the benchmark's
# scrambled pools: at 1,000 nodes (indexes of up to 300 nodes) making and keeping such walks,
# from 32 or 256 nodes up, cost more than the passing they saved; at 4,000 nodes (up to 1,200)
# much less.
_TIER_WALK_NODES = 512
NOT_CHANGED: dict[int, bool] = {}  # `advance`: no node changed since the walk's next fell due


def greedy(
    capacity: Capacity,
    ask: Ask,
    subset: list[int] | None,
    index: VictimIndex,
    exclusion: Exclusion,
    *,
    budget: VictimBudget,
    trial: Journal,
    leaving_nodes: Collection[int],
    binpack: bool = False,
) -> Picked | Selection | None:
    """Victims chosen node by node, best option first, until `ask.pods_min` pods fit in
    `subset` (None: every node of the type). Releases them in the capacity under `trial`;
    `budget` is left as it was (the picks spend a copy).

    The common preemption and reclaim, one pod (whole GPUs, or a share of one; no partition)
    that fits on no node of the type now, nothing excluded, ends at a first pick of one victim
    on one node with the pod on that node: it is the only node the pick changes, so `place`
    after the release could only choose it (`placement_release.only_released` holds), and
    `place_one_released` says where without releasing anything (`binpack`: the strategy is
    binpack, which it mirrors). That pick is returned as the whole `Selection`: one victim
    cannot be pruned.

    With no `leaving_nodes` (`freeable_bounds`), the index's `freeable_on_node` bounds the whole
    GPUs a node can free (no capacity outside the index was released for the search), so a
    node that could not free one pod's GPUs, its option None whatever the budgets, never has
    its option computed: it does not enter the heap, and the walk passes it as before (so the walk reads the nodes
    after it at the same moments) without scoring it.

    `leaving_nodes`: nodes where capacity already leaving was released for the search (its
    `already_leaving`). The index's keys of such a node were made with that capacity held, and
    bound nothing now: a GPU with a leaving 0.5 and a victim 0.5 is one GPU its victim frees,
    for the victim's 5 CU, where the index counted no GPU its victims free (the tier NEVER) or
    10 CU per GPU. Each enters the heap with a bound that holds whatever was released
    (`_leaving_bound`); its keys, in the heap or the walk, are read as before, too high
    at worst, so it is scored once more at most."""
    shape, pods = ask.shape, ask.pods_min
    freeable_bounds = not leaving_nodes
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
    # A pod of several GPUs on a full node needs the tier that frees them all
    # (`VictimIndex.whole_tier`), often above the tier that frees one. On an index of many
    # nodes its walk is the index's for pods of that many GPUs (`_TIER_WALK_NODES`), keyed by that
    # tier and holding only the nodes that can free them (`tier_walk_order`): it passes no node it
    # could not use. On fewer, passing them costs less than keeping one more walk: the walk
    # for one GPU passes the nodes that could not free a pod's GPUs (`least_freeable`), and a
    # full node whose `whole_tier` is above its key's goes to the heap with that bound
    # (`tighten`), unread, read only if the bound reaches the top. Bounds while nothing
    # outside the index was released (`freeable_bounds`); a node a pick of this search
    # changed has its option in the heap already, read after the pick.
    tighten = freeable_bounds and whole > 1

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
        if plain_whole and (
            capacity.free_whole_by_type.get(ask.gpu_type, 0) < whole
            or not any(
                capacity.bucket(ask.gpu_type, free)
                for free in range(whole, capacity.max_gpus.get(ask.gpu_type, 0) + 1)
            )
        ):
            total = 0  # no node has a pod's GPUs free: the common case in a busy pool
        else:
            total = free_pods(capacity, shape, ask.gpu_type, exclusion)
    else:
        total = sum(fit_now(node) for node in subset)
    # No pod fits anywhere now (nothing excluded): a first pick of one victim on one node ends
    # the search with the pod there, placed without releasing (see the docstring).
    one_shot = (
        total == 0
        and pods == 1
        and subset is None
        and binpack
        and freeable_bounds
        and not blocking
        and not shape.profile
        and (whole > 0 or shape.shares_gpu)
    )
    released: set[str] = set()
    chosen: list[Victim] = []
    # Whether every pick so far was one victim on a node of its own (`Picked.each_needed`).
    lone_picks = subset is None and ask.topology is None and not blocking and not shape.profile
    picked_nodes: set[int] = set()
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
    # GPU amount one pod takes from one GPU-slot view: whole GPUs, a share, or nothing. A
    # partition's room is in slices, not in that view: its pods count as taking nothing here
    # (every node with victims enters the heap, its bound at the floor's cost; a 7g pod still
    # needs a whole GPU freed, `missing`).
    per_pod = float(whole) if whole else shape.gpus_per_pod if shape.shares_gpu else 0.0

    def plain_option(node: int) -> Option:
        """The node's best option now: kept from an earlier search or step if the node's
        capacity and victims are unchanged and so are the budgets it read or the answers of
        its budget tests (`same_tests`), else computed and kept. For a node without
        partitions and a pod of none (`option` is this one where there are none)."""
        state = nodes[node]
        version = state.version
        entry = table.get(node)
        if entry is not None and entry[0] == version:
            for queue, cu, gpus in entry[1]:
                if cu_left.get(queue, 0.0) != cu or gpus_left.get(queue, math.inf) != gpus:
                    break
            else:
                return entry[2]
            now_read = same_tests(entry[1], entry[3])
            if now_read is not None:
                table[node] = (version, now_read, entry[2], entry[3])
                return entry[2]
        read: list[tuple[str, float, float]] = []  # the budgets read, in first-read order
        used: list[float] | None = None  # the node's GPUs as victims go, copied at the first
        free_whole = state.free_whole  # GPUs of `used` at most EPS, kept as victims go
        cpu, memory = state.cpu_free, state.memory_free
        now = fit_now(node)
        spent_cu: dict[str, float] = {}
        spent_gpus: dict[str, float] = {}
        prefix: list[Victim] = []
        cost = 0.0
        top_tier = -NEVER
        for victim, uses in on_node.get(node, NO_VICTIMS).items():
            if victim.priority_class >= below_class or victim.uid in released:
                continue
            if used is None:
                used = state.gpu_used.copy()
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
                table[node] = (version, tuple(read) if read else (), (key, prefix), prefix)
                return key, prefix
        table[node] = (version, tuple(read) if read else (), None, prefix)
        return None

    # Partitions in play: a node whose GPUs hold or held partitions, or a pod of a partition,
    # has its options worked out exactly (`exact_option`, through `option`); without any (the
    # common case) `option` is `plain_option` and no node is asked, and in a pool that offers
    # none (`VictimIndex.partitions`) nothing else is read either. Neither `geometry` nor
    # the choice is read inside a nested function: a plain search makes no cell for them.
    option: Callable[[int], Option] = plain_option
    if index.partitions:
        geometry: Geometry | None = None
        if shape.profile:
            members_of_type = capacity.by_type.get(ask.gpu_type)
            if members_of_type:
                geometry = nodes[members_of_type[0]].geometry.get(shape.profile)
                if geometry is not None:
                    per_pod = 0.0
        if geometry is not None or capacity.partitioned_nodes(ask.gpu_type):
            # `exact_option` is made only here (in no plain search).

            def exact_option(node: int, state: NodeState, geometry: Geometry | None) -> Option:
                """`plain_option` for a node whose GPUs hold or held partitions, or for a pod of a
                partition (`geometry`: its profile's on the type): the option kept as there, else
                the same prefixes, budget tests and key, with the victims released as the
                capacity releases them (`victim_index.release_on`: a partition frees its GPU
                only as the last one there, and then all of it) and the pods counted as placement
                counts them (`partition_pods`: a partition's pods by the slices left free). The
                room a prefix makes is so what it frees for this pod's shape: a partition beside
                one that stays frees nothing for whole GPUs or plain shares, and one that leaves
                its GPU empty frees the whole GPU, whatever its own fraction."""
                version = state.version
                entry = table.get(node)
                if entry is not None and entry[0] == version:
                    for queue, cu, gpus in entry[1]:
                        if cu_left.get(queue, 0.0) != cu or gpus_left.get(queue, math.inf) != gpus:
                            break
                    else:
                        return entry[2]
                    now_read = same_tests(entry[1], entry[3])
                    if now_read is not None:
                        table[node] = (version, now_read, entry[2], entry[3])
                        return entry[2]
                read: list[tuple[str, float, float]] = []
                used = state.gpu_used.copy()
                slices = state.slices.copy() if state.slices is not None else [0] * state.gpu_count
                free_whole = state.free_whole
                cpu, memory = state.cpu_free, state.memory_free
                now = fit_now(node)
                spent_cu: dict[str, float] = {}
                spent_gpus: dict[str, float] = {}
                prefix: list[Victim] = []
                cost = 0.0
                top_tier = -NEVER
                for victim, uses in on_node.get(node, NO_VICTIMS).items():
                    if victim.priority_class >= below_class or victim.uid in released:
                        continue
                    if bounded:
                        queue = victim.queue
                        spent = spent_cu.get(queue)
                        if spent is None:
                            spent = spent_gpu = spent_cu[queue] = spent_gpus[queue] = 0.0
                            read.append(
                                (queue, cu_left.get(queue, 0.0), gpus_left.get(queue, math.inf))
                            )
                        else:
                            spent_gpu = spent_gpus[queue]
                        if victim.cu > cu_left.get(queue, 0.0) - spent + EPS or (
                            victim.gpus > gpus_left.get(queue, math.inf) - spent_gpu + EPS
                        ):
                            continue
                        spent_cu[queue] = spent + victim.cu
                        spent_gpus[queue] = spent_gpu + victim.gpus
                    prefix.append(victim)
                    cost += victim.cu
                    top_tier = victim.tier
                    for use in uses:
                        cpu += use.cpu_millicores
                        memory += use.memory_mib
                    free_whole += release_on(used, slices, uses)
                    if geometry is not None:
                        gained = partition_pods(
                            geometry, used, slices, free_whole, cpu, memory, shape
                        )
                    else:
                        gained = fit_on(used, free_whole, cpu, memory, shape)
                    gained -= now
                    if gained > 0:
                        key = (
                            top_tier,
                            cost / gained,
                            prefix[0].priority_class,
                            -prefix[0].started_at_s,
                            node,
                        )
                        table[node] = (version, tuple(read) if read else (), (key, prefix), prefix)
                        return key, prefix
                table[node] = (version, tuple(read) if read else (), None, prefix)
                return None

            option = functools.partial(_mixed_option, plain_option, exact_option, geometry, nodes)

    def same_tests(
        read: tuple[tuple[str, float, float], ...], passed: list[Victim]
    ) -> tuple[tuple[str, float, float], ...] | None:
        """The budgets a node's kept option reads now (`read`: as they were when it was
        computed), if each budget test `option` made for it would answer as it did; else None.
        Then the prefixes are the same, so the option is, and it need not be computed again
        (a budget changed by another eviction from a queue read rarely changes an answer:
        scrambled, 4,000 nodes, 1 of 4,601 kept options). Exact without reading the node: a
        test's spent CU and GPUs are its queue's earlier passes', so with the same passes, a
        test that failed fails again when no budget it read rose (its bound `budget - spent +
        EPS` can only fall), and the passes (`passed`, in order) are asked again."""
        for queue, cu, gpus in read:
            if cu_left.get(queue, 0.0) > cu or gpus_left.get(queue, math.inf) > gpus:
                return None  # a test that failed might pass now
        spent_cu: dict[str, float] = {}
        spent_gpus: dict[str, float] = {}
        for victim in passed:
            if victim.uid in released:
                return None
            queue = victim.queue
            spent = spent_cu.get(queue)
            if spent is None:
                spent = spent_gpu = 0.0
            else:
                spent_gpu = spent_gpus[queue]
            if victim.cu > cu_left.get(queue, 0.0) - spent + EPS or (
                victim.gpus > gpus_left.get(queue, math.inf) - spent_gpu + EPS
            ):
                return None
            spent_cu[queue] = spent + victim.cu
            spent_gpus[queue] = spent_gpu + victim.gpus
        return tuple(
            [
                (queue, cu_left.get(queue, 0.0), gpus_left.get(queue, math.inf))
                for queue, _, _ in read
            ]
        )

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
        if tier == NEVER:
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
        if tighten and len(floors) >= _TIER_WALK_NODES:
            # The walk for pods of `whole` GPUs: none is passed by its count or tightened.
            walk = iter(index.tier_walk_order(whole))
            tighten = False
        else:
            walk = iter(index.walk_order(whole > 0))
    else:
        starts = set(subset) if subset is not None else set(floors)
    for node in starts:
        key = bound(node)
        if key is not None and usable(node):
            heap.append((key, _LOWER_BOUND, node))
    for node in leaving_nodes:  # none in most searches
        if node in floors and whole <= nodes[node].gpu_count and usable(node):
            heap.append((_leaving_bound(index, node, missing(node)), _LOWER_BOUND, node))
    heapq.heapify(heap)

    every_node = members is None and not blocking  # `usable` holds for every node

    def advance(passing: bool, then: dict[int, bool] = NOT_CHANGED) -> tuple[Key, int, int] | None:
        """The next full node of the walk, as read now (nodes with room entered the heap at
        once). `passing`: nothing changes before the walk's next node is taken (the node
        taken from it last could not free one pod's GPUs, or none was yet), so a node that
        could not either and sorts before the heap's top, to be taken and passed next, is
        passed here. `then`: nodes changed since the walk's next node fell due, with whether
        each was a full node then (the rest are as they were)."""
        if walk is not None:
            # Passing with an empty heap, a node that could not free one pod's GPUs is passed
            # whatever else holds; with a heap, when its key sorts before the heap's top.
            skip_all = passing and not heap and least_freeable > 0
            top = heap[0][0] if passing and heap else None
            top_tier = top[0] if top is not None else 0
            for entry in walk:
                node = entry[4]
                tier, cu_per_gpu, priority_class, late, _ = entry
                if freeable[node] < least_freeable:
                    if skip_all:
                        continue  # passed whether or not it is a full node now
                    # Its key sorts before the top when its tier does (the first field: half
                    # the nodes passed here), so its key is made only on a tie of tiers.
                    if top is not None and (
                        tier < top_tier
                        or (
                            tier == top_tier
                            and (tier, cu_per_gpu * per_pod, priority_class, late, node) < top
                        )
                    ):
                        continue
                state = nodes[node]
                if (
                    (
                        then[node]
                        if then and node in then
                        else state.free_whole == 0 and (whole or node not in partial)
                    )
                    and (every_node or usable(node))
                    and whole <= state.gpu_count
                    and tier != NEVER
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
    # The walk's next node fell due when its head was taken, but is read only if the search
    # goes on (most end at the pick that follows): as it was then, the nodes a pick changed
    # since read as they were before it (`advance`'s `then`).
    due = False
    before_pick: dict[int, bool] = {}
    while total < pods:
        if due:
            head = advance(False, before_pick)
            due = False
            before_pick = {}
        if head is not None and (not heap or head < heap[0]):
            key, _, node = head
            if freeable[node] < least_freeable:
                # Its option is None: the walk passes it and reads its next node now.
                head = advance(True)
                continue
            due = True
            if tighten:
                tier = index.whole_tier(node, whole)
                if tier > key[0]:
                    heapq.heappush(heap, ((tier, *key[1:]), _LOWER_BOUND, node))
                    continue
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
        if one_shot and len(found[1]) == 1:
            victim = found[1][0]
            use = victim.uses[0]
            if len(victim.uses) == 1 and not use.slice_mask:
                plan = place_one_released(capacity, shape, use)
                if plan is not None:
                    used = nodes[node].gpu_used
                    if any(
                        used[gpu] > EPS and used[gpu] - use.gpu_amount <= EPS
                        for gpu in use.gpu_indices
                    ):
                        capacity.last_in_bucket(node)  # as releasing and restoring would
                    return Selection((victim,), plan)
        one_shot = False  # a pick released: the capacity is no longer as the test found it
        if bounded and spending is None:
            # The budget is copied at the first pick: a search that picks nothing copies none
            # (and one whose options never read the budgets spends none).
            spending = budget.copy()
            cu_left, gpus_left = spending.cu_left, spending.gpus_left
        if lone_picks:
            victim = found[1][0]
            lone_picks = (
                len(found[1]) == 1
                and len(victim.nodes) == 1
                and victim.nodes[0] not in picked_nodes
            )
            picked_nodes.add(victim.nodes[0])
        touched: set[int] = set()
        for victim in found[1]:
            for other in victim.nodes:
                fit_now(other)  # before the node changes
                if due and other not in before_pick:
                    before_pick[other] = nodes[other].free_whole == 0 and (
                        bool(whole) or other not in partial
                    )
            capacity.release(victim.uses, trial)
            released.add(victim.uid)
            if spending is not None:
                spending.spend(victim)
            chosen.append(victim)
            touched.update(victim.nodes)
        changed: list[int] = []
        gained = 0
        for other in touched:
            if usable(other):
                now = pods_fit(nodes[other], shape)
                gained += now - fits[other]
                fits[other] = now
                changed.append(other)
        total += gained
        if gained <= 0:
            # The pick freed no pod (a partition whose GPU other partitions still hold frees
            # nothing a plain share or whole GPU can use, though its option counted it): it
            # may be needless, so the pruning decides.
            lone_picks = False
        if total < pods:  # the nodes' next options are read only if the search goes on
            for other in changed:
                again = option(other)
                if again is not None:
                    heapq.heappush(heap, (again[0], _EXACT, other))
    if total < pods:
        return None
    return Picked(chosen, lone_picks and total == pods)


def _leaving_bound(index: VictimIndex, node: int, gap: float) -> Key:
    """A lower bound of `node`'s option whatever capacity was released there beside the index
    (`greedy`'s `leaving_nodes`), for a pod that needs `gap` GPUs freed there (`missing`):
    its first victim's tier, class and start, as the floor's (any option's prefix starts at or
    after that victim), and `gap` GPUs at the least CU per GPU any of its victims holds, each
    of its pods' GPUs counted (a pod frees at most the GPUs it holds, wholly: a share or a
    partition frees at most its one GPU, whatever its fraction)."""
    tier, _, priority_class, late, _ = index.floor_on_node[node]
    cheapest = min(
        [
            victim.cu / max(sum(len(use.gpu_indices) for use in victim.uses), 1)
            for victim in index.on_node[node]
        ]
    )
    return (tier, cheapest * gap, priority_class, late, node)


def _mixed_option(
    plain: Callable[[int], Option],
    exact: Callable[[int, NodeState, Geometry | None], Option],
    geometry: Geometry | None,
    nodes: list[NodeState],
    node: int,
) -> Option:
    """`greedy`'s `option` where partitions are in play: `exact` (its `exact_option`) for a
    node whose GPUs hold or held partitions, or for every node with a pod of a partition
    (`geometry`), else `plain` (its `plain_option`)."""
    state = nodes[node]
    if geometry is None and state.slices is None:
        return plain(node)
    return exact(node, state, geometry)


def partition_pods(
    geometry: Geometry,
    used: list[float],
    slices: list[int],
    free_whole: int,
    cpu_free: int,
    memory_free: int,
    shape: PodShape,
) -> int:
    """Pods of a partition (`geometry`) that fit on a node whose GPUs are so used and sliced:
    `partitions.pods_fit` on a node's copies (the victim search's options)."""
    count = geometry.per_empty_gpu * free_whole
    for occupied, gpu_used in zip(slices, used, strict=True):
        if occupied and gpu_used <= 1.0 + EPS:  # above 1.0: other work shares the GPU
            count += geometry.count(occupied)
    if shape.cpu_millicores > 0:
        count = min(count, cpu_free // shape.cpu_millicores)
    if shape.memory_mib > 0:
        count = min(count, memory_free // shape.memory_mib)
    if shape.one_per_node and count > 1:
        return 1
    return max(count, 0)
