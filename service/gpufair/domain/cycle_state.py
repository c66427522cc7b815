"""The shared state of one scheduling cycle, and the primitive moves every phase makes on it.

`CycleState` is what the phases (`cycle_claims`, `cycle_allocate`, `cycle_reclaim`,
`cycle_preempt`, `cycle_reserve`) read and change: the pool's free `Capacity`, one `QueueBook` per
leaf queue, the pending workloads per queue in queue order, the running workloads that may become
victims, and the decisions made so far. The moves shared by the phases live here: the queue order
(DESIGN §4.1), binding a workload, holding the GPUs a workload waits for while its victims stop,
and the pending reasons at the end. `cycle_load` fills the state from a snapshot; `cycle.run_cycle`
runs the phases over it in order.
"""

from __future__ import annotations

import heapq
import math
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, NamedTuple, cast

from gpufair.domain.capacity import EPS, Capacity, PodUse
from gpufair.domain.decisions import (
    bind_decision,
    evicted_capacity,
    pending_reason,
)
from gpufair.domain.explain import pending_message, queue_numbers
from gpufair.domain.model import PodBinding, Queue, Workload, pod_binding
from gpufair.domain.partition_geometry import geometries, start_of
from gpufair.domain.placement import place
from gpufair.domain.placement_ask import Ask, Exclusion, PodShape
from gpufair.domain.placement_domain import PoolRoom
from gpufair.domain.placement_rejection import FitRejection
from gpufair.domain.policy import max_borrow_s
from gpufair.domain.queuebook import UNCAPPED, LimitBook, QueueBook
from gpufair.domain.snapshot import (
    BindDecision,
    CycleResult,
    CycleSnapshot,
    EvictDecision,
    PendingCode,
    PendingReason,
    Reservation,
)
from gpufair.domain.topology_reason import topology_note
from gpufair.domain.victim_search import Victim, VictimBudget, VictimIndex

if TYPE_CHECKING:
    from gpufair.domain.cycle_memory import CarriedLoad, QueueReasons

QueueKey = tuple[int, float, float, float, int, str]
_WAITING = PendingCode.WAITING_FOR_EVICTED_CAPACITY
_by_order = attrgetter("order")
# The first key of the reasons `CycleState.result` writes, not a string: see there.
_HASHED = object()


class MemoKey(NamedTuple):
    """A placement problem, whatever the workload (`Kind.memo_key`): what placement reads of a
    pod and of the gang. Compared and hashed as the plain tuple of its fields; read by name."""

    gpus_per_pod: float
    cpu_millicores: int
    memory_mib: int
    gang_min_pods: int
    topology: tuple[str, bool] | None  # (level, required)
    profile: str
    one_per_node: bool


@dataclass(frozen=True, slots=True)
class Kind:
    """What pending workloads of one signature share: fit, types, CU, memo key."""

    rejection: FitRejection | None
    shape: PodShape
    types: tuple[str, ...]
    cu_per_pod: tuple[float, ...]  # per entry of `types`
    min_cu: float  # gang minimum on the cheapest type: the least the workload can cost
    # Identifies the placement problem, whatever the workload; kinds of equal problems share
    # the object (`kind_of`).
    memo_key: MemoKey
    # What a try to bind reads of the workload besides its queue and preemptibility: its types
    # and placement problem. Kinds of equal trials fail a try alike; `kind_of` gives them one
    # object, so a failure is remembered by its identity (`cycle_allocate`).
    trial: tuple[object, ...] = field(default=(), compare=False)
    # `Pending.trial` of its workloads, not preemptible and preemptible: twice the trial's
    # identity, plus one if preemptible (numbers shared by all the kind's workloads).
    trial_keys: tuple[int, int] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        if not self.trial:
            object.__setattr__(self, "trial", (self.types, self.memo_key))
        base = 2 * id(self.trial)
        object.__setattr__(self, "trial_keys", (base, base + 1))


@dataclass(slots=True)
class Pending:
    """A pending workload as the cycle tracks it: its queue, kind, order and current reason."""

    workload: Workload
    book: QueueBook
    kind: Kind
    uid: str  # the workload's, as a copy made beside the item (`cycle_load_pending`)
    order: tuple[int, float, str]
    # Its kind's trial and preemptibility as one number (`Kind.trial_keys`): what a failed try
    # to bind it is remembered by in a queue's turn (`cycle_allocate`).
    trial: int
    code: PendingCode = PendingCode.OVER_FAIR_SHARE
    done: bool = False
    held_nodes: int = 0  # nodes reserved for it (message only)

    @property
    def shape(self) -> PodShape:
        return self.kind.shape

    @property
    def types(self) -> tuple[str, ...]:
        return self.kind.types

    @property
    def min_cu(self) -> float:
        return self.kind.min_cu


@dataclass(slots=True, eq=False)
class Running:
    """A running workload: what it holds (as a possible victim) and whether it may be evicted.
    Never changed once made (not frozen, like `Victim`: one per running workload)."""

    victim: Victim
    preemptible: bool
    min_runtime_s: float


class CycleState:
    """Everything one cycle knows and has decided so far (see the module docstring)."""

    def __init__(self, snapshot: CycleSnapshot, carried: CarriedLoad | None = None) -> None:
        self.snapshot = snapshot
        # The last cycle's loaded records of this pool, reused and replaced by `cycle_load`.
        self.carried = carried
        self.pool = snapshot.pool
        self.strategy = snapshot.pool.placement
        self.gpu_types = {gpu_type.name: gpu_type for gpu_type in snapshot.gpu_types}
        self.weights = {name: gpu_type.compute_weight for name, gpu_type in self.gpu_types.items()}
        pool_nodes = [node for node in snapshot.nodes if node.pool == self.pool.name]
        ready = [node for node in pool_nodes if node.ready]
        shapes = geometries(snapshot.gpu_types)
        # With carried records (`cycle_memory`): whether they were made over this snapshot's
        # pool, hardware and queues (if not, they are dropped here), and how many of the
        # running allocations the kept capacity took (`cycle_load` skips those). The capacity
        # then starts as a copy of the kept one, its nodes not built first.
        self.carried_valid = carried is not None and carried.valid_for(snapshot)
        self.shared_running = 0 if carried is None else carried.shared_running(snapshot.running)
        if self.shared_running:
            assert carried is not None and carried.capacity is not None
            self.capacity = carried.capacity[1].copy()
        else:
            self.capacity = Capacity(ready, shapes)
        hardware = self.capacity if len(ready) == len(pool_nodes) else Capacity(pool_nodes, shapes)
        self.pool_room = PoolRoom(hardware)
        ancestors = _limit_ancestors(snapshot)
        # With valid carried records, the last cycle's books made new again (`QueueBook.reset`):
        # the queues' carried items hold them, so loading need not give them a book each.
        kept = carried.books if carried is not None and self.carried_valid else {}
        self.books: dict[str, QueueBook] = {}
        for queue in snapshot.queues:
            arguments = (
                queue,
                self.pool.name,
                snapshot.fair_share_cu.get(queue.name, 0.0),
                self.weights,
                ancestors(queue),
                max_borrow_s(queue.quota(self.pool.name), self.pool),
            )
            book = kept.get(queue.name)
            if book is None:
                book = QueueBook(*arguments)
            else:
                book.reset(*arguments)
            self.books[queue.name] = book
        if carried is not None:
            carried.books = self.books
        # Nodes promised to long-waiting gangs (no beyond-fair-share work). Capacity held for a
        # workload waiting for its victims is taken in `capacity` itself (see `hold`).
        self.gang_held: set[int] = set()
        # Decisions.
        self.binds: list[BindDecision] = []
        self.evicts: list[EvictDecision] = []
        self.reservations: list[Reservation] = []
        self.reasons: dict[str, PendingReason] = {}
        self.evicted: set[str] = set()
        # Running work: possible victims, those already leaving, and whom they leave for.
        self.running: dict[str, Running] = {}
        self.leaving: set[str] = set()
        self.leaving_for: dict[str, list[Victim]] = {}
        # Standing claims: beneficiaries whose victims have all or partly stopped, still owed
        # the capacity freed for them; and the victims of those claims, not re-bound beyond
        # their share while the claim stands (`cycle_claims`).
        self.standing_claims: set[str] = set()  # beneficiaries
        self.claim_victims: dict[str, str] = {}  # stopped victim → its beneficiary
        # Pending work per queue in queue order, and the least CU of any suffix of that list.
        self.queue_pending: dict[str, list[Pending]] = {}
        self.suffix_min_cu: dict[str, list[float]] = {}
        # The pending workloads evictions were made for (`leaving_for`, `standing_claims`), in
        # no order: loading finds them as it places pending work (`cycle_claims` serves them).
        self.claimants: list[Pending] = []
        self.kinds: dict[tuple[object, ...], Kind] = {}
        # Free whole GPUs per type as compute-unit requests are resolved (`cycle_load`).
        self.cu_free_gpus: dict[str, float] = {}
        # Compute-unit requests as submitted, by uid (their `Pending` holds the chosen gang).
        self.cu_requests: dict[str, Workload] = {}
        self.turns: dict[str, int] = {}  # the work-conserving pass's tie-break (`queue_key`)
        # Memos of the phases: failures stay failures while capacity only shrinks.
        self.place_failed: set[tuple[object, ...]] = set()
        self.reclaim_failed: set[tuple[object, ...]] = set()
        self.reclaim_index: dict[str, VictimIndex] = {}
        self.guarantee_index: dict[str, VictimIndex] = {}
        # Per GPU type, what each queue may still lose to reclaim; built on first need and kept
        # current by `cycle_evict.commit` (binds and holds of reclaimers, within their share,
        # change no victim queue's budget).
        self.budgets: dict[str, VictimBudget] = {}
        # Per (queue, GPU type): CU and GPUs of its preemptible victims by priority class and
        # how many, kept current as they are evicted (preempt's cheap "could enough be freed"
        # test, and its floor of their classes).
        self.preempt_totals: dict[tuple[str, str], dict[int, list[float]]] = {}
        self.preempt_index: dict[tuple[str, str], VictimIndex] = {}
        self.preemptible_running: list[Running] | None = None  # `cycle_reclaim.preemptible_running`
        # Per queue, the trials (`Pending.trial`) allocation within the share left `NO_CAPACITY`
        # on (`cycle_allocate`; reclaim passes over a queue whose trials all failed it).
        self.short_trials: dict[str, set[int]] = {}
        # Per GPU type, the GPUs pending work that can use only that type waits for: set by the
        # first allocate pass, lowered by the binds of such work (`cycle_contention`); types
        # absent have none.
        self.exclusive_gpus: dict[str, float] = {}

    # -- numbers --------------------------------------------------------------------------

    def weight(self, gpu_type: str) -> float:
        return self.weights.get(gpu_type, 0.0)

    def cu_per_pod(self, item: Pending, gpu_type: str) -> float:
        return item.workload.gpus_per_pod * self.weight(gpu_type)

    def pods_allowed(self, item: Pending, gpu_type: str, within_share: bool) -> int:
        """The pods of `item` its queue's limits allow on `gpu_type`, at most its own."""
        workload = item.workload
        allowed, _ = self.max_pods(item.book, workload, gpu_type, within_share)
        return min(allowed, workload.pods)

    def max_pods(
        self, book: QueueBook, workload: Workload, gpu_type: str, within_share: bool
    ) -> tuple[int, PendingCode | None]:
        """`book.max_pods` for pods of `workload` on `gpu_type`, memoised in the book until it
        changes (`QueueBook.answers`). Phases ask it for every workload they try, most of them
        while the queue's book has not changed. A book under inner queues with limits reads
        theirs too, which its siblings change: it is asked each time. Preemptible work
        beyond the share of a book without limits is never capped (`queuebook.UNCAPPED`)."""
        if not within_share and book.never_caps(workload.preemptible):
            return UNCAPPED
        answers = book.answers
        if answers is None:
            if book.ancestors:
                gpus_per_pod = workload.gpus_per_pod
                return book.max_pods(
                    gpus_per_pod * self.weights.get(gpu_type, 0.0),
                    gpus_per_pod,
                    gpu_type,
                    workload.preemptible,
                    within_share,
                )
            answers = book.answers = {}
        gpus_per_pod = workload.gpus_per_pod
        preemptible = workload.preemptible
        # Work that is not preemptible is held to the share in either pass (`QueueBook.max_pods`
        # reads `within_share or not preemptible`): one answer serves both passes.
        within_share = within_share or not preemptible
        key = (gpus_per_pod, gpu_type, preemptible, within_share)
        found = answers.get(key)
        if found is None:
            found = answers[key] = book.max_pods(
                gpus_per_pod * self.weights.get(gpu_type, 0.0),
                gpus_per_pod,
                gpu_type,
                preemptible,
                within_share,
            )
        return found

    # -- ordering -------------------------------------------------------------------------

    def queue_key(self, name: str, position: int, rotate: bool = False) -> QueueKey:
        """DESIGN §4.1: tier (highest first), allocated/fair-share ratio, the queue's next
        workload's submit time, the queue's age, then its name.

        `rotate` (the work-conserving pass): an exact tie after the queue's age goes by a number
        drawn from the queue's name and the cycle's instant, not by the name itself, so no queue
        wins every tie for spare capacity because of how it is spelled; the name remains only
        to make the order total."""
        book = self.books[name]
        items = self.queue_pending[name]
        next_submit = items[position].workload.submit_time_s if position < len(items) else math.inf
        turn = self._turn(name) if rotate else 0
        return (-book.tier, book.ratio(), next_submit, book.created_at_s, turn, name)

    def _turn(self, name: str) -> int:
        found = self.turns.get(name)
        if found is None:
            found = self.turns[name] = zlib.crc32(f"{name}@{self.snapshot.now_s!r}".encode())
        return found

    def in_queue_order(self, wanted: Iterable[Pending]) -> list[Pending]:
        """`wanted`, ordered by their queues' current order, then inside each queue: sorted by
        (tier, ratio, workload order). Built as that sort would: each queue's items in their
        order, then `by_queue_order`."""
        groups: dict[str, list[Pending]] = {}
        for item in wanted:
            found = groups.get(item.book.name)
            if found is None:
                groups[item.book.name] = [item]
            else:
                found.append(item)
        for items in groups.values():
            items.sort(key=_by_order)  # nearly free when already in order
        return self.by_queue_order(groups)

    def by_queue_order(self, groups: dict[str, list[Pending]]) -> list[Pending]:
        """The items of `groups` (per queue name, its items in workload order, as taken from
        `queue_pending`) as `in_queue_order` orders them: queues by tier and ratio, and the
        items of queues that tie there merged by their order (orders are unique: the uid).
        A phase that takes its items queue by queue from `queue_pending` gives them here
        without grouping or sorting them again."""
        ordered: list[Pending] = []
        for run in self.queue_runs(groups):
            if len(run) == 1:
                ordered += groups[run[0]]
            else:
                ordered += heapq.merge(*(groups[name] for name in run), key=_by_order)
        return ordered

    def queue_runs(self, names: Iterable[str]) -> list[list[str]]:
        """`names` in the queues' current order (tier, then ratio), in runs of queues that tie
        there: the items of one run go in workload order, merged (`in_queue_order`)."""
        books = self.books
        heads = sorted(
            (((-books[name].tier, books[name].ratio()), name) for name in names),
            key=itemgetter(0),
        )
        runs: list[list[str]] = []
        last: tuple[int, float] | None = None
        for key, name in heads:
            if runs and key == last:
                runs[-1].append(name)
            else:
                runs.append([name])
                last = key
        return runs

    # -- placing, binding and holding -------------------------------------------------------

    def ask(self, item: Pending, gpu_type: str, pods_max: int) -> Ask:
        workload = item.workload
        return Ask(
            item.shape,
            gpu_type,
            workload.gang_min_pods,
            pods_max,
            workload.topology,
            self.pool.topology_levels,
        )

    def place(
        self, item: Pending, gpu_type: str, pods_max: int, exclusion: Exclusion
    ) -> list[PodUse] | None:
        return place(self.capacity, self.ask(item, gpu_type, pods_max), self.strategy, exclusion)

    def bind(self, item: Pending, gpu_type: str, plan: list[PodUse]) -> None:
        self.capacity.take(plan)
        bindings = self.bind_plan(item, plan)
        gpus = len(plan) * item.workload.gpus_per_pod
        cu = gpus * self.weights.get(gpu_type, 0.0)
        book = item.book
        book.add(cu, gpus, gpu_type, item.workload.preemptible)
        book.bound_cu += cu
        self.binds.append(
            bind_decision(
                item.uid,
                book.name,
                gpu_type,
                bindings,
                cu,
                book.allocated_cu > book.fair_share_cu + EPS,
            )
        )
        item.done = True

    def bind_plan(self, item: Pending, plan: list[PodUse]) -> tuple[PodBinding, ...]:
        nodes = self.capacity.nodes
        shares = item.kind.shape.shares_gpu
        if len(plan) == 1:  # the common case, without the list and its enumeration
            use = plan[0]
            return (
                pod_binding(
                    0,
                    nodes[use.node].name,
                    use.gpu_indices,
                    use.gpu_amount if shares else 1.0,
                    start_of(use.slice_mask) if use.slice_mask else None,
                ),
            )
        return tuple(
            [
                pod_binding(
                    position,
                    nodes[use.node].name,
                    use.gpu_indices,
                    use.gpu_amount if shares else 1.0,
                    start_of(use.slice_mask) if use.slice_mask else None,
                )
                for position, use in enumerate(plan)
            ]
        )

    def hold(self, item: Pending, gpu_type: str, plan: list[PodUse]) -> None:
        """Hold what `plan` uses for a workload that waits for evicted capacity: exactly those
        GPUs (and CPU, memory), not whole nodes. The plan is taken in the capacity on top of the
        victims still running there, so nothing else may use those GPUs in this cycle while the
        rest of each node stays free for others; the next cycle re-derives the hold. Hot (once
        per claimant and per eviction plan): a plan of one pod without a partition is held by
        `hold_one`; one of several by `Capacity.take_pods`, which names the nodes it takes on."""
        if len(plan) == 1:
            index, gpus, amount, cpu, memory, mask = plan[0]
            if not mask:
                self.hold_one(item, gpu_type, index, gpus, amount, cpu, memory)
                return
        capacity = self.capacity
        touched = capacity.take_pods(plan)  # the nodes taken on, by index; None: a partition
        if touched is None:
            capacity.take(plan)
            names = tuple([capacity.nodes[index].name for index in sorted({u.node for u in plan})])
        else:
            names = tuple([touched[index].name for index in sorted(touched)])
        record = evicted_capacity(item.uid, gpu_type, names, self.bind_plan(item, plan))
        self._held(item, gpu_type, len(plan) * item.workload.gpus_per_pod, len(names), record)

    def hold_one(
        self,
        item: Pending,
        gpu_type: str,
        index: int,
        gpus: tuple[int, ...],
        amount: float,
        cpu: int,
        memory: int,
    ) -> None:
        """`hold` of a plan of one pod without a partition, `PodUse(index, gpus, amount, cpu,
        memory)`, given by its fields (the common claim makes no `PodUse`): taken by
        `Capacity.take_pod` (as `take` would), named without the general path's sets and
        sorts, its record built by `pod_binding` and `evicted_capacity`, and `_held`'s
        accounting made here (one call fewer: once per claim)."""
        name = self.capacity.take_pod(index, gpus, amount, cpu, memory).name
        held = (pod_binding(0, name, gpus, amount if item.kind.shape.shares_gpu else 1.0, None),)
        workload = item.workload
        gpus_held = workload.gpus_per_pod
        cu = gpus_held * self.weights.get(gpu_type, 0.0)
        book = item.book
        book.add(cu, gpus_held, gpu_type, workload.preemptible)
        book.reserved_cu += cu
        item.done = True
        item.code = _WAITING
        item.held_nodes = 1
        self.reservations.append(evicted_capacity(item.uid, gpu_type, (name,), held))

    def _held(
        self, item: Pending, gpu_type: str, gpus: float, held_nodes: int, record: Reservation
    ) -> None:
        """What a hold of `gpus` GPUs on `held_nodes` nodes, recorded as `record`, leaves: the
        queue's book counts them (as reserved too), and the workload is done, waiting. (The
        same is written out in `hold_one`.)"""
        cu = gpus * self.weights.get(gpu_type, 0.0)
        book = item.book
        book.add(cu, gpus, gpu_type, item.workload.preemptible)
        book.reserved_cu += cu
        item.done = True
        item.code = _WAITING
        item.held_nodes = held_nodes  # its reason is written with the others, in `result`
        self.reservations.append(record)

    def reason(self, workload: Workload, code: PendingCode, message: str) -> None:
        self.reasons[workload.uid] = PendingReason(code, message)

    # -- the result -----------------------------------------------------------------------

    def result(self) -> CycleResult:
        """The decisions, with one reason per pending workload. Hot (one pass over every
        pending workload), so reasons are shared: per queue, one reason per (code, trial, held
        nodes) (all a sentence reads of a workload is its kind's trial, `Kind.trial`, whatever
        its preemptibility), and one per sentence, made once; what a sentence reads besides
        the queue's numbers (CU needed, gang size, GPUs per pod, a topology note, which reads
        only the trial and the capacity) once per (code, trial, held nodes) for all queues;
        the queue's part of its sentences (its CU numbers) once per queue. A sentence that
        reads of its queue only those numbers is made once for all queues too, as the words
        around them (`_words_of`): a queue's copy is then two concatenations, made once per
        queue and words.

        Such a reason is a function of its words and the queue's numbers alone, so with carried
        records (`cycle_memory`) a queue whose numbers are those of the last cycle's result
        starts from that result's reasons by words (`CarriedLoad.reasons`: most queues of a
        quiet cycle) instead of making them again.

        An item is looked up by its own trial number (`Pending.trial`), not by the preemptible
        one (`| 1` makes a new int per item); only a key not met before in the queue finds its
        fact, and a reason that reads more of the queue, by the preemptible key, so both
        preemptibilities still share them (a words reason is shared through `messages`).

        The reasons by uid are written into a new dict that starts with a key that is not a
        string (`_HASHED`, taken out before it is returned; the order of the reasons is that
        of `self.reasons` and then the items'): CPython keeps the hash of each key in the
        table of such a dict, but not in that of a dict of only strings, whose growth reads
        the hash again from every key string it holds (one string per waiting workload,
        spread over memory). The growths of this one read only the table: at 4,000 nodes
        their 118.5 k last-level misses became 31.5 k, and its larger entries (24 bytes, not
        16) give back about half of the 87 k in look-ups and in zeroing and freeing tables
        (bench/results/cycle.md, round 29)."""
        reasons: dict[object, PendingReason | None] = {_HASHED: None}
        reasons.update(self.reasons)
        claim_victims = self.claim_victims
        waiting = PendingCode.WAITING_FOR_EVICTED_CAPACITY
        over_share = PendingCode.OVER_FAIR_SHARE
        facts: dict[tuple[PendingCode, int, int], tuple[_Sentence, Words | None]] = {}
        carried = self.carried
        known = {} if carried is None else carried.reasons
        kept: dict[str, QueueReasons] = {}
        for name, items in self.queue_pending.items():  # one queue's items share its book
            shared: dict[tuple[PendingCode, int, int], PendingReason] = {}
            messages: dict[Words, PendingReason] | None = None  # by words, made at first need
            numbers = ""  # the queue's part of its sentences (`queue_numbers`), made once
            for item in items:
                code = item.code
                if item.done and code is not waiting:
                    continue  # bound
                if claim_victims and code is over_share:
                    beneficiary = claim_victims.get(item.uid)
                    if beneficiary is not None:
                        message = pending_message(
                            code, item.workload, item.book, item.min_cu, item.held_nodes
                        )
                        reasons[item.uid] = PendingReason(
                            code,
                            f"{message}; evicted for {beneficiary}, it is not re-bound beyond "
                            "its queue's share while that claim stands",
                        )
                        continue
                key = (code, item.trial, item.held_nodes)
                reason = shared.get(key)
                if reason is None:
                    fact = facts.get(key)
                    if fact is None:
                        both = (code, key[1] | 1, key[2])  # either preemptibility
                        fact = facts.get(both)
                        if fact is None:
                            sentence = self._sentence_of(item)
                            fact = facts[both] = (sentence, _words_of(item, sentence))
                        facts[key] = fact
                    sentence, words = fact
                    if messages is None:
                        numbers = queue_numbers(item.book)
                        last = known.get(name)
                        messages = dict(last[1]) if last is not None and last[0] == numbers else {}
                        kept[name] = (numbers, messages)
                    if words is None:
                        both = (code, key[1] | 1, key[2])  # either preemptibility
                        reason = shared.get(both)
                        if reason is None:
                            reason = shared[both] = _reason_of(item, sentence, numbers)
                    else:
                        reason = messages.get(words)
                        if reason is None:
                            reason = messages[words] = pending_reason(
                                words[0], words[1] + numbers + words[2]
                            )
                    shared[key] = reason
                reasons[item.uid] = reason
        del reasons[_HASHED]
        self.reasons = pending = cast("dict[str, PendingReason]", reasons)
        if carried is not None:
            carried.reasons = kept  # replaced whole (`cycle_memory`)
        return CycleResult(
            binds=tuple(self.binds),
            evicts=tuple(self.evicts),
            pending=pending,
            reservations=tuple(self.reservations),
            queues={name: book.summary() for name, book in self.books.items()},
        )

    def _sentence_of(self, item: Pending) -> _Sentence:
        """What the pending sentence of `item` reads of it (`_Sentence`)."""
        code = item.code
        workload = item.workload
        note = ""
        if code is PendingCode.NO_CAPACITY and workload.topology:
            note = topology_note(
                self.capacity, workload, item.types, self.pool.topology_levels, self.strategy
            )
        return (
            code,
            item.min_cu,
            workload.gang_min_pods,
            workload.gpus_per_pod,
            item.held_nodes,
            note,
        )


# What a pending sentence reads of its workload: code, CU needed, gang size, GPUs per pod, held
# nodes, and the topology note ending it ("" for none).
_Sentence = tuple[PendingCode, float, int, float, int, str]


# A sentence's code, and its words before and after its queue's numbers (`_words_of`).
Words = tuple[PendingCode, str, str]
# The codes whose sentences read of the queue only its numbers (`queue_numbers`, given to
# `pending_message`), and a mark that stands for those numbers while their words are cut out.
_QUEUE_NUMBERS_ONLY = frozenset({PendingCode.OVER_FAIR_SHARE, PendingCode.NO_CAPACITY, _WAITING})
_NUMBERS = "\x00"


def _words_of(item: Pending, sentence: _Sentence) -> Words | None:
    """The code and words of `sentence` around its queue's numbers, the same in every queue;
    None when the sentence reads more of the queue (its limits, its non-preemptible CU)."""
    code, needed_cu, _, _, held_nodes, note = sentence
    if code not in _QUEUE_NUMBERS_ONLY:
        return None
    head, tail = pending_message(
        code, item.workload, item.book, needed_cu, held_nodes, _NUMBERS
    ).split(_NUMBERS)
    return code, head, tail + note


def _reason_of(item: Pending, sentence: _Sentence, numbers: str) -> PendingReason:
    """The reason `sentence` gives in the queue of `item`, whose numbers are `numbers`
    (`queue_numbers`), when it reads more of the queue than those (no `_words_of`)."""
    code, needed_cu, _, _, held_nodes, note = sentence
    message = pending_message(code, item.workload, item.book, needed_cu, held_nodes, numbers)
    return pending_reason(code, message + note)


def _limit_ancestors(snapshot: CycleSnapshot) -> Callable[[Queue], tuple[LimitBook, ...]]:
    """For a leaf, the `LimitBook`s of the inner queues above it that have a limit in the pool,
    nearest first; leaves under one department share its book. Inner queues without limits are
    walked through (those above them may have some)."""
    pool = snapshot.pool.name
    parents = {queue.name: queue.parent for queue in snapshot.inner_queues}
    limits = {
        queue.name: LimitBook(queue, pool)
        for queue in snapshot.inner_queues
        if LimitBook.has_limits(queue, pool)
    }

    def ancestors(leaf: Queue) -> tuple[LimitBook, ...]:
        found: list[LimitBook] = []
        seen = {leaf.name}
        name = leaf.parent
        while name is not None and name not in seen:  # a cycle in bad input ends the walk
            seen.add(name)
            book = limits.get(name)
            if book is not None:
                found.append(book)
            name = parents.get(name)
        return tuple(found)

    return ancestors
