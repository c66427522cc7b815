"""Small random pools of partitioned and plain GPUs, one workload that does not fit, and the
victims DESIGN §4.3-4.4 ask for, found by trying every set of candidates.

A case (`make_case`): 1-4 nodes of one partitionable type (A100 80GB, 10 CU a GPU), each GPU
holding whole-GPU pods, plain shares, MIG partitions (only `partitions=True`) or nothing; the
pods belong to jobs of one or two pods of four queues: the reclaimer `want`, two queues `v1`
and `v2` of random priority tiers, and a best-effort queue `be` (weight 0). Jobs have random
priority classes and starts, some are not preemptible, some have not run their `min_runtime_s`.
The fair shares leave `want` room for its workload and the other queues a random surplus.
One pending workload of `want`: whole GPUs, a plain share or (with partitions) a profile.

The reference (`reference`), the rules alone, none of the search's code:

- reclaim: candidates are preemptible work past `min_runtime_s` of the other queues; a queue
  gives at most its surplus (allocated - max(deserved, fair share)) in all;
- preemption (only when no reclaim set exists): `want`'s own preemptible work of a lower
  priority class past `min_runtime_s`;
- a set is feasible when the workload's gang fits once the set has stopped, counted GPU by GPU
  here (a GPU holds whole pods, shares or partitions; a partition takes the highest free start
  of its profile, `partition_geometry`);
- the set chosen is the feasible one with the lowest highest tier, then the fewest CU
  ("lower priority first", "the fewest CU"); with CU above zero it is minimal ("never evict more
  than needed").

`judge` compares a cycle's decisions with it and names what differs (`Verdict`).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from itertools import combinations

from gpufair.domain.cycle import run_cycle
from gpufair.domain.model import (
    Allocation,
    GpuType,
    Node,
    NodePool,
    PodBinding,
    Queue,
    QueueQuota,
    Workload,
)
from gpufair.domain.partition_geometry import MIG_80GB_PROFILES
from gpufair.domain.snapshot import (
    CycleResult,
    CycleSnapshot,
    EvictionInFlight,
    EvictReason,
    ReservationKind,
)

POOL = "main"
A100 = GpuType("a100-80gb", 80, 10, MIG_80GB_PROFILES)
CU_PER_GPU = 10.0
PROFILES = {p.name: p for p in MIG_80GB_PROFILES}
EPS = 1e-9
NOW = 1_000.0
WANT = "want"
OTHERS = ("v1", "v2", "be")
# Tiers as the cycle ranks victims: a queue's priority, best effort below every tier.
BEST_EFFORT_TIER = -(1 << 20)


@dataclass(frozen=True)
class Job:
    """A running job and what each of its pods holds: (node, GPU, share or mask, profile)."""

    uid: str
    queue: str
    priority_class: int
    started_at_s: float
    preemptible: bool
    min_runtime_s: float
    gpus_per_pod: float  # whole GPUs (1 or 2), a share, or a profile's fraction
    profile: str
    pods: tuple[tuple[int, tuple[int, ...], int], ...]  # (node, GPUs, slice start or -1)

    @property
    def cu(self) -> float:
        return self.gpus_per_pod * len(self.pods) * CU_PER_GPU


@dataclass
class Case:
    seed: int
    gpus: list[int]  # per node
    jobs: list[Job]
    pending: Workload
    priorities: dict[str, int]
    weights: dict[str, float]
    fair_share: dict[str, float]
    allocated: dict[str, float] = field(default_factory=dict)
    # Capacity already leaving (`make_leaving_case`; all empty in `make_case`'s cases).
    # `released`: jobs evicted earlier for the pending workload, counted free for it;
    # `leaving`: every job evicted earlier or earlier in the cycle (never a candidate again,
    # and, unless released, still holding its GPUs); `held`: capacity that work decided earlier
    # in the cycle took (binds, holds on evicted capacity), never a candidate;
    # `evicting`: the snapshot's evictions in flight, (victim, beneficiary);
    # `earlier`: a pending workload of the same queue decided before the judged one.
    released: frozenset[str] = frozenset()
    leaving: frozenset[str] = frozenset()
    held: tuple[Job, ...] = ()
    evicting: tuple[tuple[str, str | None], ...] = ()
    earlier: Workload | None = None

    def tier(self, queue: str) -> int:
        return BEST_EFFORT_TIER if self.weights[queue] <= 0 else self.priorities[queue]

    def snapshot(self) -> CycleSnapshot:
        nodes = [
            Node(f"n{i}", POOL, A100.name, count, 64_000, 512_000)
            for i, count in enumerate(self.gpus)
        ]
        queues = [
            Queue(
                name,
                quotas={
                    POOL: QueueQuota(
                        POOL, priority=self.priorities[name], over_quota_weight=self.weights[name]
                    )
                },
            )
            for name in (WANT, *OTHERS)
        ]
        running = []
        for job in self.jobs:
            workload = Workload(
                job.uid,
                job.queue,
                POOL,
                len(job.pods),
                job.gpus_per_pod,
                0.0,
                priority_class=job.priority_class,
                preemptible=job.preemptible,
                min_runtime_s=job.min_runtime_s,
                partition_profile=job.profile,
            )
            bindings = tuple(
                PodBinding(
                    position,
                    f"n{node}",
                    gpus,
                    min(job.gpus_per_pod, 1.0),
                    start if start >= 0 else None,
                )
                for position, (node, gpus, start) in enumerate(job.pods)
            )
            running.append(Allocation(workload, bindings, job.started_at_s, A100.name))
        return CycleSnapshot(
            pool=NodePool(POOL, gang_reservation_after_s=None),
            nodes=tuple(nodes),
            gpu_types=(A100,),
            queues=tuple(queues),
            fair_share_cu=dict(self.fair_share),
            running=tuple(running),
            pending=(self.pending,) if self.earlier is None else (self.earlier, self.pending),
            now_s=NOW,
            evicting=tuple(
                EvictionInFlight(victim, beneficiary) for victim, beneficiary in self.evicting
            ),
        )


def _mask(profile: str, start: int) -> int:
    return ((1 << PROFILES[profile].memory_slices) - 1) << start


def _free_starts(profile: str, occupied: int) -> list[int]:
    found = PROFILES[profile]
    return [s for s in found.starts if not _mask(profile, s) & occupied]


def make_case(seed: int, partitions: bool) -> Case:
    """A random case (see the module docstring); `partitions`: GPUs may hold MIG partitions and
    the workload may ask for one, else neither (the plain pools the search was made for)."""
    rng = random.Random(seed)
    gpus = [rng.choice((1, 1, 2, 2, 4)) for _ in range(rng.randint(1, 4))]
    # Pods by shape: (gpus per pod, profile) -> list of (node, GPUs, start).
    pods: list[tuple[float, str, tuple[int, tuple[int, ...], int]]] = []
    modes = ["whole", "share", "part", "part", "free"] if partitions else ["whole", "share", "free"]
    for node, count in enumerate(gpus):
        gpu = 0
        while gpu < count:
            mode = rng.choice(modes)
            if mode == "free" and rng.random() < 0.8:
                mode = "whole"  # mostly full pools
            if mode == "whole":
                if gpu + 1 < count and rng.random() < 0.3:
                    pods.append((2.0, "", (node, (gpu, gpu + 1), -1)))
                    gpu += 2
                    continue
                pods.append((1.0, "", (node, (gpu,), -1)))
            elif mode == "share":
                left = 1.0
                while left > EPS:
                    share = rng.choice([s for s in (0.5, 0.25) if s <= left + EPS])
                    if rng.random() < 0.1:
                        break  # a part left free
                    pods.append((share, "", (node, (gpu,), -1)))
                    left -= share
            elif mode == "part":
                occupied = 0
                for _ in range(rng.randint(1, 6)):
                    profile = rng.choice(sorted(PROFILES))
                    starts = _free_starts(profile, occupied)
                    if not starts:
                        continue
                    start = rng.choice(starts)
                    occupied |= _mask(profile, start)
                    fraction = PROFILES[profile].gpu_fraction
                    pods.append((fraction, profile, (node, (gpu,), start)))
            gpu += 1
    # Pods into jobs: most alone, some two of one shape together.
    rng.shuffle(pods)
    grouped: list[tuple[float, str, list[tuple[int, tuple[int, ...], int]]]] = []
    for gpus_per_pod, profile, pod in pods:
        if grouped and rng.random() < 0.25:
            last = grouped[-1]
            if last[0] == gpus_per_pod and last[1] == profile and len(last[2]) == 1:
                last[2].append(pod)
                continue
        grouped.append((gpus_per_pod, profile, [pod]))
    jobs = []
    for number, (gpus_per_pod, profile, where) in enumerate(grouped):
        jobs.append(
            Job(
                f"r{number}",
                rng.choice((WANT, *OTHERS, "v1", "v2")),
                rng.randrange(3),
                float(rng.randrange(0, 900, 10)),
                rng.random() < 0.85,
                5_000.0 if rng.random() < 0.1 else 0.0,
                gpus_per_pod,
                profile,
                tuple(where),
            )
        )
    shapes: list[tuple[float, str]] = [(1.0, ""), (2.0, ""), (0.5, ""), (0.25, "")]
    if partitions:
        shapes += [(PROFILES[p].gpu_fraction, p) for p in sorted(PROFILES)] * 2
    gpus_per_pod, profile = rng.choice(shapes)
    pending = Workload(
        "pending",
        WANT,
        POOL,
        rng.choice((1, 1, 1, 2)),
        gpus_per_pod,
        500.0,
        priority_class=rng.randrange(1, 4),
        partition_profile=profile,
    )
    allocated = {name: 0.0 for name in (WANT, *OTHERS)}
    for job in jobs:
        allocated[job.queue] += job.cu
    needed = pending.pods * gpus_per_pod * CU_PER_GPU
    fair_share = {WANT: allocated[WANT] + needed + rng.choice((0.0, 5.0, 50.0))}
    for name in OTHERS:
        fair_share[name] = round(allocated[name] * rng.choice((0.0, 0.3, 0.6, 1.0)), 3)
    priorities = {WANT: rng.randrange(2), "v1": rng.randrange(2), "v2": rng.randrange(2), "be": 0}
    weights = {WANT: 1.0, "v1": 1.0, "v2": 1.0, "be": 0.0}
    return Case(seed, gpus, jobs, pending, priorities, weights, fair_share, allocated)


# What one GPU holds: whole GPUs used, shares used, partition slices.
GpuState = tuple[int, float, int]


def _gpu_states(case: Case, gone: frozenset[str]) -> dict[tuple[int, int], GpuState]:
    states: dict[tuple[int, int], GpuState] = {
        (node, gpu): (0, 0.0, 0) for node, count in enumerate(case.gpus) for gpu in range(count)
    }
    if case.released:
        gone = gone | case.released
    for job in (*case.jobs, *case.held):
        if job.uid in gone:
            continue
        for node, gpus, start in job.pods:
            for gpu in gpus:
                whole, shared, slices = states[(node, gpu)]
                if job.profile:
                    slices |= _mask(job.profile, start)
                elif job.gpus_per_pod >= 1.0:
                    whole += 1
                else:
                    shared += job.gpus_per_pod
                states[(node, gpu)] = (whole, shared, slices)
    return states


def _partitions_fitting(profile: str, occupied: int) -> int:
    count = 0
    for start in sorted(PROFILES[profile].starts, reverse=True):  # highest free start first
        mask = _mask(profile, start)
        if not mask & occupied:
            occupied |= mask
            count += 1
    return count


def pods_fitting(case: Case, gone: frozenset[str]) -> int:
    """Pods of the pending workload's shape that fit once the jobs `gone` have stopped."""
    states = _gpu_states(case, gone)
    return sum(_node_pods(case, states, node) for node in range(len(case.gpus)))


def _node_pods(case: Case, states: dict[tuple[int, int], GpuState], node: int) -> int:
    """Pods of the pending workload's shape that fit on `node` with its GPUs as `states`."""
    job = case.pending
    here = [states[(node, gpu)] for gpu in range(case.gpus[node])]
    if job.partition_profile:  # on GPUs that hold nothing else
        return sum(
            _partitions_fitting(job.partition_profile, slices)
            for whole, shared, slices in here
            if not whole and shared <= EPS
        )
    if job.gpus_per_pod >= 1.0:  # on GPUs that hold nothing
        free = sum(
            1 for whole, shared, slices in here if not whole and not slices and shared <= EPS
        )
        return free // round(job.gpus_per_pod)
    share = job.gpus_per_pod  # beside other shares only
    return sum(
        int((1.0 - shared + EPS) / share)
        for whole, shared, slices in here
        if not whole and not slices and 1.0 - shared >= share - EPS
    )


def fits(case: Case, gone: frozenset[str]) -> bool:
    return pods_fitting(case, gone) >= case.pending.gang_min_pods


@dataclass(frozen=True)
class Choice:
    victims: frozenset[str]
    tier: int  # the highest tier among them
    cu: float


def _best(case: Case, candidates: list[Job], budget: dict[str, float] | None) -> Choice | None:
    """The feasible set of `candidates` with the lowest highest tier, then the fewest CU (each
    queue losing at most its `budget` when given); None when no set is feasible."""
    best: Choice | None = None
    for size in range(1, len(candidates) + 1):
        for chosen in combinations(candidates, size):
            cu = sum(job.cu for job in chosen)
            tier = max(case.tier(job.queue) for job in chosen)
            if best is not None and (tier, cu) >= (best.tier, best.cu - EPS):
                continue
            if budget is not None:
                lost: dict[str, float] = {}
                for job in chosen:
                    lost[job.queue] = lost.get(job.queue, 0.0) + job.cu
                if any(cu_lost > budget.get(q, 0.0) + EPS for q, cu_lost in lost.items()):
                    continue
            gone = frozenset(job.uid for job in chosen)
            if fits(case, gone):
                best = Choice(gone, tier, cu)
    return best


def reclaim_candidates(case: Case) -> tuple[list[Job], dict[str, float]]:
    surplus = {q: case.allocated[q] - case.fair_share[q] for q in OTHERS}
    found = [
        job
        for job in case.jobs
        if job.queue != WANT
        and job.uid not in case.leaving
        and job.preemptible
        and NOW - job.started_at_s >= job.min_runtime_s
        and job.cu <= surplus[job.queue] + EPS
    ]
    return found, surplus


def preempt_candidates(case: Case) -> list[Job]:
    return [
        job
        for job in case.jobs
        if job.queue == WANT
        and job.uid not in case.leaving
        and job.preemptible
        and NOW - job.started_at_s >= job.min_runtime_s
        and job.priority_class < case.pending.priority_class
    ]


def greedy(
    case: Case, candidates: list[Job], budget: dict[str, float] | None
) -> frozenset[str] | None:
    """The victims `victim_search` documents it picks, by that design alone: per node, the
    shortest prefix of its candidates in preference order (tier, priority class, most recent)
    that passes the budgets and lets one more pod fit there is an option, keyed by (its highest
    tier, CU per pod gained, its first victim's class and start, the node); the best option is
    taken until the gang fits, then the victims are put back, last chosen first, where the gang
    still fits without them. Rooms are counted GPU by GPU as in `reference`."""
    ordered = sorted(
        candidates,
        key=lambda job: (
            case.tier(job.queue),
            job.priority_class,
            -job.started_at_s,
            job.cu,
            job.uid,
        ),
    )
    nodes = range(len(case.gpus))
    on_node = {
        node: [job for job in ordered if any(p[0] == node for p in job.pods)] for node in nodes
    }
    left = dict(budget) if budget is not None else None
    need = case.pending.gang_min_pods
    gone: frozenset[str] = frozenset()
    chosen: list[Job] = []
    while True:
        states = _gpu_states(case, gone)
        now = {node: _node_pods(case, states, node) for node in nodes}
        if sum(now.values()) >= need:
            break
        best: tuple[tuple[int, float, int, float, int], list[Job]] | None = None
        for node in nodes:
            prefix: list[Job] = []
            spent: dict[str, float] = {}
            for job in on_node[node]:
                if job.uid in gone:
                    continue
                if left is not None:
                    queue = job.queue
                    if job.cu > left.get(queue, 0.0) - spent.get(queue, 0.0) + EPS:
                        continue
                    spent[queue] = spent.get(queue, 0.0) + job.cu
                prefix.append(job)
                trial = _gpu_states(case, gone | {j.uid for j in prefix})
                gained = _node_pods(case, trial, node) - now[node]
                if gained > 0:
                    cost = 0.0
                    for j in prefix:
                        cost += j.cu
                    key = (
                        max(case.tier(j.queue) for j in prefix),
                        cost / gained,
                        prefix[0].priority_class,
                        -prefix[0].started_at_s,
                        node,
                    )
                    if best is None or key < best[0]:
                        best = (key, prefix)
                    break
        if best is None:
            return None
        for job in best[1]:
            gone |= {job.uid}
            chosen.append(job)
            if left is not None:
                left[job.queue] = left.get(job.queue, 0.0) - job.cu
    for job in reversed(chosen):
        if len(chosen) > 1 and fits(case, gone - {job.uid}):
            gone -= {job.uid}
    return gone


@dataclass(frozen=True)
class Reference:
    reclaim: Choice | None
    preempt: Choice | None


def reference(case: Case, later: Case | None = None) -> Reference:
    """`later`: the case as preemption finds it, when decisions between the two phases changed
    it (`judge_leaving`); else `case`."""
    found, surplus = reclaim_candidates(case)
    reclaim = _best(case, found, surplus)
    later = later or case
    preempt = None if reclaim is not None else _best(later, preempt_candidates(later), None)
    return Reference(reclaim, preempt)


# What a comparison finds, worst first.
AGREES = "agrees"
TIE = "equal cost, other victims"
FITS_NOW = "fits now"
INFEASIBLE = "victims do not make it fit"
NEEDLESS = "needless victim"
MISSED = "missed feasible set"
WRONG_PHASE = "preempted where reclaim could"
TIER = "higher tier than needed"
COST = "more CU than needed"
NOT_A_CANDIDATE = "victim not a candidate"


@dataclass(frozen=True)
class Verdict:
    kind: str
    cycle: frozenset[str]
    reason: str  # "reclaim", "preempt" or ""
    best: Choice | None
    # The documented greedy's victims (`greedy`: reclaim's, else preemption's; empty when it
    # finds none), and whether the cycle evicted exactly those.
    designed: frozenset[str] = frozenset()
    as_designed: bool = True


def judge(case: Case, result: CycleResult | None = None, later: Case | None = None) -> Verdict:
    """The cycle's victims for `case.pending` against `reference` and `greedy`. `later`: the
    case as preemption finds it (`judge_leaving`), when it differs from reclaim's."""
    if result is None:
        result = run_cycle(case.snapshot())
    later = later or case
    evicts = [e for e in result.evicts if e.beneficiary_uid == case.pending.uid]
    chosen = frozenset(e.workload_uid for e in evicts)
    reasons = {e.reason for e in evicts}
    reason = "" if not reasons else "reclaim" if EvictReason.RECLAIM in reasons else "preempt"
    if fits(case, frozenset()):
        return Verdict(FITS_NOW, chosen, reason, None)
    verdict = _compare(case, later, result, chosen, reason)
    found, surplus = reclaim_candidates(case)
    designed = greedy(case, found, surplus)
    if designed is None:
        designed = greedy(later, preempt_candidates(later), None)
    designed = designed or frozenset()
    return Verdict(verdict.kind, chosen, reason, verdict.best, designed, chosen == designed)


def _compare(
    case: Case, later: Case, result: CycleResult, chosen: frozenset[str], reason: str
) -> Verdict:
    ref = reference(case, later)
    best = ref.reclaim or ref.preempt
    if reason == "preempt":
        case = later
    if not chosen:
        bound = any(b.workload_uid == case.pending.uid for b in result.binds)
        assert not bound, "bound though it does not fit"
        return Verdict(AGREES if best is None else MISSED, chosen, reason, best)
    if reason == "reclaim":
        allowed = {job.uid for job in reclaim_candidates(case)[0]}
    else:
        allowed = {job.uid for job in preempt_candidates(case)}
    if not chosen <= allowed:
        return Verdict(NOT_A_CANDIDATE, chosen, reason, best)
    if not fits(case, chosen):
        return Verdict(INFEASIBLE, chosen, reason, best)
    if any(fits(case, chosen - {uid}) for uid in chosen):
        return Verdict(NEEDLESS, chosen, reason, best)
    if reason == "preempt" and ref.reclaim is not None:
        return Verdict(WRONG_PHASE, chosen, reason, best)
    assert best is not None  # a feasible set exists: the cycle's
    jobs = {job.uid: job for job in case.jobs}
    tier = max(case.tier(jobs[uid].queue) for uid in chosen)
    cu = sum(jobs[uid].cu for uid in chosen)
    if tier > best.tier:
        return Verdict(TIER, chosen, reason, best)
    if cu > best.cu + EPS:
        return Verdict(COST, chosen, reason, best)
    return Verdict(AGREES if chosen == best.victims else TIE, chosen, reason, best)


def make_leaving_case(seed: int, partitions: bool) -> Case:
    """`make_case`'s pool with capacity already leaving: jobs evicted in earlier cycles for the
    pending workload (a gang of 1-3 pods whose earlier pods' victims are still stopping: the
    search counts them free, `select_victims`' `already_leaving`), jobs evicted for a workload
    gone since (they leave, still holding their GPUs), and often a second pending workload of
    the same queue and class, submitted earlier, decided before the judged one in each phase
    (its binds, evictions and holds are the capacity leaving earlier in the cycle)."""
    case = make_case(seed, partitions)
    rng = random.Random(1_000_003 * seed + 17)
    pending = case.pending
    pods = rng.choice((1, 2, 2, 3))
    pending = Workload(
        pending.uid,
        WANT,
        POOL,
        pods,
        pending.gpus_per_pod,
        500.0,
        priority_class=pending.priority_class,
        partition_profile=pending.partition_profile,
    )
    evicting: list[tuple[str, str | None]] = []
    released: set[str] = set()
    for job in case.jobs:
        if not job.preemptible:
            continue
        draw = rng.random()
        if draw < 0.25:
            evicting.append((job.uid, pending.uid))
            released.add(job.uid)
        elif draw < 0.35:
            evicting.append((job.uid, "stopped-since"))
    leaving = frozenset(uid for uid, _ in evicting)
    earlier = None
    if rng.random() < 0.5:
        gpus_per_pod, profile = rng.choice(
            [(1.0, ""), (0.5, ""), (0.25, "")]
            + ([(PROFILES[p].gpu_fraction, p) for p in sorted(PROFILES)] if partitions else [])
        )
        earlier = Workload(
            "earlier",
            WANT,
            POOL,
            1,
            gpus_per_pod,
            400.0,
            priority_class=pending.priority_class,
            partition_profile=profile,
        )
    allocated = {name: 0.0 for name in (WANT, *OTHERS)}
    for job in case.jobs:
        if job.uid not in leaving:
            allocated[job.queue] += job.cu
    needed = pending.pods * pending.gpus_per_pod * CU_PER_GPU
    if earlier is not None:
        needed += earlier.pods * earlier.gpus_per_pod * CU_PER_GPU
    fair_share = {WANT: allocated[WANT] + needed + rng.choice((0.0, 5.0, 50.0))}
    for name in OTHERS:
        fair_share[name] = round(allocated[name] * rng.choice((0.0, 0.3, 0.6, 1.0)), 3)
    return Case(
        seed,
        case.gpus,
        case.jobs,
        pending,
        case.priorities,
        case.weights,
        fair_share,
        allocated,
        released=frozenset(released),
        leaving=leaving,
        evicting=tuple(evicting),
        earlier=earlier,
    )


def _taken(case: Case, workload: Workload, bindings: Iterable[PodBinding]) -> list[Job]:
    """What `workload` takes with `bindings`, as jobs that are never candidates."""
    names = {f"n{i}": i for i in range(len(case.gpus))}
    taken = []
    for binding in bindings:
        start = binding.partition_start
        taken.append(
            Job(
                f"{workload.uid}-{binding.pod_index}",
                workload.queue,
                0,
                NOW,
                False,
                0.0,
                workload.gpus_per_pod if workload.gpus_per_pod >= 1.0 else binding.gpu_fraction,
                workload.partition_profile,
                (
                    (
                        names[binding.node],
                        tuple(binding.gpu_indices),
                        -1 if start is None else start,
                    ),
                ),
            )
        )
    return taken


def judge_leaving(case: Case) -> Verdict:
    """`judge` for `make_leaving_case`'s cases: the pending workload's victims against the
    reference and the documented greedy as the capacity stands when it is searched for. Its
    claim comes first in the cycle: if it fits with its own victims gone, it holds that (no
    victims). Else the earlier workload's bind or reclaim comes before its reclaim, and the
    earlier workload's preemption between its reclaim and its preemption: the cycle's
    decisions for the earlier workload are taken as given (the earlier workload is judged by
    nothing here), their victims leaving and what they hold taken."""
    result = run_cycle(case.snapshot())
    if fits(case, frozenset()) or case.earlier is None:
        return judge(case, result)
    uid = case.earlier.uid
    evicts = [e for e in result.evicts if e.beneficiary_uid == uid]
    taken: list[PodBinding] = []
    for bind in result.binds:
        if bind.workload_uid == uid:
            taken.extend(bind.bindings)
    for reservation in result.reservations:
        if reservation.workload_uid == uid and reservation.kind is ReservationKind.EVICTED_CAPACITY:
            taken.extend(reservation.held)
    preempted = any(e.reason is not EvictReason.RECLAIM for e in evicts)
    after = replace(
        case,
        leaving=case.leaving | {e.workload_uid for e in evicts},
        held=case.held + tuple(_taken(case, case.earlier, taken)),
        allocated=_less(case, {e.workload_uid for e in evicts}),
    )
    if preempted:  # after the judged workload's reclaim, before its preemption
        return judge(case, result, after)
    return judge(after, result)


def _less(case: Case, gone: set[str]) -> dict[str, float]:
    allocated = dict(case.allocated)
    for job in case.jobs:
        if job.uid in gone:
            allocated[job.queue] -= job.cu
    return allocated


# Cases with more candidates than this are not judged (the reference tries every subset).
MOST_CANDIDATES = 12


def judge_seeds(
    seeds: Iterable[int],
    make: Callable[[int, bool], Case],
    judged: Callable[[Case], Verdict],
    partitions: bool,
) -> tuple[Counter[str], list[tuple[int, Verdict]]]:
    """Each seed's case (`make`) with at most `MOST_CANDIDATES` candidates of either phase,
    judged (`judged`): the verdicts' count by kind, and the cases that deviate from the
    documented greedy. A verdict the rules forbid outright (a needless victim, a set that makes
    no room, a victim that is not a candidate) fails at once, naming its seed."""
    tally: Counter[str] = Counter()
    deviating = []
    for seed in seeds:
        case = make(seed, partitions)
        if (
            len(reclaim_candidates(case)[0]) > MOST_CANDIDATES
            or len(preempt_candidates(case)) > MOST_CANDIDATES
        ):
            continue
        verdict = judged(case)
        assert verdict.kind not in (NEEDLESS, INFEASIBLE, NOT_A_CANDIDATE), (seed, verdict)
        tally[verdict.kind] += 1
        if not verdict.as_designed:
            deviating.append((seed, verdict))
    return tally, deviating
