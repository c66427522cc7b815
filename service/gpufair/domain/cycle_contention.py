"""Which GPU type a workload that allows several takes first (DESIGN §4.2), when pending work
that can use only one type waits for that type's capacity.

Placement tries a workload's adequate types cheapest first (`Kind.types`). Alone, that rule lets
flexible work fill the cheapest type while work that can run only there starves: in the 15-day
Alibaba replay the T4 type (the cheapest) was full with 19 of its 29 jobs able to run on five or
six other types, g2 had 33 of its 112 GPUs in use, and 100 jobs that can use only T4 waited; every
queue was below its fair share, so nothing was reclaimed for them.

The rule: a workload whose adequate types are several does not take a type's capacity that
pending work of the pool which can use only that type is waiting for, while another of its types
may have room. Once per cycle, at the first allocate pass (`cycle_allocate`):

    exclusive_gpus[t] = Σ gang minimum × GPUs per pod, over the pending workloads of the pool
                        that can be placed and whose only adequate type is t

(a compute-unit request counts as the one-type gang chosen for it in the cycle, `cycle_load`),
and, for a try of a workload asking `g` GPUs (its pods × GPUs per pod) on type `t`:

    t is contended  ⇔  exclusive_gpus[t] > 0  and  free whole GPUs of t − g < exclusive_gpus[t]

(taking `g` there would leave less than the single-type work waits for). Its types are then tried
uncontended first, each group cheapest first (`type_order`): the cheapest type stays the first
choice wherever no such contention exists, and the order is the default one when nothing is
contended. It is an order, not a ban: when none of its uncontended types holds the gang, the
workload still takes the contended type (work-conserving), so no capacity stays idle for it.
A bind of single-type work in either allocate pass, or of a mix (below) whose one-type gang was
counted, lowers its type's figure by what it had added (`bound_exclusive`, `lower_exclusive`);
binds of others lower the free GPUs (`Capacity.free_whole_by_type`, kept by the capacity), so a
type stops being contended as soon as what is left covers the waiting work. Work the phases
between the passes (and the claims before the first) bind or hold is still counted: the figure
errs towards more demand, which only moves flexible work to other types with room.

**Mixed compute-unit requests** (`cycle_cu_mix`, after each allocate pass) follow the same rule
over a domain's GPUs: the domain's mix is first made from at most `uncontended_gpus` of each type
(what a take of the pool's free whole GPUs leaves uncontended), then from all its free GPUs; a
mix of the first kind wins over any of the second. The request's own one-type gang, where the
figure counted it, is not counted against it (`single_type_trials`).

The claims (`cycle_claims`) and reclaim (`cycle_reclaim`) still try a flexible workload's types
cheapest first. The rule fixes small pools there too (a flexible claim binds on the one free T4 a
T4-only job waits for while the g2 GPU freed for it stays idle; flexible work evicts the one T4
job, which the T4-only job then cannot), but not the Alibaba replay (classic, 15 days, seeds 11,
12, 13): with it in both phases, flexible jobs waited 0.32 / 0.52 / 0.32 h on average before and
0.51 / 0.45 / 0.58 h after, while T4-only jobs finished 34 more, 24 fewer and 15 more of 1,291;
in reclaim alone, counting only single-type work that wants reclaim itself, 0.38 / 0.51 / 0.50 h
and 16 / 15 / 36 more. In reclaim the free GPUs are none, so any type with single-type demand is
contended; in the benchmark's 1,000-node pools reclaim then held capacity for 0.2 % to 1.4 %
fewer workloads. Not applied there until a form of it gives a better outcome.

What counts is demand, not admission: single-type work counts whether or not its queue's share or
limits let it bind in this pass, so flexible work leaves it the capacity for the pass beyond the
share and for the next cycles. Free GPUs are whole ones (shared GPUs' free fractions are not
counted): the figure is a lower bound of the room, as a fragmented type holds less than its sum.
A flexible workload moved to a pricier type costs its queue that type's CU, as any bind there.
The cost is at most one pass over the pending work per cycle, none when no kind has a single
type: the workloads are counted by their trial numbers at C speed, a kind's figure read once,
and the count stops once each type's figure reaches what the type could hold now
(`exclusive_demand`; 2 of 200 queues read in the benchmark's 1,000-node pools); and, only while
some type has such demand, a few look-ups per try of a workload with several types, and per
domain of a mixed request.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from operator import attrgetter

from gpufair.domain.capacity import EPS, Capacity
from gpufair.domain.cycle_state import Kind, Pending


def exclusive_demand(
    queues: Iterable[list[Pending]], kinds: Iterable[Kind], capacity: Capacity
) -> dict[str, float]:
    """Per GPU type, the GPUs (gang minimum) that the pending workloads in `queues` whose only
    adequate type it is, and which can be placed, wait for; types without such work are absent.
    `kinds`: every kind of those workloads (`CycleState.kinds`). A kind's figure is the same for
    all its workloads, so the workloads are only counted by their trial numbers
    (`Pending.trial`, at C speed), and not at all when no kind has a single type.

    Exact up to a type's room (`_room`); counting stops once every type has at least that much
    (the queues are read in runs of 1, 2, 4, ... ): from there a type is contended for any try
    (free − g < room ≤ figure) and stays so for the cycle whatever is bound, so more changes
    nothing. A single-type bind lowers the figure by its gang minimum g_min and the free whole
    GPUs by what it opened, at least g_min, except for shares on GPUs already in part used at
    the start, which the room counts whole; other binds only lower the free GPUs."""
    per_trial = single_type_trials(kinds)
    demand: dict[str, float] = {}
    if not per_trial:
        return demand
    room = {gpu_type: _room(capacity, gpu_type) for gpu_type, _ in per_trial.values()}
    lists = list(queues)
    counts: Counter[int] = Counter()
    trial_of = attrgetter("trial")
    start, run = 0, 1
    while start < len(lists):
        for items in lists[start : start + run]:
            counts.update(map(trial_of, items))
        start, run = start + run, 2 * run
        for trial, count in counts.items():
            found = per_trial.get(trial)
            if found is not None:
                gpu_type, gpus = found
                demand[gpu_type] = demand.get(gpu_type, 0.0) + count * gpus
        counts.clear()
        if all(demand.get(gpu_type, 0.0) >= most for gpu_type, most in room.items()):
            break
    return demand


def single_type_trials(kinds: Iterable[Kind]) -> dict[int, tuple[str, float]]:
    """The trial numbers (`Pending.trial`) `exclusive_demand` counts, each with its type and
    gang minimum GPUs: those of the kinds with one adequate type that can be placed."""
    per_trial: dict[int, tuple[str, float]] = {}
    for kind in kinds:
        if len(kind.types) == 1 and kind.rejection is None:
            gpus = kind.shape.gpus_per_pod * kind.memo_key.gang_min_pods
            for trial in kind.trial_keys:
                per_trial[trial] = (kind.types[0], gpus)
    return per_trial


def _room(capacity: Capacity, gpu_type: str) -> float:
    """An upper bound of the GPUs of `gpu_type` anything could take now: its free whole GPUs,
    and every GPU of its nodes with a GPU in part used or partitioned."""
    nodes = capacity.nodes
    touched = capacity.partial_nodes(gpu_type).keys() | capacity.partitioned_nodes(gpu_type).keys()
    return capacity.free_whole_by_type.get(gpu_type, 0) + sum(
        nodes[index].gpu_count for index in touched
    )


def type_order(
    types: tuple[str, ...],
    gpus: float,
    exclusive_gpus: Mapping[str, float],
    free_whole: Mapping[str, int],
) -> tuple[str, ...]:
    """`types` (cheapest first) with the contended ones for a workload asking `gpus` GPUs moved
    behind the others, each group in its order; `types` itself when none is contended."""
    contended: list[str] = []
    for gpu_type in types:
        waiting = exclusive_gpus.get(gpu_type)
        if waiting is not None and free_whole.get(gpu_type, 0) - gpus < waiting - EPS:
            contended.append(gpu_type)
    if not contended or len(contended) == len(types):
        return types
    return tuple([t for t in types if t not in contended] + contended)


def uncontended_gpus(
    gpu_type: str,
    exclusive_gpus: Mapping[str, float],
    free_whole: Mapping[str, int],
    own: float = 0.0,
) -> int | None:
    """The most whole GPUs of `gpu_type` a take may have and leave the type uncontended (as
    `type_order` reads it: free whole GPUs − take ≥ figure; 0 when even one GPU would not); None
    when no single-type work waits for the type. `own`: what the taker itself added to the
    type's figure, not counted against it."""
    waiting = exclusive_gpus.get(gpu_type)
    if waiting is None:
        return None
    waiting -= own
    if waiting <= EPS:
        return None
    return max(0, math.floor(free_whole.get(gpu_type, 0) - waiting + EPS))


def bound_exclusive(exclusive_gpus: dict[str, float], item: Pending) -> None:
    """A bind of `item`: if it was single-type work, its type's figure loses what it added."""
    types = item.kind.types
    if len(types) == 1:
        workload = item.workload
        lower_exclusive(exclusive_gpus, types[0], workload.gang_min_pods * workload.gpus_per_pod)


def lower_exclusive(exclusive_gpus: dict[str, float], gpu_type: str, gpus: float) -> None:
    """`gpu_type`'s figure less `gpus` GPUs no longer waiting; gone at 0."""
    waiting = exclusive_gpus.get(gpu_type)
    if waiting is None:
        return
    left = waiting - gpus
    if left > EPS:
        exclusive_gpus[gpu_type] = left
    else:
        del exclusive_gpus[gpu_type]
