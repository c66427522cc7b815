"""The pool's free whole GPUs per type (`Capacity.free_whole_by_type`) are what its free-GPU
buckets hold: per type, the sum over buckets `k` of `k` times the nodes in bucket `k`. The
preempt phase's room test (`cycle_preempt._room_short`) reads no bucket when the total is 0:
then every bucket from 1 GPU up is empty. Checked on random full pools through takes, releases
and a trial's restore."""

from __future__ import annotations

import random

from gpufair.domain.capacity import Capacity, Journal
from tests.domain.full_pools import TYPES, full_pool


def _in_buckets(capacity: Capacity, gpu_type: str) -> int:
    return sum(
        free * len(capacity.bucket(gpu_type, free))
        for free in range(1, capacity.max_gpus[gpu_type] + 1)
    )


def _check(capacity: Capacity) -> None:
    for gpu_type in TYPES:
        assert capacity.free_whole_by_type[gpu_type] == _in_buckets(capacity, gpu_type)


def test_free_whole_gpus_are_the_buckets_sum_through_changes() -> None:
    zero = 0
    for seed in range(20):
        rng = random.Random(7100 + seed)
        capacity, running = full_pool(rng)
        _check(capacity)
        zero += sum(capacity.free_whole_by_type[gpu_type] == 0 for gpu_type in TYPES)
        gone = rng.sample(running, len(running) // 4)
        for uses in gone[: len(gone) // 2]:
            capacity.release(uses)
            _check(capacity)
        journal = Journal()
        for uses in gone[len(gone) // 2 :]:
            capacity.release(uses, journal)
            _check(capacity)
        capacity.restore(journal)
        _check(capacity)
        for uses in gone[: len(gone) // 2]:
            capacity.take(uses)
            _check(capacity)
    # Of the 40 (pool, type) pairs, 34 start with no free GPU: the case the shortcut serves.
    assert zero == 34
