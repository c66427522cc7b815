"""Bound decisions that share a GPU with what runs: which ones to withdraw.

A batch system may start a workload on pods of its own choosing (the ledger takes what really
ran), also while a `Schedule` cycle of its pool is deciding; the cycle may then bind other work
onto those GPUs. Whoever commits second (the cycle, or the ingest of the start) looks at what
holds the pool's GPUs and withdraws the decisions that no longer fit, so that the ledger's view
never has more than a whole GPU in use on one GPU index.

The rule, deterministic whatever the order of commits:
- What runs is a fact and is never withdrawn: its pods are counted first, even where two runs
  overlap each other (the ledger keeps both).
- Bound decisions are then taken in the order they were decided (cycle id, then uid); a decision
  whose pods would push a GPU past one whole GPU (fractions add up) is withdrawn, and the GPUs it
  would have used stay free for the decisions after it. So the later decision always gives way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpufair.domain.model import PodBinding

# Fractions are stored as floats: 0.1 + 0.2 + 0.7 must still fit one GPU.
_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Holding:
    """A workload's pods on the pool's GPUs: a run, or a bound decision of cycle `cycle_id`."""

    uid: str
    pods: tuple[PodBinding, ...]
    cycle_id: int = 0


@dataclass(frozen=True, slots=True)
class Withdrawal:
    uid: str
    node: str
    gpu_index: int
    holders: tuple[str, ...]  # the workloads already on that GPU, runs first

    def message(self) -> str:
        return (
            f"GPU {self.gpu_index} of node {self.node} was taken by "
            f"{', '.join(self.holders)} (started by the batch system while this decision was "
            "made, or decided before it); the decision is withdrawn and the workload waits again"
        )


def _gpus(pods: Iterable[PodBinding]) -> Iterable[tuple[tuple[str, int], float]]:
    for pod in pods:
        for index in pod.gpu_indices:
            yield (pod.node, index), pod.gpu_fraction


def withdrawals(running: Sequence[Holding], bound: Sequence[Holding]) -> list[Withdrawal]:
    """The bound decisions to withdraw, in decision order (see the module's rule)."""
    used: dict[tuple[str, int], float] = {}
    holders: dict[tuple[str, int], list[str]] = {}
    for run in running:
        for gpu, fraction in _gpus(run.pods):
            used[gpu] = used.get(gpu, 0.0) + fraction
            holders.setdefault(gpu, []).append(run.uid)
    out: list[Withdrawal] = []
    running_uids = {r.uid for r in running}
    for decision in sorted(bound, key=lambda b: (b.cycle_id, b.uid)):
        if decision.uid in running_uids:
            continue  # started meanwhile: its run is what counts
        wanted: dict[tuple[str, int], float] = {}
        for gpu, fraction in _gpus(decision.pods):
            wanted[gpu] = wanted.get(gpu, 0.0) + fraction
        clash = next(
            (gpu for gpu in sorted(wanted) if used.get(gpu, 0.0) + wanted[gpu] > 1.0 + _EPSILON),
            None,
        )
        if clash is not None:
            out.append(Withdrawal(decision.uid, clash[0], clash[1], tuple(holders.get(clash, ()))))
            continue
        for gpu, fraction in wanted.items():
            used[gpu] = used.get(gpu, 0.0) + fraction
            holders.setdefault(gpu, []).append(decision.uid)
    return out


def holds_within(inner: Iterable[PodBinding], outer: Iterable[PodBinding]) -> bool:
    """Whether `inner` takes no share of any GPU beyond what `outer` takes of it: a run that
    starts within its own bound decision adds nothing the pool's holders did not count."""
    held: dict[tuple[str, int], float] = {}
    for gpu, fraction in _gpus(outer):
        held[gpu] = held.get(gpu, 0.0) + fraction
    taken: dict[tuple[str, int], float] = {}
    for gpu, fraction in _gpus(inner):
        taken[gpu] = taken.get(gpu, 0.0) + fraction
    return all(share <= held.get(gpu, 0.0) + _EPSILON for gpu, share in taken.items())
