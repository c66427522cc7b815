"""Loading pending work (`cycle_load`): each pending workload into its queue as a `Pending`, the
queues' items in DESIGN §4.1 order (priority class, highest first, then submit time), and per
queue the least CU of every suffix of its items (`CycleState.suffix_min_cu`).

With records carried from the pool's last cycle (`cycle_memory`), the queues are carried: per
queue, its items (`Pending`) of last time, already in order. A cycle then finds each carried
workload given again by identity only, in C: where the pending workloads come in the last
load's order (some gone, some new), by walking them beside that load's (`_aligned`), which
names the few gone and leaves every queue that lost none whole; else by set membership of
each one's key (`map` over `id`, `cycle_memory`). It keeps each queue's order (dropping what
left; after the walk, a queue's records are read only up to the last of those, `_kept_before`),
so what it does per workload in Python is to make its item new again
(`cycle_memory`); a queue that lost or gained nothing keeps its suffix minima too. A
workload the pool never holds (`NEVER_FITS`), given again, keeps its reason from the cycle
before, written in C with the others: when all of them come where the walk finds them
(marked in the kept order, `_rejected_in_place`), in one call, none of them read; else
found among the workloads not carried (`_rejected_again`). Only the other workloads not
carried (new, of no leaf queue, of another pool, compute-unit requests) go through the full
path, in the snapshot's order, and are merged into their queues by order. The queues come
in the order of their first workload in the snapshot, as when every workload is loaded anew,
and everything is what a load without carried records makes: a
workload's kind, order and never-fits reason are functions of the workload and of the pool's
hardware and queues (equal, or the records are dropped), and a uid loaded twice is loaded as
without records (the carried queues are not used then).

Loading also finds the claimants (`CycleState.claimants`: the workloads evictions were made
for, `cycle_claims`): carried ones by uid, the others as they are loaded, so no phase reads
every pending workload to find them."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from itertools import chain, compress
from operator import attrgetter, indexOf, is_, itemgetter, not_
from typing import Any

from gpufair.domain import cu_request
from gpufair.domain.cycle_memory import CarriedLoad, QueueRecords, Rejection
from gpufair.domain.cycle_state import CycleState, Kind, MemoKey, Pending
from gpufair.domain.model import Workload
from gpufair.domain.placement_ask import PodShape, adequate_types, signature
from gpufair.domain.placement_rejection import rejection_in
from gpufair.domain.queuebook import QueueBook
from gpufair.domain.snapshot import PendingCode, PendingReason

_by_order = attrgetter("order")
_workload_of = attrgetter("workload")
_uid_of = attrgetter("uid")
_first = itemgetter(0)
_second = itemgetter(1)

# Per queue, what the full path loaded: its first position in the snapshot and its items.
Loaded = dict[str, tuple[int, list[Pending]]]
# Per queue, its carried workloads not given again, by key (`_aligned`).
Dropped = dict[str, dict[int, Workload]]


def load_pending(state: CycleState, carried: CarriedLoad | None, fresh: Sequence[str] = ()) -> int:
    """Pending work into its queues (see the module docstring); returns how many workloads
    were taken from `carried`'s queues and leaves this load's queues there (None: nothing is
    carried or kept). `fresh`: the uids of the running workloads whose records this load made
    (the others ran in the cycle that made `carried`, so no carried workload has their uid)."""
    pending = state.snapshot.pending
    if carried is None:
        _fill(state, _load_each(state, enumerate(pending), None), {}, {}, set(), None)
        return 0
    known = carried.pending
    aligned = _aligned(pending, carried) if known else None
    present: set[int] = set()  # the keys of the carried workloads given again (not aligned)
    absent: set[int] = set()  # aligned: the keys of those not given again
    dropped: Dropped | None = None
    gone_uids: set[str] = set()  # aligned: the uids of those not given again
    if aligned is not None:
        hits, dropped = aligned
        absent = absent.union(*dropped.values())
        gone_uids = {workload.uid for left in dropped.values() for workload in left.values()}
        reused = len(known) - len(absent)
        wanted = sum(1 for name, records in carried.queues.items() if name not in dropped)
        wanted += sum(len(dropped[name]) < len(carried.queues[name][1]) for name in dropped)
    else:
        ids = [id(workload) >> 4 for workload in pending]  # their keys
        hits = bytearray(map(known.__contains__, ids)) if known else bytearray(len(ids))
        present = set(compress(ids, hits))
        reused = len(present)
        wanted = sum(1 for records in carried.queues.values() if not present.isdisjoint(records[1]))
    misses = _misses(hits)
    missed = list(map(pending.__getitem__, misses))  # in C, as `entries` below
    was_rejected = carried.rejected
    in_place = _rejected_in_place(state, carried, hits, missed)
    if not in_place and _REJECTED in hits:  # they are looked up among the others
        hits = hits.translate(_QUEUED)
        misses = _misses(hits)
        missed = list(map(pending.__getitem__, misses))
    # A workload the last load found never fitting, given again, is not among those asked:
    # after any load no queued workload has the uid of one it rejected (each uid is loaded
    # once, and one taken from the carried queues is never also loaded).
    again = list(map(was_rejected.get, map(id, missed))) if was_rejected and not in_place else None
    new = [workload.uid for workload in (compress(missed, map(not_, again)) if again else missed)]
    if reused and (
        _uid_taken(carried, [*fresh, *new], present)
        if dropped is None
        else _uid_taken(carried, [*fresh, *new], gone=gone_uids)
    ):
        # A carried workload's uid is running, or given by another object too: everything is
        # loaded as without records (the first of a uid wins, in the snapshot's order).
        hits = bytearray(len(pending))
        present = set()
        dropped = None
        reused = wanted = 0
        in_place = False
        misses = list(range(len(pending)))
        missed = list(pending)
        again = list(map(was_rejected.get, map(id, missed))) if was_rejected else None
    ordinary: dict[int, int] = {}  # loaded items (by identity) of ordinary workloads: kept
    rejected: dict[int, Rejection] = {}
    rejected_at: list[int] = []  # the positions of the rejections kept, where not marked
    carried.doubled = False
    if in_place:
        state.reasons.update(carried.rejected_reasons)
        kept, kept_reasons = was_rejected, carried.rejected_reasons
    else:
        kept, kept_reasons, misses, missed = _rejected_again(
            state, misses, missed, again, carried, rejected_at
        )
    entries = zip(misses, missed, strict=True)
    claimed = state.leaving_for.keys() | state.standing_claims
    loaded = _load_each(state, entries, ordinary, rejected, claimed, rejected_at)
    if rejected:
        carried.rejected = {**kept, **rejected}
        made = {workload.uid: reason for workload, reason in rejected.values()}
        carried.rejected_reasons = {**kept_reasons, **made}
    else:
        carried.rejected = kept
        carried.rejected_reasons = kept_reasons
    # The queues in the order of their first workload, and where that is, to place the queues
    # of the workloads not carried.
    first = _first_positions(pending, hits, wanted) if reused else {}
    queues: dict[str, QueueRecords] = {}
    gone = _fill(state, loaded, first, carried.queues, present, queues, ordinary, dropped)
    carried.queues = queues
    claimed -= carried.left_uids  # their `by_uid` items are no longer queued
    if dropped is None:
        found = list(filter(None, map(carried.by_uid.get, _in_eviction_order(state, claimed))))
        keys = [id(item.workload) >> 4 for item in found]
        state.claimants += compress(found, map(present.__contains__, keys))
    else:
        # The carried item of a uid is the only one of that uid in the carried queues (a uid
        # given twice is loaded without records): a claimant's item is dropped exactly when
        # its uid is one of the dropped workloads', so the items are not read.
        claimed -= gone_uids
        state.claimants += filter(None, map(carried.by_uid.get, _in_eviction_order(state, claimed)))
    if gone or ordinary:  # the tables are replaced, never changed in place (`cycle_memory`)
        known = dict(known)
        for workload in gone:
            del known[id(workload) >> 4]
        left = carried.left_uids.union([workload.uid for workload in gone])
        if ordinary or len(left) > len(carried.by_uid) >> 3:
            by_uid = dict(carried.by_uid)
            for uid in left:
                del by_uid[uid]
            left = frozenset()
            for _, items in loaded.values():
                for item in items:
                    if id(item) in ordinary:
                        known[id(item.workload) >> 4] = None
                        by_uid[item.uid] = item
            carried.by_uid = by_uid
        carried.pending = known
        carried.left_uids = left
    _keep_order(carried, pending, hits, ordinary, rejected_at)
    return reused


# The marks of `CarriedLoad.order`: a workload the queues hold, one the pool never holds (kept
# in `CarriedLoad.rejected`); 0 for any other. `_QUEUED` keeps only the first.
_HELD = 1
_REJECTED = 2
_QUEUED = bytes([1 if mark == _HELD else 0 for mark in range(256)])


def _rejected_in_place(
    state: CycleState, carried: CarriedLoad, hits: bytearray, missed: list[Workload]
) -> bool:
    """Whether every workload the last load found never fitting (`CarriedLoad.rejected`) is
    given again where the walk beside the last load's workloads found it (`_aligned`: marked
    `_REJECTED` in `hits`, the same object as then), none of their uids is running, and none
    is the uid of a workload not carried (`missed`): they then keep their reasons, written
    from `CarriedLoad.rejected_reasons` in one C call, and are neither misses nor looked up.
    A mark stands for one entry (a uid loaded twice keeps no order), so as many marks as
    entries are all of them; `_rejected_again` would take each (its uid unique, not running,
    not another's) with the same reason."""
    reasons = carried.rejected_reasons
    if not reasons or hits.count(_REJECTED) != len(carried.rejected):
        return False
    return state.running.keys().isdisjoint(reasons) and reasons.keys().isdisjoint(
        map(_uid_of, missed)
    )


def _in_eviction_order(state: CycleState, claimed: AbstractSet[str]) -> Iterator[str]:
    """The uids of `claimed` (all beneficiaries of `leaving_for` or `standing_claims`), those
    with victims leaving in the order of `leaving_for` (the snapshot's evictions: as a cycle
    decided them, each queue's in nearly its workload order), then the others. The claims phase
    orders its claimants per queue (`CycleState.in_queue_order`): from this order that sort
    finds few runs (at 4,000 nodes 272 for 200 queues, against 4,835 in a set's order)."""
    leaving_for = state.leaving_for
    others = state.standing_claims.difference(leaving_for)
    return filter(claimed.__contains__, chain(leaving_for, others))


def _misses(hits: bytearray) -> list[int]:
    """The positions of 0 in `hits`. Few, when records are carried: found by `find` (a memchr)
    from one to the next, not by a pass in C that makes an int of every position; many: by
    that pass."""
    size = len(hits)
    if hits.count(0) > size >> 4:
        return list(compress(range(size), map(not_, hits)))
    found: list[int] = []
    at = hits.find(0)
    while at >= 0:
        found.append(at)
        at = hits.find(0, at + 1)
    return found


def _keep_order(
    carried: CarriedLoad,
    pending: tuple[Workload, ...],
    hits: bytearray,
    ordinary: dict[int, int],
    rejected_at: list[int],
) -> None:
    """Keep `pending` and, per position, whether its workload is in the carried queues now
    or in the rejections kept (`CarriedLoad.order`, what `_aligned` starts from): the carried
    ones given again and the rejections kept in place (`hits`), the ordinary ones loaded and
    the rejections kept at `rejected_at`. A uid loaded twice (the second skipped,
    `_load_each`) could leave a queued workload at a position marked not queued: no order is
    kept then."""
    if ordinary or rejected_at:
        flags = bytearray(hits)
        for at in ordinary.values():
            flags[at] = _HELD
        for at in rejected_at:
            flags[at] = _REJECTED
    else:
        flags = hits
    if carried.doubled or flags.count(_HELD) != len(carried.pending):
        carried.order = None
    else:
        carried.order = (pending, bytes(flags))


def _aligned(
    pending: tuple[Workload, ...], carried: CarriedLoad
) -> tuple[bytearray, Dropped] | None:
    """The carried workloads given again found by walking `pending` beside the last load's
    (`CarriedLoad.order`) by identity, in C over every stretch the two share: per position of
    `pending`, whether its workload is a carried one (as `carried.pending` holds it), and per
    queue the keys of its carried workloads not given again. Only where the two part does
    Python look: a workload the last load queued that comes again further on means the last
    one's workloads between were dropped; one it did not queue is not carried. None when the
    order is not kept, when a carried workload comes again out of order or twice (the last
    load's are then passed before it: it is met after them), or after more partings than a
    sixteenth of the workloads (new objects, mostly: the table lookups are cheaper then).

    The marks are the kept order's: a workload the last load rejected (`CarriedLoad.rejected`,
    marked `_REJECTED`) given again in its place keeps that mark, and one met at a parting is
    in the last load's further on, as a queued one is (the last load's workloads before it
    are passed), so it keeps its mark too."""
    if carried.order is None:
        return None
    last, flags = carried.order
    known = carried.pending
    rejected = carried.rejected
    size = len(pending)
    end = len(last)
    budget = max(1024, size >> 4)
    hits = bytearray()
    dropped: Dropped = {}
    left: Iterable[Workload] = ()  # the last load's queued workloads after the last given
    # Iterators over both, set to each stretch's start (`__setstate__`, as in unpickling):
    # the pairs are compared in C as they come, up to the first that differs
    # (`operator.indexOf`: no copy, no number made per pair).
    mine: Any = iter(pending)
    theirs: Any = iter(last)
    at = was = 0
    while True:
        mine.__setstate__(at)
        theirs.__setstate__(was)
        try:
            run = indexOf(map(is_, mine, theirs), False)
        except ValueError:  # no pair differs: one of them has ended
            run = min(size - at, end - was)
        hits += flags[was : was + run]
        at += run
        was += run
        if at == size:
            left = compress(last[was:], flags[was:].translate(_QUEUED))
            break
        if was == end:
            if any(id(workload) >> 4 in known for workload in pending[at:]):
                return None
            hits += bytes(size - at)
            break
        budget -= 1
        if budget < 0:
            return None
        if id(pending[at]) >> 4 in known or id(pending[at]) in rejected:
            if flags[was] == _HELD:
                workload = last[was]
                dropped.setdefault(workload.queue, {})[id(workload) >> 4] = workload
            was += 1
        else:
            hits.append(0)
            at += 1
    for workload in left:
        dropped.setdefault(workload.queue, {})[id(workload) >> 4] = workload
    return hits, dropped


def _first_positions(pending: Sequence[Workload], hits: bytearray, wanted: int) -> dict[str, int]:
    """Per queue with carried workloads given again (`hits`, by position in `pending`), the
    position of its first such workload, in the order of those positions. How many queues
    have some (`wanted`) is known from their records, so the scan ends once it has met them
    all: a few hundred workloads in, not all of them."""
    first: dict[str, int] = {}
    for at in compress(range(len(pending)), hits):
        if hits[at] != _HELD:
            continue  # a workload the pool never holds (`_REJECTED`)
        name = pending[at].queue
        if name not in first:
            first[name] = at
            if len(first) == wanted:
                break
    return first


def _uid_taken(
    carried: CarriedLoad,
    new: list[str],
    given: set[int] | None = None,
    gone: AbstractSet[str] = frozenset(),
) -> bool:
    """Whether one of `new` (uids of running workloads made anew, of pending ones not carried)
    is the uid of a carried workload given again: one whose key is in `given`; without
    `given` (the aligned walk), any carried one but those whose uids are in `gone` (the
    carried workloads not given again: the carried item of a uid is the only one of that uid
    in the carried queues, so the items are not read)."""
    by_uid = carried.by_uid
    left = carried.left_uids
    if given is None:
        asked = set(new)
        asked -= gone
        asked -= left
        return not by_uid.keys().isdisjoint(asked)
    for uid in new:
        item = by_uid.get(uid)
        if item is not None and uid not in left and id(item.workload) >> 4 in given:
            return True
    return False


def _rejected_again(
    state: CycleState,
    misses: list[int],
    missed: list[Workload],
    again: list[Rejection | None] | None,
    carried: CarriedLoad,
    rejected_at: list[int],
) -> tuple[dict[int, Rejection], dict[str, PendingReason], list[int], list[Workload]]:
    """Of the workloads not carried (`missed`, at positions `misses`), those the last load
    found never fitting, given again (`again`: per workload its `CarriedLoad.rejected` entry,
    else None), only have their reason written again, in C, and are kept: returns the
    rejections kept (the last load's table itself when all of it is given again) and their
    reasons by uid, and the others, at their positions, for `_load_each`; the positions of
    those kept go to `rejected_at`. When a uid of one of them is running, given twice, or
    that of another workload not carried (the first of a uid wins, in the snapshot's order),
    none is taken so: all go to `_load_each`, which finds the same reasons. Their reasons
    come before those `_load_each` writes (the order of `CycleResult.pending` is not part of
    the result: the reply sorts it)."""
    was_rejected = carried.rejected
    taken = list(filter(None, again)) if again else []
    if not taken:
        return {}, {}, misses, missed
    assert again is not None
    others = list(map(not_, again))
    uids = list(map(_uid_of, map(_first, taken)))
    unique = set(uids)
    if (
        len(unique) < len(uids)
        or not state.running.keys().isdisjoint(unique)
        or not unique.isdisjoint(map(_uid_of, compress(missed, others)))
    ):
        return {}, {}, misses, missed
    reasons = dict(zip(uids, map(_second, taken), strict=True))
    state.reasons.update(reasons)
    rejected_at += compress(misses, again)
    if len(taken) == len(was_rejected):  # each entry once: all of them
        return was_rejected, reasons, list(compress(misses, others)), list(compress(missed, others))
    kept = dict(zip(map(id, map(_first, taken)), taken, strict=True))
    return kept, reasons, list(compress(misses, others)), list(compress(missed, others))


def _load_each(
    state: CycleState,
    entries: Iterable[tuple[int, Workload]],
    ordinary: dict[int, int] | None,
    rejected: dict[int, Rejection] | None = None,
    claimed: set[str] | None = None,
    rejected_at: list[int] | None = None,
) -> Loaded:
    """The full path: `entries` (position in the snapshot, workload), in the snapshot's order,
    into per-queue lists of items in DESIGN §4.1 order, with each queue's first position; the
    first of a uid (running ones first) wins. Puts the identity of every item of an ordinary
    workload (of a leaf queue of this pool, of a usable kind, not a compute-unit request) into
    `ordinary`, with its position (a second of a uid marks `CarriedLoad.doubled`), and every
    such workload that never fits, with its reason, into `rejected` (None: not kept; those
    the last load rejected, given again, are kept before, `_rejected_again`) and its position
    into `rejected_at`. A workload of a
    known signature costs a tuple (`signature`, one C call), a dict lookup and its `Pending`.

    The items are made queue by queue, each queue's in order (`_made_in_order`), not in the
    snapshot's order: items made one after another lie side by side in memory, and every pass
    of a cycle reads a queue's items in order. With records carried they are kept from cycle
    to cycle, so the passes of later cycles read them so too (in the cycle after a steady one
    at 4,000 nodes, the two allocate passes take about 0.6 of the time they take over items
    made in the snapshot's order, where the workloads come in no order of queue)."""
    pool = state.pool.name
    books = state.books
    kinds = state.kinds
    reasons = state.reasons
    if claimed is None:
        claimed = state.leaving_for.keys() | state.standing_claims
    running = state.running
    seen: set[str] = set()  # the pending uids met
    by_queue: dict[str, tuple[int, QueueBook, list[Entry]]] = {}  # per queue, as `Loaded`
    for at, submitted in entries:
        workload = submitted
        uid = workload.uid
        if uid in seen or uid in running:
            if uid in seen and state.carried is not None:
                state.carried.doubled = True
            continue
        seen.add(uid)
        book = books.get(workload.queue)
        usual = False
        kind: Kind | None
        if book is None or workload.pool != pool or submitted.compute_units > 0.0:
            found = _unusual(state, submitted, book)
            if found is None or book is None:
                continue
            workload, kind = found
        else:
            kind = kinds.get(signature(workload)) or kind_of(state, workload)
            usual = kind.rejection is None and bool(kind.types)
            if not usual:
                kind = _usable_kind(state, submitted, workload, kind)
                if kind is None:
                    if rejected is not None:
                        rejected[id(submitted)] = (submitted, reasons[uid])
                        if rejected_at is not None:
                            rejected_at.append(at)
                    continue
        entry = ((-workload.priority_class, workload.submit_time_s, uid), at, workload, kind, usual)
        queue = by_queue.get(book.name)
        if queue is None:
            by_queue[book.name] = (at, book, [entry])
        else:
            queue[2].append(entry)
    loaded: Loaded = {}
    for name, (at, book, queued) in by_queue.items():
        loaded[name] = (at, _made_in_order(state, book, queued, ordinary, claimed))
    return loaded


# A workload the full path loads, before its item is made: its order (`Pending.order`), its
# position in the snapshot, the workload as scheduled, its kind, and whether it is ordinary.
Entry = tuple[tuple[int, float, str], int, Workload, Kind, bool]


def _made_in_order(
    state: CycleState,
    book: QueueBook,
    queued: list[Entry],
    ordinary: dict[int, int] | None,
    claimed: AbstractSet[str],
) -> list[Pending]:
    """The items of one queue's `queued` workloads, made one after another in their order
    (orders differ: each ends with its uid), the ordinary ones put into `ordinary` with their
    position and the claimants (`claimed`) into `CycleState.claimants`.

    Each item holds a copy of its uid made beside it (`Pending.uid`, equal to the workload's):
    the result puts every waiting workload's uid into its dict, which reads the string's hash,
    and the snapshot's strings lie where the workloads were made, in no order of queue (in the
    cycle after a steady one at 4,000 nodes the result takes about 0.7 of its time over the
    copies; they cost about 60 bytes per waiting workload, made once while it is carried)."""
    queued.sort(key=_first)
    claimants = state.claimants
    items: list[Pending] = []
    for order, at, workload, kind, usual in queued:
        uid = "".join((order[2], ""))  # a new string of the same text
        item = Pending(workload, book, kind, uid, order, kind.trial_keys[workload.preemptible])
        if usual and ordinary is not None:
            ordinary[id(item)] = at
        if uid in claimed:
            claimants.append(item)
        items.append(item)
    return items


def _fill(
    state: CycleState,
    loaded: Loaded,
    first: dict[str, int],
    carried: dict[str, QueueRecords],
    present: set[int],
    keep: dict[str, QueueRecords] | None,
    ordinary: dict[int, int] | None = None,
    dropped: Dropped | None = None,
) -> list[Workload]:
    """The queues into `state` in the order of their first workload in the snapshot: each
    queue's carried workloads given again (`present`, by key; `first` holds the queues that
    have some; or, with `dropped`, the keys of each queue's carried workloads not given again, a queue
    not in it is taken whole) and its `loaded` items, merged by order. Puts each queue's ordinary workloads into
    `keep` (None: not kept); returns the carried workloads not given again."""
    starts = dict(first)
    for name, (at, _) in loaded.items():
        if at < starts.get(name, len(state.snapshot.pending)):
            starts[name] = at
    books = state.books
    gone: list[Workload] = []
    for name, earlier in carried.items():
        if name not in first:
            gone += map(_workload_of, earlier[0])
    waiting = PendingCode.OVER_FAIR_SHARE  # what a new `Pending` waits for
    for name in sorted(starts, key=starts.__getitem__):
        book = books[name]
        least: list[float] | None = None
        items: list[Pending] = []
        records: QueueRecords | None = carried.get(name) if name in first else None
        if records is not None:
            ids = records[1]
            if dropped is None:
                if not present.issuperset(ids):
                    taken = list(map(present.__contains__, ids))
                    gone += map(_workload_of, compress(records[0], map(not_, taken)))
                    end = len(taken) - taken[::-1].index(False)
                    records = _without(records, taken[:end], end)
            else:
                left = dropped.get(name)
                if left is not None:
                    gone += left.values()
                    records = _without(records, *_kept_before(ids, left))
            kept, ids, cus, least = records
            # Every item of a queue holds the same book, the one it was loaded with: usually
            # this one, made new again (`CycleState`), and then the items keep it.
            if kept and kept[0].book is not book:
                for item in kept:
                    item.book = book
            for item in kept:  # as new (`cycle_memory`)
                item.code = waiting
                item.done = False
                item.held_nodes = 0
            records = (kept, ids, cus, least)
            items = list(kept)  # the cycle's list: the carried one is not changed
        new = loaded.get(name)
        if new is not None:
            items += new[1]
            items.sort(key=_by_order)
            least = None
            if keep is not None and ordinary is not None:
                records = _records(items, new[1], ordinary)
        if least is None:
            # From the records' CU when they are the queue's items: those are not read again.
            if records is not None and len(records[0]) == len(items):
                least = _suffix(records[2])
                records = (records[0], records[1], records[2], least)
            else:
                least = _suffix([item.kind.min_cu for item in items])
        state.queue_pending[name] = items
        state.suffix_min_cu[name] = least
        if keep is not None and records is not None and records[0]:
            keep[name] = records
    return gone


def _kept_before(ids: list[int], left: dict[int, Workload]) -> tuple[bytearray, int]:
    """Of a queue's records whose keys are `ids`, those kept when the keys in `left` are
    dropped (every one of them is in `ids`: `_aligned` names a queue's carried workloads):
    per position up to just past the last dropped one, 1 if kept, and that end. The
    dropped are found one after another in C (`operator.indexOf` over the membership of
    each key, a bool singleton compared by identity), so the scan ends at the last of
    them and the records after it are not read: binds take a queue's first items (at
    4,000 nodes, next cycle: 1,751 dropped from 97 queues of 36,324 records, all within
    5,146 of them, each queue's up to its last dropped one)."""
    found = map(left.__contains__, ids)
    keep = bytearray()
    for _ in range(len(left)):
        keep += b"\x01" * indexOf(found, True)
        keep.append(0)
    return keep, len(keep)


def _without(records: QueueRecords, keep: Sequence[int], end: int) -> QueueRecords:
    """A queue's `records` without those before position `end` whose `keep` is false (every
    one from `end` on is kept). The items after the last one dropped keep their suffix
    minima: only those before it are found again."""
    kept, ids, cus, least = records
    kept = [*compress(kept, keep), *kept[end:]]  # `compress` stops at the end of `keep`
    ids = [*compress(ids, keep), *ids[end:]]
    cus = [*compress(cus, keep), *cus[end:]]
    if least is not None:
        after = len(least) - 1 - end  # the records after `end` (`least` ends with math.inf)
        least = _suffix(cus[: len(cus) - after], least[end:])
    return kept, ids, cus, least


def _records(
    items: list[Pending], new: list[Pending], ordinary: dict[int, int]
) -> QueueRecords | None:
    """A queue's records: its items of ordinary workloads (`new` ones in `ordinary`), in order."""
    unusual = {id(item) for item in new if id(item) not in ordinary}
    kept = [item for item in items if id(item) not in unusual] if unusual else list(items)
    if not kept:
        return None
    return (
        kept,
        [id(item.workload) >> 4 for item in kept],
        [item.kind.min_cu for item in kept],
        None,
    )


def _suffix(cus: Sequence[float], tail: Sequence[float] = (math.inf,)) -> list[float]:
    """suffix[i]: the least of cus[i:] (math.inf past the end), `cus` being the least CU of a
    queue's items in order, followed by `tail`: the suffix minima of the items after them (by
    default none); a loop, not `accumulate(..., min)`, which calls `min` through its argument
    parsing per item."""
    least = [math.inf] * len(cus)
    least += tail
    lowest = tail[0]
    for position in range(len(cus) - 1, -1, -1):
        cu = cus[position]
        if cu < lowest:  # noqa: PLR1730 (`min` parses its arguments: slower here)
            lowest = cu
        least[position] = lowest
    return least


def _unusual(
    state: CycleState, submitted: Workload, book: QueueBook | None
) -> tuple[Workload, Kind] | None:
    """A pending workload of another pool, of no known leaf queue (its reason written, None),
    or a compute-unit request (the gang that serves it this cycle, and that gang's kind)."""
    pool = state.pool.name
    if submitted.pool != pool:
        state.reason(submitted, PendingCode.OTHER_POOL, f"belongs to pool {submitted.pool}")
        return None
    if book is None:
        state.reason(
            submitted,
            PendingCode.UNKNOWN_QUEUE,
            f"queue {submitted.queue} is not a leaf queue of pool {pool}",
        )
        return None
    workload = submitted
    if submitted.compute_units > 0.0:
        workload = cu_request_for_cycle(state, submitted, book)
        state.cu_requests[submitted.uid] = submitted
    kind: Kind | None = kind_of(state, workload)
    if kind is not None and (kind.rejection is not None or not kind.types):
        kind = _usable_kind(state, submitted, workload, kind)
    return None if kind is None else (workload, kind)


def _usable_kind(
    state: CycleState, submitted: Workload, workload: Workload, kind: Kind
) -> Kind | None:
    """`kind` if the workload can be scheduled at all, else None with its `NEVER_FITS` reason
    written. A mix of types in one domain may serve what no single type can hold
    (`cycle_cu_mix`)."""
    if (
        kind.rejection is not None
        and submitted.mixed_gpu_types
        and rejection_in(submitted, state.gpu_types, state.pool_room) is None
    ):
        kind = dataclasses.replace(kind, rejection=None)
    if kind.rejection is not None:
        state.reason(workload, PendingCode.NEVER_FITS, kind.rejection.message)
        return None
    if not kind.types:
        state.reason(workload, PendingCode.NEVER_FITS, "no ready node has an adequate GPU type")
        return None
    return kind


def kind_of(state: CycleState, workload: Workload) -> Kind:
    """The shared facts of a workload's signature, memoised: pending work comes in few."""
    key = signature(workload)
    found = state.kinds.get(key)
    if found is None:
        shape = PodShape.of(workload)
        types = adequate_types(workload, state.gpu_types, tuple(state.capacity.by_type))
        cu_per_pod = tuple(workload.gpus_per_pod * state.weight(name) for name in types)
        min_cu = workload.gang_min_pods * cu_per_pod[0] if types else 0.0
        topology = workload.topology
        memo_key = MemoKey(
            gpus_per_pod=shape.gpus_per_pod,
            cpu_millicores=shape.cpu_millicores,
            memory_mib=shape.memory_mib,
            gang_min_pods=workload.gang_min_pods,
            topology=None if topology is None else (topology.level, topology.required),
            profile=shape.profile,
            one_per_node=shape.one_per_node,
        )
        # One object per placement problem and per trial, whatever the kind: allocation keys
        # its memos by their identity (`cycle_allocate`). A new kind is rare: the known are read.
        trial: tuple[object, ...] | None = None
        for other in state.kinds.values():
            if other.memo_key == memo_key:
                memo_key = other.memo_key
                if other.types == types:
                    trial = other.trial
                    break
        found = Kind(
            rejection_in(workload, state.gpu_types, state.pool_room),
            shape,
            types,
            cu_per_pod,
            min_cu,
            memo_key,
            trial or (types, memo_key),
        )
        state.kinds[key] = found
    return found


def cu_request_for_cycle(state: CycleState, workload: Workload, book: QueueBook) -> Workload:
    """The gang that serves a compute-unit request this cycle (`domain/cu_request.py`): the
    best option whose GPUs are free and that the queue's limits allow, counting down the GPUs
    taken by the requests resolved before it; else the best the pool could ever hold and the
    limits allow; else the best the pool could hold; else the best (which never fits)."""
    choices = cu_request.options(workload, state.gpu_types, tuple(state.capacity.by_type))
    if not choices:
        return workload  # never fits; `kind_of` says why
    free = state.cu_free_gpus
    if not free:
        free.update(state.capacity.free_whole_by_type)
    allowed: list[Workload] = []
    possible: list[Workload] = []
    for option in choices:
        candidate = cu_request.concrete(workload, option)
        if rejection_in(candidate, state.gpu_types, state.pool_room) is not None:
            continue
        possible.append(candidate)
        cu_per_pod = option.gpus_per_pod * state.weight(option.gpu_type)
        pods, _ = book.max_pods(
            cu_per_pod, option.gpus_per_pod, option.gpu_type, workload.preemptible, False
        )
        if pods < option.pods:
            continue  # a limit of the queue (or above it) rules this type out
        if free[option.gpu_type] >= option.gpus - 1e-9:
            free[option.gpu_type] -= option.gpus
            return candidate
        allowed.append(candidate)
    if not allowed and not possible and workload.mixed_gpu_types:
        # No single type ever holds it: the gang of the first option stands in (it never
        # places), and `cycle_cu_mix` looks for a mix.
        return cu_request.concrete(workload, choices[0])
    return (allowed or possible or [workload])[0]
