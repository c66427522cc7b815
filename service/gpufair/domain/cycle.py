"""The scheduling cycle of one pool: allocate → reclaim → preempt (DESIGN §4). Pure: a
`CycleSnapshot` in, a `CycleResult` out; `snapshot` documents both and the eviction semantics.

Phases, in order:

0. **Claims.** A pending workload that earlier evictions were made for (`evicting`) is served
   first: bound if it now fits on free capacity (whatever its share has become; limits still
   apply), otherwise the GPUs its victims will free stay held for it, GPU by GPU. The claim
   stands in the first cycle after the victims stopped too, and meanwhile they are not re-bound
   beyond their share (`cycle_claims`).
1. **Allocate within fair share.** Queues by priority tier (highest first), then lowest
   allocated/fair-share ratio, then the oldest next workload, then queue age; after each bind the
   queue's ratio is updated and it rejoins the order. Inside a queue: priority class (highest
   first), then submit time. A workload is admitted when its queue stays within its fair share
   (non-preemptible work also within deserved), within its limits, and the whole gang fits
   (`placement`). A queue is left for this pass once its remaining share is below the smallest
   CU any of its remaining workloads could take.
2. **Reclaim.** Workloads within their queue's share that did not fit, in the same queue order,
   evict preemptible work past `min_runtime_s` (or on loan past `max_borrow_s`) from queues
   above max(deserved, fair share), never pushing a victim queue below that floor or below a
   per-type guarantee, never leaving the reclaimer above a victim in allocated/fair-share ratio
   (`victim_search` picks the victims).
2b. **Reclaim for per-type guarantees** (§3.5): a queue below its guarantee for a GPU type takes
   that type from queues above their own guarantee for it, even within their CU share
   (`cycle_guarantee`).
3. **Preempt.** Inside one queue, pending work evicts preemptible work of lower priority class
   (also past `min_runtime_s`), if the queue ends within its fair share or does not grow.
3b. **Defragment** (pools with `max_moved_share_per_hour`): a gang within its share that waits
   although the pool's free GPUs would hold it, only scattered, gets room by moves: the fewest
   preemptible workloads evicted and re-placed elsewhere in the same decision (`cycle_defrag`;
   moves in flight are held and re-bound first, before the claims of phase 0).
3c. **Gang entitlement.** Per tier, a long-waiting preemptible gang of the most under-served
   queue (lowest U'/W', below W', within its share) that its share alone blocks is admitted
   beyond that share: bound, or by evicting beyond-share then over-quota work, or given a
   `GANG_WAIT` hole (`cycle_entitlement`; pool policy `gang_entitlement`).
4. **Long-waiting gangs** get `GANG_WAIT` nodes (see `snapshot`).
1b, 5b. **Mixed compute-unit requests.** After each allocate pass, a compute-unit request that
   allows mixed types and did not fit on one type may take a mix inside one topology domain
   (`cycle_cu_mix`); a mix that leaves pending single-type work the GPUs it waits for comes
   first (`cycle_contention`).
5. **Allocate beyond fair share (work-conserving).** What nobody within their share could use
   goes, in the same order, to any queue within its limits, except on `GANG_WAIT` nodes. Such binds
   are flagged `over_fair_share`; their queues sit above their share, so reclaim takes them first.
   Non-preemptible work never goes beyond the fair share. Exact ties are not decided by name.

Limits hold at every level of the queue tree (`CycleSnapshot.inner_queues`, `queuebook`), and
per-type guarantees count at their CU.

Each phase is its own module over one shared `CycleState` (`cycle_state`), filled from the
snapshot by `cycle_load`: `cycle_claims` (0), `cycle_allocate` (1 and 5), `cycle_reclaim` (2),
`cycle_guarantee` (2b), `cycle_preempt` (3), `cycle_entitlement` (3b), `cycle_reserve` (4);
reclaim, preempt and entitlement choose victims with `victim_search` and commit them with
`cycle_evict`. `run_cycle` is the one entry point.

CU of a workload = pods × gpus_per_pod × compute_weight of the type it lands on. Each candidate
type is checked against the queue's share with its own weight, cheapest type first (a type that
single-type pending work waits for comes last for work with other types: `cycle_contention`). Where one
number is needed before a type is chosen (the order's "can this queue still admit anything",
pending messages), the cheapest adequate type and the gang minimum are used: a lower bound.

Speed: free capacity is indexed by (GPU type, free GPUs), so a placement reads only buckets that
can hold a pod; a failed placement of a workload kind is remembered for the rest of the phase
(capacity only shrinks within a cycle, so a failure stays a failure), and so is a failed reclaim
and a claim that did not fit free capacity (whose hold, on a type with no room for one pod, is then
placed among the nodes its victims free, worked out without releasing them: `placement_release`);
while a queue's turn binds nothing, a workload of the trial (types and placement problem: kinds may
share one) and preemptibility of one that failed fails the same way and is not tried again (each
item carries that key, `Pending.trial`); facts shared by workloads of one signature (fit, adequate
types, CU) are computed once per signature, and pending messages once per trial; the gang
reservations rank each type's nodes once (they take no capacity); reclaim and preemption read few
nodes (see `victim_search`). Objects made per pod or per running workload (`PodUse`, `Ask`,
`Victim`) are named tuples or plain slotted classes: cheaper to build than frozen dataclasses.
Between cycles of a pool, the records loading makes per running allocation and per pending workload
are kept by the input object (`cycle_memory`), so the next cycle makes them only for the rows that
changed, and pending work is carried as whole queues in order (`cycle_load_pending`: no sort of
what was sorted); free capacity, victims and books' totals after the running work the last cycle
had too (same objects, same order) are copied, the rest (and the holds) built in the snapshot's
order, since placement's node order depends on it. The service and the simulator run a cycle with
the cyclic collector paused (`gc_tuning`). Decision records are filled as plain twins of their
frozen classes and then given the class (`decisions`, `record_fill`), and a queue's admission
answers are kept in its book until the book changes (`QueueBook.answers`).
`bench/cycle_equivalence.py` holds any change of this code to the same decisions as another
checkout's over the benchmark's pools.
"""

from __future__ import annotations

from gpufair.domain.cycle_allocate import allocate
from gpufair.domain.cycle_claims import honour_claims
from gpufair.domain.cycle_cu_mix import allocate_mixed
from gpufair.domain.cycle_defrag import defragment, honour_moves
from gpufair.domain.cycle_entitlement import admit_entitled_gangs
from gpufair.domain.cycle_guarantee import reclaim_for_guarantees
from gpufair.domain.cycle_load import load
from gpufair.domain.cycle_memory import CarriedLoad
from gpufair.domain.cycle_preempt import preempt
from gpufair.domain.cycle_reclaim import reclaim
from gpufair.domain.cycle_reserve import reserve_for_long_waits
from gpufair.domain.cycle_state import CycleState
from gpufair.domain.snapshot import CycleResult, CycleSnapshot


def run_cycle(snapshot: CycleSnapshot, carried: CarriedLoad | None = None) -> CycleResult:
    """One full scheduling cycle over `snapshot` (see the module docstring). `carried`: the
    records the last cycle of this pool loaded, reused for the input objects given again
    (`cycle_memory`), and this cycle's left in it; the result is the same with or without."""
    state = CycleState(snapshot, carried)
    load(state)
    honour_moves(state)
    honour_claims(state)
    allocate(state, within_share=True)
    allocate_mixed(state, within_share=True)
    reclaim(state)
    reclaim_for_guarantees(state)
    preempt(state)
    defragment(state)
    admit_entitled_gangs(state)
    reserve_for_long_waits(state)
    allocate(state, within_share=False)
    allocate_mixed(state, within_share=False)
    return state.result()
