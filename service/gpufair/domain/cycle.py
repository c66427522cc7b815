"""The scheduling cycle of one pool: allocate → reclaim → preempt (DESIGN §4). Pure: a
`CycleSnapshot` in, a `CycleResult` out; `snapshot` documents both and the eviction semantics.

Phases, in order:

0. **Claims.** A pending workload that earlier evictions were made for (`evicting`) is served
   first: bound if it now fits on free capacity, otherwise its nodes stay held while its victims
   stop. Capacity freed by eviction belongs to the workload it was freed for; limits still apply.
1. **Allocate within fair share.** Queues by priority tier (highest first), then lowest
   allocated/fair-share ratio, then the oldest next workload, then queue age; after each bind the
   queue's ratio is updated and it rejoins the order. Inside a queue: priority class (highest
   first), then submit time. A workload is admitted when its queue stays within its fair share
   (non-preemptible work also within deserved), within its limits, and the whole gang fits
   (`placement`). A queue is left for this pass once its remaining share is below the smallest
   CU any of its remaining workloads could take.
2. **Reclaim.** Workloads within their queue's share that did not fit, in the same queue order,
   evict preemptible work past `min_runtime_s` from queues above max(deserved, fair share), never
   pushing a victim queue below that floor or below a per-type guarantee, never leaving the
   reclaimer above a victim in allocated/fair-share ratio (`reclaim`).
3. **Preempt.** Inside one queue, pending work evicts preemptible work of lower priority class
   (also past `min_runtime_s`), if the queue ends within its fair share or does not grow.
4. **Long-waiting gangs** get `GANG_WAIT` nodes (see `snapshot`).
5. **Allocate beyond fair share (work-conserving).** What nobody within their share could use
   goes, in the same order, to any queue within its limits, except on `GANG_WAIT` nodes. Such binds
   are flagged `over_fair_share`; their queues sit above their share, so reclaim takes them first.
   Non-preemptible work never goes beyond the fair share.

CU of a workload = pods × gpus_per_pod × compute_weight of the type it lands on. Each candidate
type is checked against the queue's share with its own weight, cheapest type first. Where one
number is needed before a type is chosen (the order's "can this queue still admit anything",
pending messages), the cheapest adequate type and the gang minimum are used: a lower bound.

Speed: free capacity is indexed by (GPU type, free GPUs), so a placement reads only buckets that can
hold a pod; a failed placement of a workload kind is remembered for the rest of the phase
(capacity only shrinks within a cycle, so a failure stays a failure), and so is a failed reclaim;
facts shared by workloads of one signature (fit, adequate types, CU) and pending messages are
computed once per signature; reclaim reads few nodes (see `reclaim`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass

from gpufair.domain.capacity import (
    EPS,
    Capacity,
    Journal,
    PodUse,
    binding_gpus,
    uses_of,
)
from gpufair.domain.explain import pending_message
from gpufair.domain.model import PodBinding, Workload
from gpufair.domain.placement import (
    Ask,
    Exclusion,
    FitRejection,
    PodShape,
    PoolRoom,
    adequate_types,
    place,
    pods_fit,
    pods_fit_empty,
    rejection_in,
)
from gpufair.domain.queuebook import QueueBook
from gpufair.domain.reclaim import (
    Selection,
    Victim,
    VictimBudget,
    VictimIndex,
    select_victims,
)
from gpufair.domain.snapshot import (
    BindDecision,
    CycleResult,
    CycleSnapshot,
    EvictDecision,
    EvictReason,
    PendingCode,
    PendingReason,
    Reservation,
    ReservationKind,
)

QueueKey = tuple[int, float, float, float, str]


def run_cycle(snapshot: CycleSnapshot) -> CycleResult:
    """One full scheduling cycle over `snapshot` (see the module docstring)."""
    return _Cycle(snapshot).run()


@dataclass(frozen=True, slots=True)
class _Kind:
    """What pending workloads of one signature share: fit, types, CU, memo key."""

    rejection: FitRejection | None
    shape: PodShape
    types: tuple[str, ...]
    cu_per_pod: tuple[float, ...]  # per entry of `types`
    min_cu: float  # gang minimum on the cheapest type: the least the workload can cost
    memo_key: tuple[object, ...]  # identifies the placement problem, whatever the workload


@dataclass(slots=True)
class _Pending:
    workload: Workload
    book: QueueBook
    kind: _Kind
    uid: str
    order: tuple[int, float, str]
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


@dataclass(frozen=True, slots=True)
class _Running:
    victim: Victim
    preemptible: bool
    min_runtime_s: float


class _Cycle:
    def __init__(self, snapshot: CycleSnapshot) -> None:
        self.snapshot = snapshot
        self.pool = snapshot.pool
        self.strategy = snapshot.pool.placement
        self.gpu_types = {gpu_type.name: gpu_type for gpu_type in snapshot.gpu_types}
        self.weights = {name: gpu_type.compute_weight for name, gpu_type in self.gpu_types.items()}
        pool_nodes = [node for node in snapshot.nodes if node.pool == self.pool.name]
        ready = [node for node in pool_nodes if node.ready]
        self.capacity = Capacity(ready)
        hardware = self.capacity if len(ready) == len(pool_nodes) else Capacity(pool_nodes)
        self.pool_room = PoolRoom(hardware)
        self.books = {
            queue.name: QueueBook(
                queue, self.pool.name, snapshot.fair_share_cu.get(queue.name, 0.0)
            )
            for queue in snapshot.queues
        }
        self.held: dict[int, str] = {}
        self.gang_held: set[int] = set()
        self.binds: list[BindDecision] = []
        self.evicts: list[EvictDecision] = []
        self.reservations: list[Reservation] = []
        self.reasons: dict[str, PendingReason] = {}
        self.evicted: set[str] = set()
        self.place_failed: set[tuple[object, ...]] = set()
        self.reclaim_failed: set[tuple[object, ...]] = set()
        self.running: dict[str, _Running] = {}
        self.leaving: set[str] = set()
        self.leaving_for: dict[str, list[Victim]] = {}
        self.queue_pending: dict[str, list[_Pending]] = {}
        self.suffix_min_cu: dict[str, list[float]] = {}
        self.reclaim_index: dict[str, VictimIndex] = {}
        self.budgets: dict[str, VictimBudget] = {}
        self.preempt_own: dict[tuple[str, str], list[Victim]] = {}
        self.preempt_index: dict[tuple[str, str], VictimIndex] = {}
        self.kinds: dict[tuple[object, ...], _Kind] = {}

    # -- set-up ---------------------------------------------------------------------------

    def run(self) -> CycleResult:
        self._load_running()
        self._load_evicting()
        self._load_pending()
        self._honour_claims()
        self._allocate(within_share=True)
        self._reclaim()
        self._preempt()
        self._reserve_for_long_waits()
        self._allocate(within_share=False)
        # One reason per (code, queue, kind): the sentence depends on nothing else, and a
        # busy pool has tens of thousands of pending workloads of few kinds.
        shared: dict[tuple[PendingCode, str, int, int], PendingReason] = {}
        for items in self.queue_pending.values():
            for item in items:
                if item.done:
                    continue
                key = (item.code, item.book.name, id(item.kind), item.held_nodes)
                reason = shared.get(key)
                if reason is None:
                    message = pending_message(
                        item.code, item.workload, item.book, item.min_cu, item.held_nodes
                    )
                    reason = shared[key] = PendingReason(item.code, message)
                self.reasons[item.uid] = reason
        return CycleResult(
            binds=tuple(self.binds),
            evicts=tuple(self.evicts),
            pending=self.reasons,
            reservations=tuple(self.reservations),
            queues={name: book.summary() for name, book in self.books.items()},
        )

    def _weight(self, gpu_type: str) -> float:
        return self.weights.get(gpu_type, 0.0)

    def _load_running(self) -> None:
        for allocation in self.snapshot.running:
            workload = allocation.workload
            if workload.uid in self.running:
                continue
            uses = tuple(uses_of(self.capacity, workload, allocation.bindings))
            gpus = sum(binding_gpus(binding) for binding in allocation.bindings)
            cu = gpus * self._weight(allocation.gpu_type)
            self.capacity.take(uses)
            book = self.books.get(workload.queue)
            if book is not None:
                book.add(cu, gpus, allocation.gpu_type, workload.preemptible)
                book.allocated_cu_before += cu
            victim = Victim(
                uid=workload.uid,
                queue=workload.queue,
                tier=book.tier if book is not None else 0,
                priority_class=workload.priority_class,
                started_at_s=allocation.started_at_s,
                cu=cu,
                gpus=gpus,
                gpu_type=allocation.gpu_type,
                uses=uses,
                nodes=tuple(dict.fromkeys(use.node for use in uses)),
            )
            self.running[workload.uid] = _Running(
                victim, workload.preemptible, workload.min_runtime_s
            )

    def _load_evicting(self) -> None:
        for eviction in self.snapshot.evicting:
            running = self.running.get(eviction.victim_uid)
            if running is None or eviction.victim_uid in self.leaving:
                continue
            victim = running.victim
            self.leaving.add(victim.uid)
            book = self.books.get(victim.queue)
            if book is not None:
                book.remove(victim.cu, victim.gpus, victim.gpu_type, running.preemptible)
                book.evicting_cu += victim.cu
            if eviction.beneficiary_uid is not None:
                self.leaving_for.setdefault(eviction.beneficiary_uid, []).append(victim)

    def _load_pending(self) -> None:
        seen = set(self.running)
        for workload in self.snapshot.pending:
            if workload.uid in seen:
                continue
            seen.add(workload.uid)
            book = self.books.get(workload.queue)
            if workload.pool != self.pool.name:
                self._reason(workload, PendingCode.OTHER_POOL, f"belongs to pool {workload.pool}")
                continue
            if book is None:
                self._reason(
                    workload,
                    PendingCode.UNKNOWN_QUEUE,
                    f"queue {workload.queue} is not a leaf queue of pool {self.pool.name}",
                )
                continue
            kind = self._kind(workload)
            if kind.rejection is not None:
                self._reason(workload, PendingCode.NEVER_FITS, kind.rejection.message)
                continue
            if not kind.types:
                self._reason(
                    workload, PendingCode.NEVER_FITS, "no ready node has an adequate GPU type"
                )
                continue
            order = (-workload.priority_class, workload.submit_time_s, workload.uid)
            self.queue_pending.setdefault(workload.queue, []).append(
                _Pending(workload, book, kind, workload.uid, order)
            )
        for name, items in self.queue_pending.items():
            items.sort(key=lambda item: item.order)
            suffix = [math.inf] * (len(items) + 1)
            for position in range(len(items) - 1, -1, -1):
                suffix[position] = min(suffix[position + 1], items[position].kind.min_cu)
            self.suffix_min_cu[name] = suffix

    def _kind(self, workload: Workload) -> _Kind:
        """The shared facts of a workload's signature, memoised: pending work comes in few."""
        signature = (
            workload.pods,
            workload.min_pods,
            workload.gpus_per_pod,
            workload.allowed_gpu_types,
            workload.min_gpu_memory_gib,
            workload.cpu_millicores_per_pod,
            workload.memory_mib_per_pod,
            workload.topology,
        )
        found = self.kinds.get(signature)
        if found is None:
            shape = PodShape.of(workload)
            types = adequate_types(workload, self.gpu_types, tuple(self.capacity.by_type))
            cu_per_pod = tuple(workload.gpus_per_pod * self._weight(name) for name in types)
            min_cu = workload.gang_min_pods * cu_per_pod[0] if types else 0.0
            topology = workload.topology
            memo_key = (
                shape.gpus_per_pod,
                shape.cpu_millicores,
                shape.memory_mib,
                workload.gang_min_pods,
                None if topology is None else (topology.level, topology.required),
            )
            found = _Kind(
                rejection_in(workload, self.gpu_types, self.pool_room),
                shape,
                types,
                cu_per_pod,
                min_cu,
                memo_key,
            )
            self.kinds[signature] = found
        return found

    def _reason(self, workload: Workload, code: PendingCode, message: str) -> None:
        self.reasons[workload.uid] = PendingReason(code, message)

    # -- ordering -------------------------------------------------------------------------

    def _queue_key(self, name: str, position: int) -> QueueKey:
        book = self.books[name]
        items = self.queue_pending[name]
        next_submit = items[position].workload.submit_time_s if position < len(items) else math.inf
        return (-book.tier, book.ratio(), next_submit, book.created_at_s, name)

    def _in_queue_order(self, wanted: Iterable[_Pending]) -> list[_Pending]:
        """`wanted`, ordered by their queues' current order, then inside each queue."""
        return sorted(wanted, key=lambda item: (self._queue_key(item.book.name, 0)[:2], item.order))

    # -- binding and holding ---------------------------------------------------------------

    def _cu_per_pod(self, item: _Pending, gpu_type: str) -> float:
        return item.workload.gpus_per_pod * self.weights.get(gpu_type, 0.0)

    def _pods_allowed(self, item: _Pending, gpu_type: str, within_share: bool) -> int:
        allowed, _ = item.book.max_pods(
            self._cu_per_pod(item, gpu_type),
            item.workload.gpus_per_pod,
            gpu_type,
            item.workload.preemptible,
            within_share,
        )
        return min(allowed, item.workload.pods)

    def _bind(self, item: _Pending, gpu_type: str, plan: list[PodUse]) -> None:
        self.capacity.take(plan)
        self.budgets.clear()
        shape = item.shape
        bindings = tuple(
            PodBinding(
                pod_index=position,
                node=self.capacity.nodes[use.node].name,
                gpu_indices=use.gpu_indices,
                gpu_fraction=use.gpu_amount if shape.shares_gpu else 1.0,
            )
            for position, use in enumerate(plan)
        )
        gpus = len(plan) * item.workload.gpus_per_pod
        cu = gpus * self._weight(gpu_type)
        book = item.book
        book.add(cu, gpus, gpu_type, item.workload.preemptible)
        book.bound_cu += cu
        self.binds.append(
            BindDecision(
                workload_uid=item.uid,
                queue=book.name,
                gpu_type=gpu_type,
                bindings=bindings,
                cu=cu,
                over_fair_share=book.allocated_cu > book.fair_share_cu + EPS,
            )
        )
        item.done = True

    def _hold(self, item: _Pending, gpu_type: str, plan: list[PodUse]) -> None:
        """Hold the planned nodes for a workload that waits for evicted capacity."""
        nodes = sorted({use.node for use in plan})
        self.budgets.clear()
        for index in nodes:
            self.held[index] = item.uid
        gpus = len(plan) * item.workload.gpus_per_pod
        cu = gpus * self._weight(gpu_type)
        item.book.add(cu, gpus, gpu_type, item.workload.preemptible)
        item.book.reserved_cu += cu
        item.done = True
        item.code = PendingCode.WAITING_FOR_EVICTED_CAPACITY
        item.held_nodes = len(nodes)
        self.reasons[item.uid] = PendingReason(
            item.code,
            pending_message(item.code, item.workload, item.book, cu, len(nodes)),
        )
        self.reservations.append(
            Reservation(
                item.uid,
                ReservationKind.EVICTED_CAPACITY,
                gpu_type,
                tuple(self.capacity.nodes[index].name for index in nodes),
            )
        )

    # -- phase 0: claims on evicted capacity ------------------------------------------------

    def _honour_claims(self) -> None:
        claimants = [
            item
            for items in self.queue_pending.values()
            for item in items
            if item.uid in self.leaving_for
        ]
        for item in self._in_queue_order(claimants):
            workload = item.workload
            exclusion = Exclusion(self.held, owner=item.uid)
            allowed = {
                gpu_type: self._pods_allowed(item, gpu_type, within_share=False)
                for gpu_type in item.types
            }
            pods_min = workload.gang_min_pods
            bound = False
            for gpu_type in item.types:
                if allowed[gpu_type] < pods_min:
                    continue
                plan = self._place(item, gpu_type, allowed[gpu_type], exclusion)
                if plan is not None:
                    self._bind(item, gpu_type, plan)
                    bound = True
                    break
            if bound:
                continue
            journal = Journal()
            for victim in self.leaving_for[item.uid]:
                self.capacity.release(victim.uses, journal)
            try:
                for gpu_type in item.types:
                    if allowed[gpu_type] < pods_min:
                        continue
                    plan = self._place(item, gpu_type, pods_min, exclusion)
                    if plan is not None:
                        held_plan = plan
                        break
                else:
                    continue  # the claim no longer fits: the workload competes as usual
            finally:
                self.capacity.restore(journal)
            self._hold(item, gpu_type, held_plan)

    def _place(
        self, item: _Pending, gpu_type: str, pods_max: int, exclusion: Exclusion
    ) -> list[PodUse] | None:
        return place(self.capacity, self._ask(item, gpu_type, pods_max), self.strategy, exclusion)

    def _ask(self, item: _Pending, gpu_type: str, pods_max: int) -> Ask:
        workload = item.workload
        return Ask(item.shape, gpu_type, workload.gang_min_pods, pods_max, workload.topology)

    # -- phases 1 and 5: allocate -----------------------------------------------------------

    def _allocate(self, within_share: bool) -> None:
        exclusion = Exclusion(self.held, self.gang_held, beyond_share=not within_share)
        cursor = dict.fromkeys(self.queue_pending, 0)
        heap = [(self._queue_key(name, 0), name) for name in self.queue_pending]
        heapq.heapify(heap)
        while heap:
            _, name = heapq.heappop(heap)
            items = self.queue_pending[name]
            suffix = self.suffix_min_cu[name]
            book = self.books[name]
            position = cursor[name]
            bound = False
            # A pop binds at most one workload; the queue then rejoins the order with its new
            # ratio, so queues take turns exactly as DESIGN §4.1 orders them.
            while position < len(items):
                if within_share and book.headroom_cu() < suffix[position] - EPS:
                    position = len(items)  # nothing left here fits in the remaining share
                    break
                item = items[position]
                position += 1
                if not item.done and self._try_bind(item, within_share, exclusion):
                    bound = True
                    break
            cursor[name] = position
            if bound and position < len(items):
                heapq.heappush(heap, (self._queue_key(name, position), name))

    def _try_bind(self, item: _Pending, within_share: bool, exclusion: Exclusion) -> bool:
        workload = item.workload
        kind = item.kind
        pods_min = workload.gang_min_pods
        capped: PendingCode | None = None
        no_room = False
        for gpu_type, cu_per_pod in zip(kind.types, kind.cu_per_pod, strict=True):
            allowed, code = item.book.max_pods(
                cu_per_pod, workload.gpus_per_pod, gpu_type, workload.preemptible, within_share
            )
            allowed = min(allowed, workload.pods)
            if allowed < pods_min:
                capped = capped or code
                continue
            key = (within_share, gpu_type, kind.memo_key)
            if key in self.place_failed:
                no_room = True
                continue
            plan = self._place(item, gpu_type, allowed, exclusion)
            if plan is None:
                self.place_failed.add(key)
                no_room = True
                continue
            self._bind(item, gpu_type, plan)
            return True
        if within_share:
            item.code = PendingCode.NO_CAPACITY if no_room else capped or item.code
        elif capped is not None and not no_room:
            item.code = capped  # a hard cap; a plain lack of room keeps the first pass's reason
        return False

    # -- phase 2: reclaim -----------------------------------------------------------------

    def _reclaim(self) -> None:
        now_s = self.snapshot.now_s
        by_type: dict[str, list[Victim]] = {}
        for running in self.running.values():
            victim = running.victim
            if (
                running.preemptible
                and victim.uid not in self.leaving
                and victim.queue in self.books
                and now_s - victim.started_at_s >= running.min_runtime_s
            ):
                by_type.setdefault(victim.gpu_type, []).append(victim)
        wanting = [
            item
            for items in self.queue_pending.values()
            for item in items
            if not item.done and item.code is PendingCode.NO_CAPACITY
        ]
        if not wanting or not (by_type or self.leaving_for):
            return
        # Reclaim only shrinks a victim queue's surplus, and the reclaimers, within their share,
        # never gain one: a victim too big for its queue's surplus now never becomes one.
        self.reclaim_index = {
            name: VictimIndex(
                (
                    victim
                    for victim in found
                    if victim.cu <= self.books[victim.queue].surplus_cu() + EPS
                    and victim.gpus
                    <= self.books[victim.queue].gpus_above_type_guarantee(victim.gpu_type) + EPS
                ),
                self.capacity,
            )
            for name, found in by_type.items()
        }
        for item in self._in_queue_order(wanting):
            self._try_reclaim(item)

    def _try_reclaim(self, item: _Pending) -> bool:
        workload = item.workload
        book = item.book
        pods = workload.gang_min_pods  # never evict for more than the gang minimum
        leaving = self.leaving_for.get(item.uid, [])
        for gpu_type in item.types:
            if self._pods_allowed(item, gpu_type, within_share=True) < pods:
                continue
            key = (gpu_type, item.kind.memo_key)
            if not leaving and key in self.reclaim_failed:
                continue
            index = self.reclaim_index.get(gpu_type) or VictimIndex((), self.capacity)
            # Only queues above their floor give anything; the reclaimer, within its share,
            # is below its own floor and so never a victim of itself.
            budget = self._budget(gpu_type)
            if not budget.cu_left and not leaving:
                self.reclaim_failed.add(key)
                continue
            selection = select_victims(
                self.capacity,
                self._ask(item, gpu_type, pods),
                self.strategy,
                Exclusion(self.held, owner=item.uid),
                index=index,
                budget=budget,
                already_leaving=[victim.uses for victim in leaving],
            )
            if selection is None:
                if not leaving:
                    self.reclaim_failed.add(key)
                continue
            gained_cu = pods * self._cu_per_pod(item, gpu_type)
            if not self._no_ping_pong(book, gained_cu, selection):
                continue
            self._commit(item, gpu_type, selection, EvictReason.RECLAIM, bool(leaving))
            return True
        return False

    def _budget(self, gpu_type: str) -> VictimBudget:
        """What each queue may lose to reclaim now; kept until the next eviction changes it."""
        found = self.budgets.get(gpu_type)
        if found is None:
            found = VictimBudget(
                {
                    name: other.surplus_cu()
                    for name, other in self.books.items()
                    if other.surplus_cu() > EPS
                },
                {
                    name: other.gpus_above_type_guarantee(gpu_type)
                    for name, other in self.books.items()
                    if gpu_type in other.deserved_gpus_by_type
                },
            )
            self.budgets[gpu_type] = found
        return found

    def _no_ping_pong(self, book: QueueBook, gained_cu: float, selection: Selection) -> bool:
        """After the reclaim the reclaimer must not sit above any victim queue in ratio.

        The victim floor (max(deserved, fair share)) and the reclaimer's share check already
        imply it when both shares are positive; it is checked on its own so the rule holds
        whatever either of those becomes."""
        if book.fair_share_cu <= EPS:
            return False
        after = (book.allocated_cu + gained_cu) / book.fair_share_cu
        lost: dict[str, float] = {}
        for victim in selection.victims:
            lost[victim.queue] = lost.get(victim.queue, 0.0) + victim.cu
        for name, cu in lost.items():
            victim_book = self.books[name]
            if victim_book.fair_share_cu <= EPS:
                continue  # a queue without a share sits at infinity
            if (victim_book.allocated_cu - cu) / victim_book.fair_share_cu < after - EPS:
                return False
        return True

    def _commit(
        self,
        item: _Pending,
        gpu_type: str,
        selection: Selection,
        reason: EvictReason,
        claimed_before: bool,
    ) -> None:
        if not selection.victims and not claimed_before:
            # Nothing needs to stop: the plan is on free capacity (held nodes excluded).
            self._bind(item, gpu_type, selection.plan)
            return
        book = item.book
        for victim in selection.victims:
            victim_book = self.books[victim.queue]
            if reason is EvictReason.RECLAIM:
                message = (
                    f"reclaimed for {item.uid} of queue {book.name} "
                    f"({book.allocated_cu:.1f} of fair share {book.fair_share_cu:.1f} CU); queue "
                    f"{victim.queue} keeps {victim_book.allocated_cu - victim.cu:.1f} CU, at least "
                    f"max(deserved {victim_book.deserved_cu:.1f}, fair share "
                    f"{victim_book.fair_share_cu:.1f})"
                )
            else:
                message = (
                    f"preempted in queue {book.name} for {item.uid} "
                    f"(priority class {item.workload.priority_class} over {victim.priority_class})"
                )
            self.evicted.add(victim.uid)
            victim_book.remove(victim.cu, victim.gpus, victim.gpu_type, True)
            victim_book.evicted_cu += victim.cu
            for index in self.reclaim_index.values():
                index.remove(victim)
                index.prune(victim.queue, victim_book.surplus_cu())
            preempt_index = self.preempt_index.get((victim.queue, victim.gpu_type))
            if preempt_index is not None:
                preempt_index.remove(victim)
            self.evicts.append(
                EvictDecision(victim.uid, victim.queue, reason, message, item.uid, victim.cu)
            )
        self._hold(item, gpu_type, selection.plan)

    # -- phase 3: preempt -----------------------------------------------------------------

    def _preempt(self) -> None:
        now_s = self.snapshot.now_s
        own: dict[tuple[str, str], list[Victim]] = {}  # (queue, GPU type) → its victims
        for running in self.running.values():
            victim = running.victim
            if (
                running.preemptible
                and victim.uid not in self.leaving
                and victim.uid not in self.evicted
                and now_s - victim.started_at_s >= running.min_runtime_s
            ):
                own.setdefault((victim.queue, victim.gpu_type), []).append(victim)
        lowest: dict[str, int] = {}
        for (name, _), victims in own.items():
            found = min(victim.priority_class for victim in victims)
            lowest[name] = min(lowest.get(name, found), found)
        wanting = [
            item
            for name, items in self.queue_pending.items()
            if name in lowest
            for item in items
            if not item.done
            and item.workload.priority_class > lowest[name]  # someone to preempt at all
            and item.code in (PendingCode.NO_CAPACITY, PendingCode.OVER_FAIR_SHARE)
        ]
        self.preempt_own = own
        failed: set[tuple[object, ...]] = set()
        for item in self._in_queue_order(wanting):
            self._try_preempt(item, failed)

    def _try_preempt(self, item: _Pending, failed: set[tuple[object, ...]]) -> bool:
        workload = item.workload
        book = item.book
        pods = workload.gang_min_pods
        below = workload.priority_class
        for gpu_type in item.types:
            # A queue's work comes in falling priority class: a shape that found no victims at
            # one class finds none at a lower one (fewer victims, less capacity).
            key = (book.name, gpu_type, item.kind.memo_key)
            victims = self.preempt_own.get((book.name, gpu_type))
            if not victims or key in failed:
                continue
            if self._pods_allowed(item, gpu_type, within_share=False) < pods:
                continue
            # Cheap necessary conditions before any search: enough GPUs could be freed, and the
            # swap could keep the queue within its share or from growing.
            needed_cu = pods * self._cu_per_pod(item, gpu_type)
            most_cu = most_gpus = 0.0
            for victim in victims:
                if victim.priority_class < below and victim.uid not in self.evicted:
                    most_cu += victim.cu
                    most_gpus += victim.gpus
            free_gpus = self.capacity.free_whole_by_type.get(gpu_type, 0)
            swap_ok = book.allocated_cu - most_cu + needed_cu <= book.fair_share_cu + EPS
            if (
                most_cu <= 0.0
                or (
                    item.shape.gpus_per_pod >= 1.0
                    and free_gpus + most_gpus < pods * item.shape.gpus_per_pod - EPS
                )
                or not (swap_ok or needed_cu <= most_cu + EPS)
            ):
                failed.add(key)
                continue
            index = self.preempt_index.get((book.name, gpu_type))
            if index is None:
                index = VictimIndex(victims, self.capacity)
                self.preempt_index[(book.name, gpu_type)] = index
            leaving = self.leaving_for.get(item.uid, [])
            selection = select_victims(
                self.capacity,
                self._ask(item, gpu_type, pods),
                self.strategy,
                Exclusion(self.held, owner=item.uid),
                index=index,
                budget=VictimBudget({book.name: math.inf}, {}, below_priority_class=below),
                already_leaving=[victim.uses for victim in leaving],
            )
            if selection is None or not selection.victims:
                failed.add(key)
                continue
            freed_cu = selection.cu
            # A swap inside the queue: it must end within its share, or at least not grow.
            within = book.allocated_cu - freed_cu + needed_cu <= book.fair_share_cu + EPS
            if not (within or needed_cu <= freed_cu + EPS):
                continue
            self._commit(item, gpu_type, selection, EvictReason.PREEMPT, bool(leaving))
            return True
        return False

    # -- phase 4: long-waiting gangs --------------------------------------------------------

    def _reserve_for_long_waits(self) -> None:
        after_s = self.pool.gang_reservation_after_s
        if after_s is None:
            return
        now_s = self.snapshot.now_s
        waiting = [
            item
            for items in self.queue_pending.values()
            for item in items
            if not item.done
            and item.code is PendingCode.NO_CAPACITY
            and now_s - item.workload.submit_time_s >= after_s
        ]
        served: set[str] = set()
        for item in self._in_queue_order(waiting):
            if item.book.name in served:
                continue
            if self._reserve_gang(item):
                served.add(item.book.name)

    def _reserve_gang(self, item: _Pending) -> bool:
        workload = item.workload
        pods = workload.gang_min_pods
        exclusion = Exclusion(self.held, owner=item.uid)
        capacity = self.capacity
        for gpu_type in item.types:
            if self._pods_allowed(item, gpu_type, within_share=True) < pods:
                continue
            usable = [
                index
                for index in capacity.by_type[gpu_type]
                if not exclusion.blocks(index) and index not in self.gang_held
            ]
            groups: list[list[int]] = [usable]
            if workload.topology is not None and workload.topology.required:
                allowed = set(usable)
                groups = [
                    [index for index in members if index in allowed]
                    for _, members in sorted(
                        capacity.domains(workload.topology.level).get(gpu_type, {}).items()
                    )
                ]
            chosen = self._fullest_hole(groups, item.shape, pods)
            if chosen is None:
                continue
            self.gang_held.update(chosen)
            item.held_nodes = len(chosen)
            self.reservations.append(
                Reservation(
                    item.uid,
                    ReservationKind.GANG_WAIT,
                    gpu_type,
                    tuple(capacity.nodes[index].name for index in sorted(chosen)),
                )
            )
            return True
        return False

    def _fullest_hole(
        self, groups: list[list[int]], shape: PodShape, pods: int
    ) -> list[int] | None:
        """The nodes with the most free GPUs that, emptied, hold the gang; in the group (domain)
        where they are freest. Most-free-first keeps the choice stable while the hole drains."""
        best: tuple[float, list[int]] | None = None
        nodes = self.capacity.nodes
        for group in groups:
            ranked = sorted(group, key=lambda index: (-nodes[index].free_gpus(), index))
            chosen: list[int] = []
            room = 0
            free = 0.0
            for index in ranked:
                state = nodes[index]
                size = pods_fit_empty(state, shape)
                if size <= 0:
                    continue
                chosen.append(index)
                room += size
                free += min(pods_fit(state, shape), size)
                if room >= pods:
                    break
            if room >= pods and (best is None or free > best[0]):
                best = (free, chosen)
        return None if best is None else best[1]
