"""A hold equal in every field to one the cycle before made is recorded as that same object
(`decisions.held_pod`, `cycle_claims._last_holds`, `CarriedLoad.holds`): the result is the one a
cycle without carried records makes, and a record that differs in any one field is never taken
for it."""

from __future__ import annotations

import dataclasses
import random

import pytest
from test_claims_on_victim_node import _pool

from gpufair.domain import cycle
from gpufair.domain.cycle import run_cycle
from gpufair.domain.cycle_claims import honour_claims
from gpufair.domain.cycle_memory import CarriedLoad
from gpufair.domain.cycle_state import CycleState
from gpufair.domain.decisions import evicted_capacity, held_pod
from gpufair.domain.model import pod_binding
from gpufair.domain.snapshot import Reservation, ReservationKind


def _record(gpus: tuple[int, ...] = (3,), fraction: float = 1.0) -> Reservation:
    held = (pod_binding(0, "n7", gpus, fraction, None),)
    return evicted_capacity("w1", "A100", ("n7",), held)


def _variants(last: Reservation) -> list[Reservation]:
    """`last` with one field changed, each field (of the record and of its one binding) once."""
    binding = last.held[0]
    other_bindings = [
        dataclasses.replace(binding, pod_index=1),
        dataclasses.replace(binding, node="n8"),
        dataclasses.replace(binding, gpu_indices=(4,)),
        dataclasses.replace(binding, gpu_fraction=0.5),
        dataclasses.replace(binding, partition_start=0),
    ]
    return [
        dataclasses.replace(last, workload_uid="w2"),
        dataclasses.replace(last, kind=ReservationKind.GANG_WAIT),
        dataclasses.replace(last, gpu_type="H100"),
        dataclasses.replace(last, nodes=("n8",)),
        dataclasses.replace(last, nodes=("n7", "n8")),
        dataclasses.replace(last, held=()),
        dataclasses.replace(last, held=(binding, binding)),
        *(dataclasses.replace(last, held=(other,)) for other in other_bindings),
    ]


def test_an_equal_record_is_taken_and_any_other_is_not() -> None:
    last = _record()
    assert held_pod(last, "w1", "A100", "n7", (3,), 1.0) is last
    assert held_pod(None, "w1", "A100", "n7", (3,), 1.0) == last
    variants = _variants(last)
    assert len(variants) == 12 and all(variant != last for variant in variants)
    for variant in variants:
        made = held_pod(variant, "w1", "A100", "n7", (3,), 1.0)
        assert made is not variant and made == last, variant


@pytest.mark.parametrize("seed", range(12))
def test_a_cycle_given_the_last_holds_decides_as_one_without(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same snapshot twice with carried records: the second cycle's claims make the first
    one's holds again and record each of one pod as the first cycle's object (holds of gangs,
    and those of the evictions later phases make, are made anew), the result equal to a
    cycle's without records."""
    snap = _pool(seed)[0]
    carried = CarriedLoad()
    first = run_cycle(snap, carried)
    claims: list[int] = []  # how many reservations the claims phase left

    def counted(state: CycleState) -> None:
        honour_claims(state)
        claims.append(len(state.reservations))

    monkeypatch.setattr(cycle, "honour_claims", counted)
    second = run_cycle(snap, carried)
    assert second == run_cycle(snap)
    assert second.reservations == first.reservations
    before = {id(record) for record in first.reservations}
    taken = [record.workload_uid for record in second.reservations if id(record) in before]
    one_pod = [r.workload_uid for r in second.reservations[: claims[0]] if len(r.held) == 1]
    assert taken == one_pod and len(taken) >= 3, (seed, len(taken), len(one_pod))


@pytest.mark.parametrize("seed", range(12))
def test_a_hold_that_differs_in_one_field_is_made_anew(seed: int) -> None:
    """The last cycle's records each changed in one field (round the fields of `_variants`):
    none is taken, and the cycle still decides as one without records."""
    snap = _pool(seed)[0]
    carried = CarriedLoad()
    run_cycle(snap, carried)
    rng = random.Random(seed)
    changed = [
        rng.choice(_variants(record)) if len(record.held) == 1 else record
        for record in carried.holds
    ]
    carried.holds = changed
    second = run_cycle(snap, carried)
    assert second == run_cycle(snap)
    wrong = {id(record) for record in changed if record not in second.reservations}
    assert wrong and not any(id(record) in wrong for record in second.reservations)
