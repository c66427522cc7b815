"""What one cycle's loading leaves for the next cycle of the same pool (issue 17: a cycle that
costs what changed).

Loading (`cycle_load`) turns every running allocation into its possible victim (`Running`,
with the GPUs, CPU and memory its pods use: `PodUse`s) and every pending workload into its kind
and its place in the queue order. Each of those records is a function of the input object it
was made from and of the pool's hardware and queues alone: the snapshot's `pool`, `nodes`,
`gpu_types` and `queues` (node indices and GPU counts, readiness, GPU weights, the queues' tiers
and eviction ranks, which queues are leaves). A `CarriedLoad` keeps the records of the last
cycle by the identity of the allocation or workload they were made from; the next cycle over
the same pool, hardware and queues (compared by value) reuses the record of every input object
it is given again, and makes the others as before. Pending work is carried as whole queues
(`cycle_load_pending`): each queue's items in order, so a queue that lost or gained a few
workloads is not sorted again, and one that did not change keeps its suffix minima; a pending
workload the pool never holds is kept with its reason. A process that keeps its rows between cycles
(`services/snapshot_source.py`, the simulator) hands the same objects again for whatever did
not change, so the next cycle makes records only for what did.

The free capacity depends on the order of events (placement reads nodes in the order they
moved between free-GPU buckets), so it is carried only where that order is the same: the last
load keeps a copy of the capacity after all its running work, with the running allocations it
took, and a load whose running allocations begin with exactly those objects, in that order
(compared by identity), starts from a copy of it and takes only the allocations after them
(`Capacity.copy`: the same uses, buckets in the same order, the same version numbers; the
cycle's capacity is that copy, made when the cycle's state is, `CycleState`). With it the load keeps what that running work made of the rest: the victims (uid to
`Running`, in order) and the queue books' totals (`book_totals`: the same sums, added in the
same order), so those allocations are not read at all. The rest of the books and the claims'
holds are built afresh each cycle, in the snapshot's order, from the carried records exactly as
from new ones, so every decision is the one a cycle without carried state makes
(`tests/domain/test_cycle_memory.py`; `bench/cycle_equivalence.py`).

`Running` and `Kind` are never changed once made, so a record can be shared by two cycles. A
queue's items (`Pending`) are the one exception: a cycle marks them (bound, held, their reason),
so the load that takes them makes each new again (its reason code, `done`, held nodes as
a new `Pending` has them) instead of making another; their books are the last cycle's, made new
again (`books`, `QueueBook.reset`), so the items keep them. A carried state therefore serves one
cycle at a time. The record tables and the queues' lists are replaced whole at the end of each
load, never changed in place: a shallow copy of a `CarriedLoad` is its state at that moment
(the benchmarks time one *next* cycle again and again from the same carried state that way).

The result leaves its pending reasons too (`CarriedLoad.reasons`, replaced whole by each
result): per queue, its numbers and the reasons made of them and of words around them
(`CycleState.result`). Such a reason is a function of those two strings alone, whatever the
pool, so the next result takes it again for a queue whose numbers did not change; a reason that
reads more of its queue (its limits) is made anew each cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import is_

from gpufair.domain.capacity import Capacity, PodUse
from gpufair.domain.cycle_state import Kind, Pending, Running, Words
from gpufair.domain.model import Allocation, GpuType, Node, NodePool, Queue, Workload
from gpufair.domain.queuebook import LimitBook, QueueBook
from gpufair.domain.snapshot import CycleSnapshot, PendingReason

# A running allocation's record: the allocation itself (its identity is the key; holding it
# keeps the key from being reused), the uses its pods take, its victim, and whether it is the
# one-binding case loading takes with `Capacity.take_one`.
RunningRecord = tuple[Allocation, tuple[PodUse, ...], Running, bool]
# A pending workload's key in the tables below: its identity over 16 (`id(workload) >> 4`).
# Live objects do not overlap and take at least 16 bytes, so their keys differ; addresses
# themselves, all multiples of 16, crowd into a sixteenth of a dict's or set's slots.
# A queue's pending records (only workloads of this pool, of a usable kind, not compute-unit
# requests), in the queue's order: their items (`Pending`, made new again by each load that
# takes them), the keys of their workloads, the least CU of each (`Kind.min_cu`: a queue that
# lost some finds its suffix minima without reading its items again), and the least CU of every
# suffix (`CycleState.suffix_min_cu`) when the queue held nothing else (else None).
QueueRecords = tuple[list[Pending], list[int], list[float], list[float] | None]
# A pending workload of a leaf queue of this pool that the pool could never hold: the workload
# and its `NEVER_FITS` reason.
Rejection = tuple[Workload, PendingReason]
# A queue's pending reasons in the last cycle's result (`CycleState.result`): its numbers
# (`explain.queue_numbers`) and the reasons made of them, by the words around them.
QueueReasons = tuple[str, dict[Words, PendingReason]]
Inputs = tuple[NodePool, tuple[Node, ...], tuple[GpuType, ...], tuple[Queue, ...]]
# The capacity after a load's running work, and the running allocations it took (in order).
RunningCapacity = tuple[tuple[Allocation, ...], Capacity]
# What a load's running work added to the queue books (`QueueBook.add`, `allocated_cu_before`):
# per leaf queue its allocated, non-preemptible and before-the-cycle CU and its GPUs per type;
# per inner queue with limits (`LimitBook`) its allocated CU and GPUs per type.
BookTotals = tuple[
    dict[str, tuple[float, float, float, dict[str, float]]],
    dict[str, tuple[float, dict[str, float]]],
]


@dataclass(slots=True)
class CarriedLoad:
    """The last load's records of one pool (see the module docstring); one per pool, given to
    `run_cycle` every cycle of that pool."""

    inputs: Inputs | None = None
    # The records of the running allocations the kept capacity took (`capacity`): those in
    # `running` and those in `running_added`, made by the loads since `running` that started
    # from the kept capacity (`add_records`), so such a load neither copies the table nor
    # leaves it for the young pass after the cycle; merged once they are an eighth of it.
    running: dict[int, RunningRecord] = field(default_factory=dict)
    running_added: dict[int, RunningRecord] = field(default_factory=dict)
    queues: dict[str, QueueRecords] = field(default_factory=dict)
    # The last cycle's books by queue, those its items hold (`Pending.book`): the next cycle
    # over the same queues makes them new again and keeps them (`CycleState`).
    books: dict[str, QueueBook] = field(default_factory=dict)
    # The keys of the queues' workloads, to None: the queues' items keep the workloads alive
    # (so no key is reused while it is here), and a table of numbers only is one the
    # collector does not track (its young pass after a cycle never reads it).
    pending: dict[int, None] = field(default_factory=dict)
    # The queues' items by uid, and the uids whose item here has left the queues since the
    # table was made (`left_uids`: not to be read). A load that only drops items adds their
    # uids to `left_uids` and keeps the table, not copied (nor read by the young pass after
    # the cycle), until they are more than an eighth of it; one that adds items makes the
    # table anew without them. An item kept here keeps its workload alive, so its key
    # (`pending`) is not reused meanwhile.
    by_uid: dict[str, Pending] = field(default_factory=dict)
    left_uids: frozenset[str] = frozenset()
    rejected: dict[int, Rejection] = field(default_factory=dict)  # by the workload's id
    # The reasons of `rejected`, by uid (unique: each uid is loaded once), in its order:
    # written in one call when all of them come again where they were (`order`).
    rejected_reasons: dict[str, PendingReason] = field(default_factory=dict)
    kinds: dict[tuple[object, ...], Kind] = field(default_factory=dict)
    capacity: RunningCapacity | None = None  # never changed: a load copies it
    # With `capacity`: the running work that capacity took, as the load left it (uid to
    # `Running`, in the load's order: `victims`, then `victims_added`, kept and merged as the
    # records are, `running_added`), and the books' totals after it. Never changed: a load
    # copies them.
    victims: dict[str, Running] = field(default_factory=dict)
    victims_added: dict[str, Running] = field(default_factory=dict)
    totals: BookTotals | None = None
    # The last load's pending workloads, and per position whether the queues hold its workload
    # (1), it is one of `rejected` (2), or neither (0): bytes, which the collector does not
    # track, so its young pass after a cycle never reads them (`cycle_load_pending._aligned`);
    # None: not kept (a uid loaded twice, `doubled`).
    order: tuple[tuple[Workload, ...], bytes] | None = None
    doubled: bool = False
    reused: int = 0  # records the last load took from the cycle before (tests, benchmarks)
    shared: int = 0  # running allocations the last load found in the kept capacity (same)
    # Per queue, the reasons the last cycle's result made (`CycleState.result`); replaced by
    # each result, never changed in place.
    reasons: dict[str, QueueReasons] = field(default_factory=dict)

    def valid_for(self, snapshot: CycleSnapshot) -> bool:
        """Whether the records were made over `snapshot`'s pool, hardware and queues; if not,
        they are dropped, and the inputs remembered for the records this load makes."""
        inputs = (snapshot.pool, snapshot.nodes, snapshot.gpu_types, snapshot.queues)
        if self.inputs is not None and self.inputs == inputs:
            return True
        self.inputs = inputs
        self.running = {}
        self.running_added = {}
        self.queues = {}
        self.books = {}
        self.pending = {}
        self.by_uid = {}
        self.left_uids = frozenset()
        self.rejected = {}
        self.rejected_reasons = {}
        self.kinds = {}
        self.capacity = None
        self.victims = {}
        self.victims_added = {}
        self.totals = None
        self.order = None
        self.reasons = {}
        return False

    def shared_running(self, allocations: tuple[Allocation, ...]) -> int:
        """How many running allocations a load may skip taking, starting from the kept
        capacity: all those the kept capacity took, when `allocations` begin with exactly them
        (the same objects, in order) and the records (`running` with `running_added`) are one
        for each (else 0: so when they hold a uid twice, whose second allocation has no
        record). The records are what the loads since the capacity's first keeping recorded,
        kept with it (`cycle_load`): a record of each allocation taken but those of a uid
        taken before, so a record each when there are as many. Asked once the records are
        known to be valid (`valid_for`)."""
        if self.capacity is None:
            return 0
        taken = self.capacity[0]
        count = len(taken)
        if count == 0 or count > len(allocations) or self.records() != count:
            return 0
        if not all(map(is_, taken, allocations[:count])):
            return 0
        return count

    def records(self) -> int:
        """How many running records are kept (`running` and `running_added`)."""
        return len(self.running) + len(self.running_added)

    def add_records(self, made: dict[int, RunningRecord], victims: dict[str, Running]) -> None:
        """Add the records a load made on top of the kept ones, and the victims it made after
        the kept ones (replacing `running_added` and `victims_added`, or past an eighth of
        `running` all four, never changing one in place)."""
        if not made and not victims:
            return
        added = {**self.running_added, **made}
        victims = {**self.victims_added, **victims}
        if len(added) > len(self.running) >> 3:
            self.running = {**self.running, **added}
            self.victims = {**self.victims, **victims}
            added = {}
            victims = {}
        self.running_added = added
        self.victims_added = victims


def book_totals(books: dict[str, QueueBook]) -> BookTotals:
    """What the running work added to `books` and the inner queues' books above them, copied."""
    leaves = {
        name: (
            book.allocated_cu,
            book.nonpreemptible_cu,
            book.allocated_cu_before,
            dict(book.gpus_by_type),
        )
        for name, book in books.items()
    }
    inner: dict[str, tuple[float, dict[str, float]]] = {}
    for book in books.values():
        for ancestor in book.ancestors:
            if ancestor.name not in inner:
                inner[ancestor.name] = (ancestor.allocated_cu, dict(ancestor.gpus_by_type))
    return leaves, inner


def restore_totals(books: dict[str, QueueBook], totals: BookTotals) -> None:
    """Put `totals` (`book_totals` of the same queues) into the new `books`, as if the same
    running work had been added to them in the same order: the same sums."""
    leaves, inner = totals
    seen: set[int] = set()
    for name, book in books.items():
        allocated, nonpreemptible, before, gpus = leaves[name]
        book.allocated_cu = allocated
        book.nonpreemptible_cu = nonpreemptible
        book.allocated_cu_before = before
        book.gpus_by_type = dict(gpus)
        for ancestor in book.ancestors:
            if id(ancestor) not in seen:
                seen.add(id(ancestor))
                _restore_inner(ancestor, inner[ancestor.name])


def _restore_inner(book: LimitBook, totals: tuple[float, dict[str, float]]) -> None:
    book.allocated_cu = totals[0]
    book.gpus_by_type = dict(totals[1])
