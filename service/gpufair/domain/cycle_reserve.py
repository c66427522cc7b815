"""Phase 4 of the cycle: long-waiting gangs get `GANG_WAIT` nodes (DESIGN §4.1).

A workload within its queue's fair share that has waited at least the pool's
`gang_reservation_after_s` and still does not fit gets the nodes that, emptied, would hold it
(one such workload per queue, the first in queue order): they keep taking work within fair share
but no more beyond-fair-share work, so small jobs cannot keep refilling the hole it needs.

The phase takes no capacity and only adds held nodes, so a hole not found for a gang's type,
shape and size is not found for the next such gang either (`_Ranking.no_hole`), and what a
group of nodes (a topology domain) offers a gang of one shape and size is read again only once
a node chosen there is held (`_Ranking.holes`).

Nor does it change a queue's book, so a queue's room in its share is the same for all its
waiters: a waiter whose gang that room cannot hold on any type (`cycle_reclaim.
least_cu_in_share`, the test `reserve_gang` makes first, type by type, through
`QueueBook.max_pods`) is passed over without a try, and a queue whose every trial that can
wait (`CycleState.short_trials`: only those leave `NO_CAPACITY`) is so refused is not read
(`_Shares`). In a pool whose queues grow with it most queues are such: at 4,000 nodes and 800
queues, steady, 5,256 of the 5,627 tries failed that test.
"""

from __future__ import annotations

import heapq
import math
from operator import attrgetter

from gpufair.domain.capacity import EPS, Capacity
from gpufair.domain.cycle_reclaim import least_cu_in_share
from gpufair.domain.cycle_state import CycleState, Pending
from gpufair.domain.placement_ask import PodShape
from gpufair.domain.placement_fit import pods_fit, pods_fit_empty
from gpufair.domain.queuebook import QueueBook
from gpufair.domain.snapshot import PendingCode, Reservation, ReservationKind


def reserve_for_long_waits(state: CycleState) -> None:
    after_s = state.pool.gang_reservation_after_s
    if after_s is None:
        return
    now_s = state.snapshot.now_s
    no_capacity = PendingCode.NO_CAPACITY

    def waits_long(item: Pending) -> bool:
        return (
            not item.done
            and item.code is no_capacity
            and now_s - item.workload.submit_time_s >= after_s
        )

    # The long waiters in queue order (`CycleState.in_queue_order`), read lazily: a queue's
    # items stop at its first reservation, so the phase does not walk every pending workload.
    ranking = _Ranking(state.capacity)
    shares = _Shares()
    pending = state.queue_pending
    trials_of = state.short_trials
    books = state.books
    for run in state.queue_runs(pending):
        if len(run) == 1:  # `waits_long` written out: the loop reads every item of a queue
            name = run[0]
            book = books[name]
            room = shares.room(book)
            if shares.refuses_all(room, trials_of.get(name)):
                continue
            for item in pending[name]:
                if (
                    not item.done
                    and item.code is no_capacity
                    and now_s - item.workload.submit_time_s >= after_s
                    and not shares.refuses(room, item)
                    and reserve_gang(state, item, ranking=ranking)
                ):
                    break
            continue
        served: set[str] = set()
        tied = (filter(waits_long, pending[name]) for name in run)
        for item in heapq.merge(*tied, key=attrgetter("order")):
            if (
                item.book.name not in served
                and not shares.refuses(shares.room(item.book), item)
                and reserve_gang(state, item, ranking=ranking)
            ):
                served.add(item.book.name)


class _Shares:
    """Whether a queue's room in its share refuses a waiter on every type, known before its
    try: `reserve_gang` asks `state.pods_allowed(item, type, within_share=True)` first, and
    `QueueBook.max_pods` caps within the share at floor((fair share - allocated + EPS) / CU per
    pod); a room below `least_cu_in_share` of the waiter's kind and gang minimum is below that
    on each type (the bound reclaim passes workloads over by). Books do not change in this
    phase, so a queue's room is read once."""

    def __init__(self) -> None:
        # `Pending.trial` → `least_cu_in_share` of its kind and gang minimum (one per trial:
        # the trial holds the types, GPUs per pod and gang minimum it reads), as met.
        self.least: dict[int, float] = {}

    @staticmethod
    def room(book: QueueBook) -> float:
        return book.fair_share_cu - book.allocated_cu + EPS

    def refuses(self, room: float, item: Pending) -> bool:
        trial = item.trial
        least = self.least.get(trial)
        if least is None:
            least = self.least[trial] = least_cu_in_share(item.kind, item.workload.gang_min_pods)
        return room < least

    def refuses_all(self, room: float, trials: set[int] | None) -> bool:
        """Whether `room` refuses every trial of `trials` (a queue's `short_trials`, which its
        waiters are all of); False while one of them has not been met yet, or for None."""
        if trials is None:
            return False
        least = self.least
        for trial in trials:
            found = least.get(trial)
            if found is None or not room < found:
                return False
        return True


class _Ranking:
    """The nodes of each GPU type freest first (most free GPUs, then index), computed once for
    the phase: this phase marks nodes but takes no capacity, so free GPUs do not change."""

    def __init__(self, capacity: Capacity) -> None:
        self._capacity = capacity
        self._ranked: dict[str, list[int]] = {}
        self._position: dict[str, dict[int, int]] = {}
        self._fits: dict[PodShape, dict[int, tuple[int, int]]] = {}
        self._domains: dict[tuple[str, str], list[list[int]]] = {}
        self._holes: dict[tuple[PodShape, int], dict[int, _Hole]] = {}
        self._alone: dict[str, list[list[int]]] = {}
        self._group_of: dict[int, dict[int, int]] = {}
        self._best: dict[tuple[PodShape, int, int], _Best] = {}
        # Holes not found: (GPU type, shape, pods, topology level). Held nodes only grow while
        # the phase runs and free capacity stays, so such a hole is not found later either.
        self.no_hole: set[tuple[object, ...]] = set()
        # The nodes `reserve_gang` held with this ranking, in order (`_fullest_hole` reads
        # what came since it last looked).
        self.held: list[int] = []

    def ranked(self, gpu_type: str) -> list[int]:
        found = self._ranked.get(gpu_type)
        if found is None:
            nodes = self._capacity.nodes
            free = {index: nodes[index].free_gpus() for index in self._capacity.by_type[gpu_type]}
            found = self._ranked[gpu_type] = sorted(free, key=lambda index: (-free[index], index))
            self._position[gpu_type] = {index: rank for rank, index in enumerate(found)}
        return found

    def domains(self, level: str, gpu_type: str) -> list[list[int]]:
        """The nodes of `gpu_type` in each topology domain of `level` (domains by name), each
        domain's freest first: sorted once for the phase, not once per gang."""
        key = (level, gpu_type)
        found = self._domains.get(key)
        if found is None:
            self.ranked(gpu_type)
            position = self._position[gpu_type].__getitem__
            members = self._capacity.domains(level).get(gpu_type, {})
            found = self._domains[key] = [
                sorted(nodes, key=position) for _, nodes in sorted(members.items())
            ]
        return found

    def alone(self, gpu_type: str) -> list[list[int]]:
        """The nodes of `gpu_type` as one group, freest first: the groups of a gang without a
        required topology level (one list per type, so `best` knows it again)."""
        found = self._alone.get(gpu_type)
        if found is None:
            found = self._alone[gpu_type] = [self.ranked(gpu_type)]
        return found

    def group_of(self, groups: list[list[int]]) -> dict[int, int]:
        """Per node of `groups` (one list of `domains` or `alone`), its group's position."""
        found = self._group_of.get(id(groups))
        if found is None:
            found = self._group_of[id(groups)] = {
                index: position for position, group in enumerate(groups) for index in group
            }
        return found

    def best(self, shape: PodShape, pods: int, groups: list[list[int]]) -> _Best | None:
        """What `_fullest_hole` last found over `groups` for `pods` pods of `shape`, if it
        looked before (kept by `_fullest_hole`)."""
        return self._best.get((shape, pods, id(groups)))

    def keep_best(self, shape: PodShape, pods: int, groups: list[list[int]], best: _Best) -> None:
        self._best[(shape, pods, id(groups))] = best

    def fits(self, shape: PodShape) -> dict[int, tuple[int, int]]:
        """Per node, pods of `shape` it holds emptied and now (at most the former), filled in
        as `_fullest_hole` reads nodes: neither changes while the phase runs."""
        found = self._fits.get(shape)
        if found is None:
            found = self._fits[shape] = {}
        return found

    def holes(self, shape: PodShape, pods: int) -> dict[int, _Hole]:
        """Per group of nodes (by the identity of its list), what `_fullest_hole` found there
        for `pods` pods of `shape`, kept while no node it chose is held since (`_hole_in`)."""
        key = (shape, pods)
        found = self._holes.get(key)
        if found is None:
            found = self._holes[key] = {}
        return found


# What a group of nodes offers a gang (`_hole_in`): its free GPUs and the nodes chosen there
# when they hold the gang (else None), and the nodes chosen (all with room, when they do not).
_Hole = tuple[tuple[float, list[int]] | None, list[int]]


class _Best:
    """What `_fullest_hole` found over one list of groups for a gang's shape and size: each
    group's hole, its free GPUs (minus infinity for none) and the count of held nodes, of the
    phase's (`_Ranking.held`) and in all, it read them under."""

    __slots__ = ("free", "held_total", "holes", "seen")

    def __init__(self, holes: list[_Hole], seen: int, held_total: int) -> None:
        self.holes = holes
        self.free = [-math.inf if hole[0] is None else hole[0][0] for hole in holes]
        self.seen = seen
        self.held_total = held_total


def reserve_gang(
    state: CycleState, item: Pending, within_share: bool = True, ranking: _Ranking | None = None
) -> bool:
    """Reserve for `item` the nodes that, emptied, would hold its gang; `within_share` False
    checks only its queue's limits (a gang admitted beyond its share, `cycle_entitlement`).
    `ranking` is the phase's node order, when the caller keeps one over several gangs."""
    if ranking is None:
        ranking = _Ranking(state.capacity)
    workload = item.workload
    pods = workload.gang_min_pods
    capacity = state.capacity
    for gpu_type in item.types:
        if state.pods_allowed(item, gpu_type, within_share) < pods:
            continue
        topology = workload.topology
        level = topology.level if topology is not None and topology.required else None
        failed = (gpu_type, item.shape, pods, level)
        if failed in ranking.no_hole:
            continue
        ordered = ranking.domains(level, gpu_type) if level is not None else ranking.alone(gpu_type)
        chosen = _fullest_hole(state, ordered, item.shape, pods, ranking)
        if chosen is None:
            ranking.no_hole.add(failed)
            continue
        state.gang_held.update(chosen)
        ranking.held += chosen
        item.held_nodes = len(chosen)
        state.reservations.append(
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
    state: CycleState, groups: list[list[int]], shape: PodShape, pods: int, ranking: _Ranking
) -> list[int] | None:
    """The nodes with the most free GPUs that, emptied, hold the gang; in the group (domain)
    where they are freest (the first such group). Most-free-first keeps the choice stable while
    the hole drains. Each group comes freest first; the nodes held already are not taken.

    A group's hole changes only when a node it chose is held (`_hole_in`), so what was found
    over `groups` for this shape and size is kept (`_Ranking.best`) and, at the next gang,
    only the groups of the nodes held since (`_Ranking.held`) are read again: one or two, not
    every domain of the level (at 4,000 nodes, next cycle: 198 reservations read 14,652
    holes before). Nodes held otherwise (not by `reserve_gang` with this ranking) since: every
    group is read as at the first look."""
    held = state.gang_held
    log = ranking.held
    found = ranking.best(shape, pods, groups)
    if found is None or found.held_total + len(log) - found.seen != len(held):
        holes = ranking.holes(shape, pods)
        read: list[_Hole] = []
        for group in groups:
            hole = holes.get(id(group))
            if hole is None or not held.isdisjoint(hole[1]):
                hole = holes[id(group)] = _hole_in(state, group, shape, pods, ranking)
            read.append(hole)
        found = _Best(read, len(log), len(held))
        ranking.keep_best(shape, pods, groups, found)
    elif found.seen < len(log):
        group_of = ranking.group_of(groups)
        touched = {group_of[index] for index in log[found.seen :] if index in group_of}
        for position in touched:
            if not held.isdisjoint(found.holes[position][1]):
                again = _hole_in(state, groups[position], shape, pods, ranking)
                found.holes[position] = again
                found.free[position] = -math.inf if again[0] is None else again[0][0]
        found.seen = len(log)
        found.held_total = len(held)
    most = max(found.free, default=-math.inf)
    if most == -math.inf:
        return None
    best = found.holes[found.free.index(most)][0]
    assert best is not None
    return best[1]


def _hole_in(
    state: CycleState, group: list[int], shape: PodShape, pods: int, ranking: _Ranking
) -> _Hole:
    """The freest nodes of `group` not held that, emptied, hold the gang, read in order as far
    as they go (usually a few nodes, not every node of the group). Nodes held later change
    it only if it chose one of them: the others come after them, or have no room."""
    nodes = state.capacity.nodes
    held = state.gang_held
    fits = ranking.fits(shape)
    chosen: list[int] = []
    room = 0
    free = 0.0
    for index in group:
        if index in held:
            continue
        found = fits.get(index)
        if found is None:
            node = nodes[index]
            size = pods_fit_empty(node, shape)
            found = fits[index] = (size, min(pods_fit(node, shape), size) if size > 0 else 0)
        size, now = found
        if size <= 0:
            continue
        chosen.append(index)
        room += size
        free += now
        if room >= pods:
            return (free, chosen), chosen
    return None, chosen
