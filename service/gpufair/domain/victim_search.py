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

Partitions (MIG-style instances, `partitions`): an option's room is what its prefix frees for
the pod's shape, released as the capacity releases it. A partition frees none of its GPU while
another partition stays there, whatever its fraction, and the whole GPU when it is the last
there; a partition's pod fits where its profile's slices are free. So a partition beside one
that stays is no room for a whole GPU or a plain share, and two 3g.40gb (6/7 of a GPU's CU) free
a whole GPU. Nodes whose GPUs hold or held partitions, and every node for a partition's pod, are
scored so (`exact_option`); their floors take a victim's CU per GPU its pods hold (a partition's
pod frees at most its GPU), and a partition's pod puts every node with victims in the heap at
its floor (its room is in slices: no walk). The tests made before a search count every GPU of a
node with partitions as one a victim may free. A type without partitions reads none of this,
and a pool whose GPU types offer no partition profile (the common pool: no node there ever holds
one) says so once per index (`VictimIndex.partitions`, `victim_index.offers_partitions`): its
searches and tests then read no node's slices and ask for no partitioned nodes at all.

Plain shares: a share's going frees its fraction of its GPU's use, and so the whole GPU when the
rest of the GPU is free or goes too (a 0.25 beside 0.75 free frees a whole GPU for a whole-GPU
pod). The tests made before a search for whole-GPU pods count, beside the free GPUs and the
victims' GPUs, the free part of the part-used GPUs of nodes with victims
(`victim_node_sets.room_beside_shares`), and a domain's test the free GPUs of its nodes with
victims and fewer GPUs free than a pod takes (`victim_node_sets._room_beside_victims`): each is
room a victim's going completes. A node's floor for whole-GPU pods takes a GPU that shares leave
wholly free at their CU per pod (`VictimIndex.floor`): the GPU is freed for that, not for their CU
per GPU held (a 0.25 share of 2.5 CU frees a GPU for 2.5 CU, not 10).

Node sets: the whole type, or with a topology constraint each domain that could hold the gang,
freest first; the cheapest of the first three domains that work wins (a bound on the work in a
pool of hundreds of domains), and a preferred topology falls back to the whole type.

Where each part lives: this module holds the entry (`select_victims`), the choice between
node sets and steps 2 and 3 (`_search`); `victim_greedy` step 1, the greedy by node, with the
speed it takes (its docstring); `victim_node_sets` the node sets worth searching and the tests
of room made before a search; `victim_index` what the greedy reads and keeps between searches.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from gpufair.domain.capacity import Capacity, Journal, PodUse
from gpufair.domain.model import PlacementStrategy
from gpufair.domain.placement import place
from gpufair.domain.placement_ask import Ask, Exclusion
from gpufair.domain.victim_greedy import Selection, greedy
from gpufair.domain.victim_index import Victim, VictimBudget, VictimIndex
from gpufair.domain.victim_node_sets import node_sets, pool_could_fit

__all__ = ["Selection", "Victim", "VictimBudget", "VictimIndex", "select_victims"]


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
    if ask.topology is None and not already_leaving:
        # The one node set is the whole type, and nothing is released around the search.
        if not pool_could_fit(capacity, ask, index):
            return None
        return _search(
            capacity,
            ask,
            strategy,
            exclusion,
            subset=None,
            index=index,
            budget=budget,
            leaving_nodes=(),
        )
    base = Journal()
    leaving_nodes: set[int] = set()  # nodes where capacity already leaving is released
    for uses in already_leaving:
        capacity.release(uses, base)
        for use in uses:
            leaving_nodes.add(use.node)
    try:
        best: Selection | None = None
        best_key: tuple[int, float] | None = None  # made when a second selection is found
        found_in_domains = 0
        for subset in node_sets(capacity, ask, exclusion, index):
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
                leaving_nodes=leaving_nodes,
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


def _search(
    capacity: Capacity,
    ask: Ask,
    strategy: PlacementStrategy,
    exclusion: Exclusion,
    *,
    subset: list[int] | None,
    index: VictimIndex,
    budget: VictimBudget,
    leaving_nodes: Collection[int],
) -> Selection | None:
    trial = Journal()
    try:
        found = greedy(
            capacity,
            ask,
            subset,
            index,
            exclusion,
            budget=budget,
            trial=trial,
            leaving_nodes=leaving_nodes,
            binpack=strategy is PlacementStrategy.BINPACK,
        )
        if found is None:
            return None
        if isinstance(found, Selection):
            return found  # one victim, the one pod's node: placed without releasing
        chosen = found.victims
        plan = place(capacity, ask, strategy, exclusion)
        if plan is None:
            return None
        if (len(chosen) == 1 and subset is None) or found.each_needed:
            # The search began because the type's free pods fell short: without its one
            # victim, nothing fits (a domain search may find room outside its domain instead).
            # Several, each needed (`Picked`): the pruning would keep them all.
            return Selection(tuple(chosen), plan)
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
