"""Phase 3 of the cycle: preempt (DESIGN §4.4).

Inside one queue, pending work evicts preemptible work of a lower priority class (past
`min_runtime_s`), if the queue ends within its fair share or does not grow. `victim_search` picks
the victims, lowest class and most recent first.

A failed preemption of a workload kind on a GPU type is remembered for the rest of the phase in
its queue and type (`_Own`, by the placement problem's identity, one object per problem:
`kind_of`); a type with no victim of a class below the workload's (the floor, raised as the last
victim of a class is evicted) is closed to it and to the queue's later work without a look at
the memo, the limits or the victims' totals (made per queue and type at their first test). A try that evicts nothing with every type closed or remembered finds its trial
dead, and the queue's later workloads of it are passed over before a try. A queue's first search
on a type, and any for pods of two GPUs or more or that share a GPU, is not made (nor, at the
first, its victims indexed) when those victims could not free a pod's whole GPUs on enough
nodes (in one domain, for a gang that must keep to one), a GPU counted freed only when nothing
but such victims uses it (`_room_short`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Iterable, Iterator
from operator import attrgetter

from gpufair.domain.capacity import EPS, Capacity
from gpufair.domain.cycle_evict import commit
from gpufair.domain.cycle_reclaim import preemptible_running
from gpufair.domain.cycle_state import CycleState, Pending
from gpufair.domain.placement_ask import Ask, Exclusion
from gpufair.domain.queuebook import UNCAPPED
from gpufair.domain.snapshot import EvictReason, PendingCode
from gpufair.domain.victim_index import offers_partitions
from gpufair.domain.victim_node_sets import room_beside_shares
from gpufair.domain.victim_search import Victim, VictimBudget, VictimIndex, select_victims

_by_order = attrgetter("order")


def preempt(state: CycleState) -> None:
    now_s = state.snapshot.now_s
    # (queue, GPU type) → its victims, each with its priority class (`_Own.victims`)
    own: dict[tuple[str, str], dict[Victim, int]] = {}
    evicted = state.evicted
    for running in preemptible_running(state):
        victim = running.victim
        if now_s - victim.started_at_s >= running.min_runtime_s and victim.uid not in evicted:
            key = (victim.queue, victim.gpu_type)
            found = own.get(key)
            if found is None:
                own[key] = {victim: victim.priority_class}
            else:
                found[victim] = victim.priority_class
    # Per queue, its victims on each GPU type (`_Own`), and their lowest priority class there:
    # a workload of a class at or below it has no one to preempt on that type, nor has any
    # later workload of the queue (the queue's work comes in falling class, and the phase only
    # removes victims).
    mine: dict[str, dict[str, _Own]] = {}
    floors: dict[str, dict[str, int]] = {}
    for (name, gpu_type), victims in own.items():
        on_types = floors.get(name)
        if on_types is None:
            on_types = floors[name] = {}
            mine[name] = {}
        floor = on_types[gpu_type] = min(victims.values())
        mine[name][gpu_type] = _Own(victims, floor)
    budgets: dict[tuple[str, int], VictimBudget] = {}
    # Whether the pool offers partitions at all (`victim_index.offers_partitions`): asked once
    # for the phase, not per test or index; without (the common pool) no test reads them.
    # And per GPU type its part-used nodes: the capacity's own sets, changed in place as the
    # phase takes and releases (read as `victim_greedy.greedy` reads them across its picks),
    # asked once.
    partitions = offers_partitions(state.capacity)
    capacity = state.capacity
    part_used = {gpu_type: capacity.partial_nodes(gpu_type) for gpu_type in capacity.by_type}
    # Per queue, the trials (`Pending.trial`, either preemptibility: types and placement
    # problem, all the test reads of a kind) found dead: every type closed for the queue
    # (`_try_preempt`), so a later workload of one would only pass over them again, and is not
    # tried.
    dead: dict[str, set[int]] = {name: set() for name in floors}
    # The queues that have victims, in the order of `CycleState.by_queue_order`; each queue's
    # workloads that want to preempt (`_wanting`) are read in place as they come (what a
    # workload is then is what it was when the phase began: a try changes only its own), and
    # the queues tied in the order are merged by workload order.
    pending = state.queue_pending
    for run in state.queue_runs(name for name in pending if name in floors):
        if len(run) == 1:
            name = run[0]
            queue_own = mine[name]
            dead_here = dead[name]
            for item in _wanting(pending[name], floors[name], dead_here):
                _try_preempt(state, item, queue_own, dead_here, budgets, partitions, part_used)
            continue
        wanted = [list(_wanting(pending[name], floors[name], dead[name])) for name in run]
        for item in heapq.merge(*wanted, key=_by_order):
            name = item.book.name
            if item.trial not in dead[name]:  # it may have died since its list was read
                _try_preempt(state, item, mine[name], dead[name], budgets, partitions, part_used)
    # Only this phase reads them: later evictions need not keep them current.
    state.preempt_index = {}
    state.preempt_totals = {}


class _Own:
    """A queue's victims of one GPU type in the phase and what its tries learned of them: the
    lowest priority class among those not evicted (`floor`, raised as the last of a class
    leaves: `_try_preempt`), their CU and GPUs by class (`_totals`, made at the first cheap
    test), their index (made at the first search, of the victims of a class below its
    workload's: `indexed_below`) and the placement problems whose search failed (by the
    identity of their memo key, `kind_of`: a shape that found no victims at one class finds
    none at a lower one, with fewer victims and less capacity).

    `victims` holds those not evicted, each with its priority class, in `state.running`'s
    order: a search's victims leave it as they are evicted (`_try_preempt`; only such a
    search evicts them in the phase), so the room tests, which read every victim of a lower
    class, neither read an evicted one nor test a uid against `CycleState.evicted`, and pass
    over a victim of another class by the number beside it, without reading the victim. At
    4,000 nodes, scrambled, with the benchmark's 200 queues the tests read 15.8 x the
    victims they read at 1,000 (each queue holds four times the victims and is tested four
    times as often); 29,758 of the 103,528 read were evicted and 26,493 of another class
    (bench/results/cycle.md, round 30)."""

    __slots__ = ("failed", "floor", "index", "indexed_below", "room", "totals", "victims")

    def __init__(self, victims: dict[Victim, int], floor: int) -> None:
        self.victims = victims
        self.floor = floor
        self.totals: dict[int, list[float]] | None = None
        self.index: VictimIndex | None = None
        # The class the index's victims are below: the first search's workload's. The queue's
        # later searches are for work of no higher class (`_wanting`), so a victim of that
        # class or above could never be chosen: the index, its walks and its searches read
        # none (at 1,000 nodes, scrambled, the phase's indexes hold 1,785 victims, not 2,382).
        self.indexed_below = 0
        self.failed: set[int] = set()
        # The last whole-GPU room test that found the room short (`_room_short`): the class it
        # read victims below, and per count of GPUs a node could have wholly free, how many
        # nodes could. None before one.
        self.room: tuple[int, dict[int, int]] | None = None


def _wanting(items: list[Pending], floors: dict[str, int], dead: set[int]) -> Iterator[Pending]:
    """The workloads of a queue (its `items`, in order) that want to preempt: not placed, its
    reason still no room or over its share, its trial not found dead (`dead`), with someone to
    preempt at all on a type it could use: a class above the queue's victims' lowest on some
    type (`floors`). A workload without one could only fail (no class below its own on any of
    its types), and later workloads of its queue, of no higher class, fail the same way
    whatever it left in the memo. A queue's workloads are sorted by (-priority class, submit
    time, uid) (`cycle_load`), so its first at or below its lowest class on any type ends its
    list. The lowest class over a workload's types is the same for every workload of the
    queue with those types: answered once per types (a handful of sets in a queue, where
    kinds are nearly one per workload), and neighbours in a queue's list mostly share their
    kind: the last answer is kept. A workload placed or held, or of a dead trial, is passed
    over before its class or that answer is read (at 4,000 nodes, next cycle: 8,931 and 8,484
    of the 23,417 walked, where the kind changes at nearly every other one); the list's end
    is then met at its first other workload at or below the lowest class, which no workload
    after it would pass either."""
    codes = (PendingCode.NO_CAPACITY, PendingCode.OVER_FAIR_SHARE)
    floor = min(floors.values())
    least_of: dict[tuple[str, ...], float] = {}
    last_kind: object = None
    least = math.inf
    for item in items:
        if item.done or item.code not in codes or item.trial in dead:
            continue
        priority_class = item.workload.priority_class
        if priority_class <= floor:
            return
        kind = item.kind
        if kind is not last_kind:
            last_kind = kind
            types = kind.types
            found = least_of.get(types)
            if found is None:
                found = least_of[types] = min(
                    [floors.get(gpu_type, math.inf) for gpu_type in types], default=math.inf
                )
            least = found
        if priority_class > least:
            yield item


# Preemption reads no held nodes (every node is open to the workload's search).
_NOTHING_EXCLUDED = Exclusion()


def _try_preempt(
    state: CycleState,
    item: Pending,
    mine: dict[str, _Own],
    dead: set[int],
    budgets: dict[tuple[str, int], VictimBudget],
    partitions: bool,
    part_used: dict[str, dict[int, None]],
) -> None:
    """Evict victims of `item`'s queue for it on the first of its types where a search finds
    some. `mine`: the queue's victims per type (`_Own`); `dead`: the queue's dead trials.
    `budgets`: one per (queue, priority class), made at its first search and given to the
    next: a search only ever spends a copy (`victim_greedy.greedy`). `partitions`: whether
    the pool offers partitions at all (`victim_index.offers_partitions`); `part_used`: the
    part-used nodes of each GPU type (`Capacity.partial_nodes`).

    A type is closed for the queue's later workloads of `item`'s trial when it has no victim
    of a class below `item`'s (later ones are of no higher class) or its memo key failed;
    a try that evicts nothing with every type closed finds the trial dead (both of its
    preemptibilities: the test reads neither). Left open: a type the queue's limits refuse,
    and one whose victims found would not keep the queue within its share."""
    workload = item.workload
    book = item.book
    kind = item.kind
    memo_key = id(kind.memo_key)  # one object per placement problem (`kind_of`)
    below = workload.priority_class
    open_types = False
    # Read at the first type the floor and the memo leave open (at 4,000 nodes, next, about
    # two tries in five find none): the gang minimum, and whether no limit can cap the work
    # beyond the share (`QueueBook.never_caps`: `pods_allowed` would answer its own pods on
    # every type).
    pods = 0
    uncapped = capped_out = False
    # The kind's CU per pod on each type is the workload's (`CycleState.cu_per_pod`).
    for gpu_type, cu_per_pod in zip(kind.types, kind.cu_per_pod, strict=True):
        # No victim below its class: no search could find one (the memo is not asked).
        own = mine.get(gpu_type)
        if own is None or own.floor >= below:
            continue
        failed = own.failed
        if memo_key in failed:
            continue
        if not pods:
            pods = workload.gang_min_pods
            uncapped = book.never_caps(workload.preemptible)
            capped_out = uncapped and min(UNCAPPED[0], workload.pods) < pods
        if (
            capped_out
            if uncapped
            else state.pods_allowed(item, gpu_type, within_share=False) < pods
        ):
            open_types = True
            continue
        # Cheap necessary conditions before any search: enough GPUs could be freed, and the
        # swap could keep the queue within its share or from growing.
        needed_cu = pods * cu_per_pod
        most_cu = most_gpus = 0.0
        totals = own.totals
        if totals is None:
            totals = own.totals = _totals(state, book.name, gpu_type, own.victims)
        for priority_class, (cu, gpus, _) in totals.items():
            if priority_class < below:
                most_cu += cu
                most_gpus += gpus
        shape = kind.shape
        if (
            most_cu <= 0.0
            or (
                shape.gpus_per_pod >= 1.0
                and state.capacity.free_whole_by_type.get(gpu_type, 0) + most_gpus
                < pods * shape.gpus_per_pod - EPS
                # A partition victim holds its fraction but may free its whole GPU: with
                # partitions on the type, the victims' GPUs bound nothing.
                and not (partitions and state.capacity.partitioned_nodes(gpu_type))
                # A share frees its whole GPU when the rest of it is free: the free part of
                # part-used GPUs counts too (read only when the rest falls short, and there
                # are some).
                and not (
                    part_used.get(gpu_type)
                    and state.capacity.free_whole_by_type.get(gpu_type, 0)
                    + most_gpus
                    + room_beside_shares(state.capacity, gpu_type)
                    >= pods * shape.gpus_per_pod - EPS
                )
                # Work already leaving for it is free for its search (`already_leaving`),
                # uncounted here.
                and item.uid not in state.leaving_for
            )
            or not (
                book.allocated_cu - most_cu + needed_cu <= book.fair_share_cu + EPS
                or needed_cu <= most_cu + EPS
            )
        ):
            failed.add(memo_key)
            continue
        leaving = state.leaving_for.get(item.uid)
        index = own.index
        # No search (nor, at the first, an index of the queue's victims of the type) when those
        # victims could not make room for the gang whatever is chosen: asked at the first
        # search, and again at each for pods of two GPUs or more, which most often fail so
        # (a full node's victims of a lower class seldom free that much of it).
        if (
            not leaving
            and (index is None or shape.whole_gpus > 1 or shape.shares_gpu)
            and _room_short(state, item, gpu_type, own, partitions)
        ):
            failed.add(memo_key)
            continue
        if index is None or below > own.indexed_below:
            # Only the victims of a class below the workload's (`_Own.indexed_below`); made
            # again should a later search be for a higher class (none is: `_wanting`).
            index = own.index = VictimIndex(
                [victim for victim, of_class in own.victims.items() if of_class < below],
                state.capacity,
                partitions,
            )
            own.indexed_below = below
            state.preempt_index[book.name, gpu_type] = index
        budget = budgets.get((book.name, below))
        if budget is None:
            budget = budgets[book.name, below] = VictimBudget(
                {book.name: math.inf}, {}, below_priority_class=below
            )
        selection = select_victims(
            state.capacity,
            # The ask the search makes of any: exactly the gang minimum, no pool levels.
            Ask(shape, gpu_type, pods, pods, workload.topology),
            state.strategy,
            _NOTHING_EXCLUDED,
            index=index,
            budget=budget,
            already_leaving=[victim.uses for victim in leaving] if leaving else (),
        )
        if selection is None or not selection.victims:
            failed.add(memo_key)
            continue
        freed_cu = selection.cu
        # A swap inside the queue: it must end within its share, or at least not grow.
        within = book.allocated_cu - freed_cu + needed_cu <= book.fair_share_cu + EPS
        if not (within or needed_cu <= freed_cu + EPS):
            open_types = True
            continue
        commit(state, item, gpu_type, selection, EvictReason.PREEMPT, bool(leaving))
        victims = own.victims
        for victim in selection.victims:  # all of this queue and type (its index's)
            victims.pop(victim, None)
        # The last victim of the type's lowest class gone: the floor rises to the next class
        # with victims left (`commit` counts them down), closing the type to work of that
        # class before any other test.
        sums = totals.get(own.floor)
        if sums is not None and not sums[2]:
            own.floor = min([c for c, (_, _, left) in totals.items() if left], default=_NO_FLOOR)
        return
    if not open_types:
        trial = item.trial
        dead.add(trial)
        dead.add(trial ^ 1)


# A floor above every class: a type whose victims have all been evicted.
_NO_FLOOR = 1 << 30


def _totals(
    state: CycleState, name: str, gpu_type: str, victims: Iterable[Victim]
) -> dict[int, list[float]]:
    """CU and GPUs of queue `name`'s `victims` on `gpu_type` by priority class, summed in their
    order, and how many, kept (`CycleState.preempt_totals`) and taken down by
    `cycle_evict.commit` as they are evicted. Made at the key's first cheap test: most keys are
    never tested, and a key's victims are evicted only by a search on that key, after the
    test."""
    totals: dict[int, list[float]] = {}
    for victim in victims:
        sums = totals.get(victim.priority_class)
        if sums is None:
            sums = totals[victim.priority_class] = [0.0, 0.0, 0]
        sums[0] += victim.cu
        sums[1] += victim.gpus
        sums[2] += 1
    state.preempt_totals[name, gpu_type] = totals
    return totals


def _room_short(
    state: CycleState, item: Pending, gpu_type: str, own: _Own, partitions: bool
) -> bool:
    """True when the gang minimum of `item`'s whole-GPU pods could not fit on `gpu_type` even
    with every victim of a lower priority class gone (`own`: the queue's victims of the type),
    so the search would find nothing. Per
    node, at most its free whole GPUs plus the GPUs such victims leave wholly free can be free,
    so no more pods than that sum over the pool: the pool's free-GPU buckets, each victim node
    counted again with the GPUs its victims free (read only when the buckets alone fall
    short). A GPU counts as freed once the victims read leave at most `_FREED_SLACK` of it used:
    one that other work shares, or a claim holds over, stays used (the common failure of a
    one-GPU pod's search after a steady cycle). A partition victim counts as freeing its whole
    GPU (it does when the last partition there goes), not its fraction; in a pool that offers
    none (`partitions` False) no use's slices are read. Pods that share a GPU:
    `share_room_short`; pods of a partition or of no GPU are not bounded here (False).

    A gang that must go into one domain of a topology label (a required `TopologyConstraint`:
    the search tries no node outside such domains) is counted per domain as well, each node's
    pods in its domain's sum (`_bucket_pods` for the buckets'), and the room is short when no
    domain's sum holds it, even where the pool's does. The search's own domain test
    (`victim_node_sets.node_sets`) adds up GPUs, those of every victim of the queue and type
    whatever its class, and passes domains whose GPUs would not make whole pods on any node:
    at 4,000 nodes, scrambled, 79 searches for gangs of four pods of two GPUs failed in every
    domain (2 at 1,000 nodes; bench/results/cycle.md, round 30).

    In the phase the sum only falls: the capacity is only taken (`select_victims` leaves it as
    it found it), the queue's victims only leave, and a lower class reads fewer of them. So
    the nodes' counts of a test that found the room short (`_Own.room`, kept in a pool without
    partitions) bound every later test of the queue and type at that class or below, for pods
    of any whole GPUs: one they refuse is refused without reading a victim (at 4,000 nodes,
    scrambled: 459 of 1,156 short answers, 6,299 of 14,937 victims read).

    Once the queue's index of the type is made (at its first search, of the victims below that
    search's class, at or above this test's), its GPUs wholly freeable per node bound the sum
    the victims would make (`VictimIndex.freeable_pods`, from a count of nodes per GPUs
    freeable: a few terms), beside the buckets' pods (a node in both counted twice: a looser
    bound, still one): room short by that bound is short without reading a victim. That is the
    bound the search itself prunes by (`victim_greedy.greedy` scores no node that cannot free a
    pod's GPUs), so no search it spares could have found room. Room enough by it is the answer
    too, the victims unread: the test only spares searches, and one it lets through that finds
    nothing is remembered as failed (`_try_preempt`) as a short answer is, so the decisions are
    the same either way. A gang that must keep to one domain is bounded per domain so, each
    index node's pods added to its domain's. In a pool without partitions. At 4,000 nodes,
    scrambled: 1,969 tests answered from the index, 40 of the 960 it found room enough for short
    by the victims' count; the victims read by the tests 12,000, not 31,100."""
    shape = item.shape
    whole = shape.whole_gpus
    if shape.profile:
        return False
    victims = own.victims
    if shape.shares_gpu:
        workload = item.workload
        return share_room_short(
            state.capacity,
            gpu_type,
            shape.gpus_per_pod,
            workload.gang_min_pods,
            workload.priority_class,
            victims,  # none evicted (`_Own.victims`)
        )
    if not whole:
        return False
    needed = item.workload.gang_min_pods
    below = item.workload.priority_class
    # A gang that must go into one topology domain: its pods are counted per domain too
    # (`domain_pods`), and room enough over the pool is no answer yet.
    topology = item.workload.topology
    level = topology.level if topology is not None and topology.required else None
    known = own.room
    if (
        known is not None
        and known[0] >= below
        and sum([count * (free // whole) for free, count in known[1].items()]) < needed
    ):
        return True
    capacity = state.capacity
    # No free GPU of the type (the common case: preemption runs in a full pool): no node in a
    # bucket the sum reads.
    in_buckets = capacity.free_whole_by_type.get(gpu_type, 0)
    if in_buckets:
        pods = sum(
            len(capacity.bucket(gpu_type, free)) * (free // whole)
            for free in range(whole, capacity.max_gpus.get(gpu_type, 0) + 1)
        )
        if pods >= needed and level is None:
            return False
    else:
        pods = 0
    index = own.index
    by_index = not partitions and own.indexed_below >= below
    if index is not None and by_index and level is None:
        return pods + index.freeable_pods(whole) < needed
    domain_of: list[str | None] | None = None
    if level is not None:
        domain_of = capacity.domain_of(level)
        domain_pods = _bucket_pods(capacity, gpu_type, whole, domain_of) if pods else {}
        if any(count >= needed for count in domain_pods.values()):
            return False
        if index is not None and by_index:
            # Per domain, its index nodes' pods with their GPUs wholly freeable added.
            for node, freeable in index.freeable_on_node.items():
                value = domain_of[node]
                if freeable >= whole and value is not None:
                    count = domain_pods[value] = domain_pods.get(value, 0) + freeable // whole
                    if count >= needed:
                        return False
            return True
    nodes = capacity.nodes
    # Per node, its free whole GPUs with the victims read so far gone; per GPU such a victim
    # uses, what is left of its use (0.0 once counted as freed, so it is counted once).
    free_on: dict[int, int] = {}
    left: dict[tuple[int, int], float] = {}
    for victim, priority_class in victims.items():  # none evicted (`_Own.victims`)
        if priority_class >= below:
            continue
        for use in victim.uses:
            node = use.node
            amount = use.gpu_amount
            if partitions and use.slice_mask:
                # A partition: taken as freeing its GPU (its 1.0), as if no other partition
                # stayed there (a bound: the GPU is counted once, at the first such victim).
                amount = 1.0
            freed = 0
            for gpu in use.gpu_indices:
                key = (node, gpu)
                before = left.get(key)
                if before is None:
                    before = nodes[node].gpu_used[gpu]
                after = before - amount
                if before > EPS and after <= _FREED_SLACK:
                    freed += 1
                    after = 0.0
                left[key] = after
            if freed:
                was = free_on.get(node)
                if was is None:
                    was = nodes[node].free_whole
                now = free_on[node] = was + freed
                gained = now // whole - was // whole
                pods += gained
                if domain_of is not None and gained:
                    value = domain_of[node]
                    if value is not None:
                        count = domain_pods[value] = domain_pods.get(value, 0) + gained
                        if count >= needed:
                            return False
        if pods >= needed and domain_of is None:
            return False
    if pods >= needed:  # over the pool, not in any one of the gang's domains
        return True
    if not partitions:
        # Per count of GPUs wholly free, the nodes that could have it: the buckets', each
        # victim node moved from its free GPUs to the count with its victims gone.
        counts: dict[int, int] = {}
        if in_buckets:
            for free in range(1, capacity.max_gpus.get(gpu_type, 0) + 1):
                counts[free] = len(capacity.bucket(gpu_type, free))
            for node, now in free_on.items():
                was = nodes[node].free_whole
                if was:
                    counts[was] -= 1
                counts[now] = counts.get(now, 0) + 1
        else:
            for now in free_on.values():
                counts[now] = counts.get(now, 0) + 1
        own.room = (below, counts)
    return True


def _bucket_pods(
    capacity: Capacity, gpu_type: str, whole: int, domain_of: list[str | None]
) -> dict[str, int]:
    """Per topology domain (each node's value in `domain_of`), the pods of `whole` GPUs its
    nodes of `gpu_type` could hold on their free whole GPUs (the free-GPU buckets; nodes
    without the label in none)."""
    found: dict[str, int] = {}
    for free in range(whole, capacity.max_gpus.get(gpu_type, 0) + 1):
        for node in capacity.bucket(gpu_type, free):
            value = domain_of[node]
            if value is not None:
                found[value] = found.get(value, 0) + free // whole
    return found


# What `_room_short` lets a GPU keep used and still counts it freed: the search frees a GPU
# at `EPS`, subtracting the same uses in another order, so the bound allows more than the
# sums' rounding may differ by. It may count a GPU the search would not free, never miss one.
_FREED_SLACK = EPS + 1e-6


# Rounding allowance of `share_room_short`, wider than `fit_on`'s: the bound may count a pod
# that does not fit, never miss one that does.
_SHARE_SLACK = 1e-6


def share_room_short(
    capacity: Capacity,
    gpu_type: str,
    share: float,
    needed: int,
    below: int,
    victims: Iterable[Victim],
    evicted: Collection[str] = (),
) -> bool:
    """`_room_short` for pods of `share` of a GPU: True when, even with every victim of a
    priority class below `below` gone (but those `evicted`), the GPUs of `gpu_type` could not
    hold `needed` of them, so the search would find nothing. Only
    bounded when no GPU of the type has room now (none free, none part-used): then a pod can
    only go on a GPU such victims use, and each such GPU holds at most as many pods as its room
    with them gone allows (CPU and memory not read, a partition taken as freeing its GPU). A
    GPU held for a claim over a victim that still runs keeps its use after the victim goes:
    the common failure this spares the search of."""
    if capacity.free_whole_by_type.get(gpu_type, 0) or capacity.partial_nodes(gpu_type):
        return False
    nodes = capacity.nodes
    left: dict[tuple[int, int], float] = {}  # per (node, GPU) its use, the victims read gone
    pods = 0
    for victim in victims:
        if victim.priority_class >= below or victim.uid in evicted:
            continue
        for use in victim.uses:
            amount = 1.0 if use.slice_mask else use.gpu_amount
            for gpu in use.gpu_indices:
                key = (use.node, gpu)
                before = left.get(key)
                if before is None:
                    before = nodes[use.node].gpu_used[gpu]
                after = left[key] = before - amount
                pods += _shares(after, share) - _shares(before, share)
        if pods >= needed:
            return False
    return True


def _shares(used: float, share: float) -> int:
    """Pods of `share` of a GPU that a GPU so used could hold, counted generously."""
    room = 1.0 - used
    return int((room + _SHARE_SLACK) / share) if room >= share - _SHARE_SLACK else 0
