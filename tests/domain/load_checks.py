"""Rule checks on one cycle's result, written without the cycle's own books (DESIGN §4), for the
large random runs of `test_cycle_rules_under_load`.

GPU occupancy is rebuilt from bindings alone (`Occupancy`): whole GPUs, plain shares and
partition slices, CPU and memory per node. Whether a workload fits is answered exactly for what
can be counted without a search: one GPU type, no topology constraint, whole-GPU pods or plain
shares (`pods_that_fit`); other shapes are left out of the checks that need it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from collections.abc import Set as AbstractSet

from gpufair.domain.capacity import EPS
from gpufair.domain.model import Node, PodBinding, Workload
from gpufair.domain.partition_geometry import slice_mask
from gpufair.domain.policy import deserved_cu_with_types
from gpufair.domain.snapshot import (
    CycleResult,
    CycleSnapshot,
    EvictReason,
    ReservationKind,
)


class Occupancy:
    """Per ready node: each GPU's whole use, shared fraction and partition slices; CPU and
    memory used. `add` with sign -1 takes a workload's bindings away again."""

    def __init__(self, snap: CycleSnapshot) -> None:
        self.nodes: dict[str, Node] = {n.name: n for n in snap.nodes if n.ready}
        self.slices_of = {
            t.name: {p.name: p.memory_slices for p in t.partition_profiles} for t in snap.gpu_types
        }
        self.whole: dict[tuple[str, int], int] = defaultdict(int)
        self.shared: dict[tuple[str, int], float] = defaultdict(float)
        self.parts: dict[tuple[str, int], list[int]] = defaultdict(list)
        self.cpu: dict[str, int] = defaultdict(int)
        self.memory: dict[str, int] = defaultdict(int)

    def add(self, job: Workload, bindings: Iterable[PodBinding], sign: int = 1) -> None:
        for b in bindings:
            node = self.nodes.get(b.node)
            if node is None:
                continue
            self.cpu[b.node] += sign * job.cpu_millicores_per_pod
            self.memory[b.node] += sign * job.memory_mib_per_pod
            if job.partition_profile:
                width = self.slices_of[node.gpu_type][job.partition_profile]
                mask = slice_mask(b.partition_start or 0, width)
                masks = self.parts[(b.node, b.gpu_indices[0])]
                if sign > 0:
                    masks.append(mask)
                else:
                    masks.remove(mask)
            elif b.gpu_fraction < 1.0:
                self.shared[(b.node, b.gpu_indices[0])] += sign * b.gpu_fraction
            else:
                for gpu in b.gpu_indices:
                    self.whole[(b.node, gpu)] += sign

    def assert_fits(self) -> None:
        for (name, gpu), count in self.whole.items():
            assert 0 <= gpu < self.nodes[name].gpu_count, (name, gpu)
            busy = count + bool(self.parts[(name, gpu)]) + (self.shared[(name, gpu)] > EPS)
            assert count <= 1 and busy <= 1, ("whole GPU shared", name, gpu)
        for (name, gpu), used in self.shared.items():
            assert used <= 1.0 + EPS and not self.parts[(name, gpu)], ("share", name, gpu, used)
        for (name, gpu), masks in self.parts.items():
            seen = 0
            for mask in masks:
                assert not seen & mask, ("slices overlap", name, gpu)
                seen |= mask
        for name, used in self.cpu.items():
            assert used <= self.nodes[name].cpu_millicores, ("cpu", name)
        for name, used in self.memory.items():
            assert used <= self.nodes[name].memory_mib, ("memory", name)

    def free_gpus(self, node: Node) -> list[float]:
        """Each GPU's room: 1.0 untouched, 1 - shared for a plain-shared GPU, 0 otherwise."""
        room = []
        for gpu in range(node.gpu_count):
            key = (node.name, gpu)
            if self.whole.get(key, 0) or self.parts.get(key):
                room.append(0.0)
            else:
                room.append(max(0.0, 1.0 - self.shared.get(key, 0.0)))
        return room

    def pods_that_fit(
        self,
        job: Workload,
        gpu_type: str,
        skip: AbstractSet[str] = frozenset(),
        only: Iterable[str] | None = None,
    ) -> int:
        """How many pods of `job` (whole GPUs or a plain share, no topology) fit on the nodes
        of `gpu_type` (`only` those named) not in `skip`: exact, each node counted on its own."""
        total = 0
        chosen = self.nodes.values() if only is None else [self.nodes[n] for n in set(only)]
        for node in chosen:
            if node.gpu_type != gpu_type or node.name in skip:
                continue
            room = self.free_gpus(node)
            if job.gpus_per_pod >= 1.0:
                pods = sum(1 for r in room if r >= 1.0 - EPS) // round(job.gpus_per_pod)
            else:
                pods = sum(int((r + EPS) // job.gpus_per_pod) for r in room)
            if job.cpu_millicores_per_pod:
                free = node.cpu_millicores - self.cpu.get(node.name, 0)
                pods = min(pods, free // job.cpu_millicores_per_pod)
            if job.memory_mib_per_pod:
                free = node.memory_mib - self.memory.get(node.name, 0)
                pods = min(pods, free // job.memory_mib_per_pod)
            total += max(pods, 0)
        return total


def countable(job: Workload) -> bool:
    """A shape `pods_that_fit` answers exactly."""
    return (
        job.topology is None
        and not job.partition_profile
        and job.compute_units == 0.0
        and not job.pods_on_distinct_nodes
        and (
            (job.gpus_per_pod >= 1.0 and job.gpus_per_pod == round(job.gpus_per_pod))
            or 0.0 < job.gpus_per_pod < 1.0
        )
    )


def end_state(
    snap: CycleSnapshot, result: CycleResult, *, stopped: bool, holds: bool, without: str = ""
) -> Occupancy:
    """The pool once this cycle's binds start (`stopped`: and every victim has stopped), with
    the holds (`holds`) except the one of `without`."""
    occupancy = Occupancy(snap)
    pending = {w.uid: w for w in snap.pending}
    leaving = {e.workload_uid for e in result.evicts} | {e.victim_uid for e in snap.evicting}
    for a in snap.running:
        if not (stopped and a.workload.uid in leaving):
            occupancy.add(a.workload, a.bindings)
    for bind in result.binds:
        occupancy.add(pending[bind.workload_uid], bind.bindings)
    for r in result.reservations:
        if holds and r.kind is ReservationKind.EVICTED_CAPACITY and r.workload_uid != without:
            occupancy.add(pending[r.workload_uid], r.held)
    return occupancy


def check_capacity(snap: CycleSnapshot, result: CycleResult) -> None:
    end_state(snap, result, stopped=False, holds=False).assert_fits()
    end_state(snap, result, stopped=True, holds=True).assert_fits()


def check_reasons_and_evictions(snap: CycleSnapshot, result: CycleResult) -> None:
    bound = {b.workload_uid for b in result.binds}
    assert not bound & set(result.pending)
    assert bound | set(result.pending) == {w.uid for w in snap.pending}
    running = {a.workload.uid: a for a in snap.running}
    leaving = {e.victim_uid for e in snap.evicting}
    assert len({e.workload_uid for e in result.evicts}) == len(result.evicts)
    borrow_s = snap.pool.max_borrow_s
    for evict in result.evicts:
        victim = running[evict.workload_uid]
        assert victim.workload.preemptible, evict
        assert evict.workload_uid not in leaving, evict
        ran_s = snap.now_s - victim.started_at_s
        on_loan = evict.reason is EvictReason.RECLAIM and borrow_s is not None and ran_s >= borrow_s
        assert ran_s >= victim.workload.min_runtime_s or on_loan, evict
    pending = {w.uid: w for w in snap.pending}
    for bind in result.binds:
        job = pending[bind.workload_uid]
        assert job.preemptible or not bind.over_fair_share, bind


def _weights(snap: CycleSnapshot) -> dict[str, float]:
    return {t.name: t.compute_weight for t in snap.gpu_types}


def check_non_preemptible_within_deserved(snap: CycleSnapshot, result: CycleResult) -> None:
    """A queue that binds non-preemptible work holds at most its deserved quota of it."""
    weights = _weights(snap)
    pending = {w.uid: w for w in snap.pending}
    leaving = {e.victim_uid for e in snap.evicting}
    held: dict[str, float] = defaultdict(float)
    for a in snap.running:
        if not a.workload.preemptible and a.workload.uid not in leaving:
            held[a.workload.queue] += (
                a.workload.gpus_per_pod * len(a.bindings) * weights[a.gpu_type]
            )
    binders = set()
    for bind in result.binds:
        if not pending[bind.workload_uid].preemptible:
            held[bind.queue] += bind.cu
            binders.add(bind.queue)
    quotas = {q.name: q.quota(snap.pool.name) for q in snap.queues}
    claimants = {e.beneficiary_uid for e in snap.evicting}
    for name in binders:
        if any(b.workload_uid in claimants for b in result.binds if b.queue == name):
            continue
        assert held[name] <= deserved_cu_with_types(quotas[name], weights) + 1e-6, name
