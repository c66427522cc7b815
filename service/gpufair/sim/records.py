"""What a simulation records as it runs and hands back (`engine.simulate`): one `JobRecord` per
job, the timeline's rows (`TimelineRow`), each bind and eviction (`DecisionRow`), and at the end
each pool with its queues (`PoolRun`, `QueueRun`) in a `SimResult`. `metrics`, `outputs`,
`fairness` and the plots read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufair.domain.model import Allocation, Workload
from gpufair.sim.admission import RefusedJob
from gpufair.sim.jobspec import JobSpec
from gpufair.sim.scenario import Scenario


@dataclass(slots=True)
class JobRecord:
    """One job through the run."""

    spec: JobSpec
    remaining_s: float
    pending_since_s: float | None = None
    first_start_s: float | None = None
    end_s: float | None = None
    wait_s: float = 0.0
    evictions: int = 0
    lost_gpu_s: float = 0.0  # GPU-seconds of work evictions threw away (`on_evict: restart`)
    token: int = 0  # bumped at every start and stop, so stale completion events are ignored
    run_start_s: float = 0.0
    allocation: Allocation | None = None
    gpu_type: str = ""
    gpus: float = 0.0
    cu: float = 0.0
    # The GPUs of its last run per type, by type name: one entry unless a compute-unit request
    # mixed types, whose GPUs count each on its own type (as the ledger splits a run).
    gpus_by_type: tuple[tuple[str, float], ...] = ()
    started_as: str = ""  # the `DecisionRow.reason` of the bind that started its last run

    @property
    def workload(self) -> Workload:
        return self.spec.workload


@dataclass(frozen=True, slots=True)
class TimelineRow:
    time_s: float
    pool: str
    queue: str
    allocated_cu: float
    pending_cu: float
    fair_share_cu: float
    effective_weight: float
    usage_share: float
    usage_cu_s: float  # decayed usage (numerator of U')
    weight_share: float = 0.0  # W' of the latest recompute (0: the queue did not compete)


@dataclass(frozen=True, slots=True)
class DecisionRow:
    """One bind or eviction of a cycle (`events.csv`). `reason`: for a bind `within_share`,
    `beyond_share`, `claim:<eviction reason>` when it binds on capacity evicted for it, or `move`
    when a workload a defragmentation move stopped binds where the move sent it; for an eviction
    its `EvictReason` (`reclaim`, `preempt`, `defragment`, `entitlement`): the phase that decided
    it. `beneficiary` (and its queue): whom an eviction was made for.

    An eviction's chain back to what placed the victim, so that evictions one change causes can
    be told from those it does not (`bench/bench_defrag.py` counts them): `started_as`, the
    `reason` of the bind that started the run it was evicted from (`move`: a move put it there;
    `beyond_share`: work-conserving, the first reclaim takes); `ran_s`, how long that run lasted
    (the victim order prefers the most recently started, and `min_runtime_s` counts from there);
    `evicted_before`, how many times it was evicted earlier in the run (a workload evicted,
    bound again beyond its share and evicted again counts each time)."""

    time_s: float
    pool: str
    event: str  # "bind" or "evict"
    uid: str
    queue: str
    gpus: float
    cu: float
    reason: str
    beneficiary: str = ""
    beneficiary_queue: str = ""
    started_as: str = ""
    ran_s: float = 0.0
    evicted_before: int = 0


@dataclass(frozen=True, slots=True)
class QueueRun:
    """One queue of one pool after the run: its terms and its whole allocation history."""

    name: str
    parent: str | None
    is_leaf: bool
    deserved_cu: float
    over_quota_weight: float
    competed: bool  # took part in the over-quota division at some recompute
    changes: tuple[tuple[float, float], ...]  # (instant, CU held from then on)


@dataclass(frozen=True, slots=True)
class PoolRun:
    name: str
    k: float
    capacity_cu: float
    capacity_gpus: float
    queues: tuple[QueueRun, ...]  # tree pre-order
    gpu_changes: tuple[tuple[float, float], ...]  # (instant, GPUs allocated from then on)
    evictions: int
    idle_gpu_s_while_pending: float
    fragmented_gpus: tuple[float, ...]  # at each timeline sample
    cycles_run: int
    recomputes: int
    moves: int = 0  # evictions that were defragmentation moves (re-placed at once)
    moved_gpus: float = 0.0


@dataclass(frozen=True, slots=True)
class SimResult:
    scenario: Scenario
    pools: tuple[PoolRun, ...]
    jobs: tuple[JobRecord, ...]  # by submit time, then uid
    timeline: tuple[TimelineRow, ...]
    decisions: tuple[DecisionRow, ...] = ()  # in the order they were made
    refused: tuple[RefusedJob, ...] = ()  # jobs the service's submit checks refused, by arrival
