"""Where MIG-style partitions may sit on one GPU: slice masks and the fitting rule.

A partitionable GPU's memory is cut into numbered slices (an A100 or H100 has 8 memory slices
and 7 compute slices). A partition profile covers `memory_slices` consecutive slices and may begin
only at one of its `starts`; an instance is therefore a bit mask over the GPU's slices, and a GPU's
occupancy is the OR of its instances' masks. An instance fits when its mask does not meet the
occupancy. Validity of combinations (which mixes of 1g/2g/3g/4g/7g a GPU may hold) follows from
the masks alone, given the real start positions:

| profile (A100 80GB) | compute | memory slices | starts | at most per GPU |
|---|---:|---:|---|---:|
| `1g.10gb` | 1/7 | 1 | 0-6 | 7 |
| `1g.20gb` | 1/7 | 2 | 0, 2, 4, 6 | 4 |
| `2g.20gb` | 2/7 | 2 | 0, 2, 4 | 3 |
| `3g.40gb` | 3/7 | 4 | 0, 4 | 2 |
| `4g.40gb` | 4/7 | 4 | 0 | 1 |
| `7g.80gb` | 1 | 8 | 0 | 1 |

So `4g.40gb` + `3g.40gb` fit (slices 0-3 and 4-7), two `3g.40gb` fit, and a `1g.10gb` at slice 0
rules out `4g.40gb` and `7g.80gb` until it ends. The H100 80GB has the same geometry.

**Which start.** An instance takes the *highest* free start it may use. Every profile may begin at
slice 0 and the large ones only there, so filling from the top keeps the low starts (the only
ones of `4g` and `7g`) free as long as possible. For one profile, taking starts from one end is
also the most instances a GPU can hold (equal-width intervals: greedy from one end is optimal).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpufair.domain.model import GpuType, PartitionProfile


@dataclass(frozen=True, slots=True)
class Geometry:
    """One profile's placements on one GPU type: a mask per allowed start, highest start first."""

    profile: str
    gpu_fraction: float
    memory_gib: float
    masks: tuple[int, ...]
    starts: tuple[int, ...]  # the start of each mask, same order
    per_empty_gpu: int  # instances an empty GPU holds
    # `count` by occupancy, filled as asked: a cycle sees few distinct occupancies.
    counts: dict[int, int] = field(default_factory=dict, compare=False, hash=False)

    def first_fit(self, occupied: int) -> int:
        """The mask of the instance to take on a GPU with slices `occupied`, or 0: none fits."""
        for mask in self.masks:
            if not mask & occupied:
                return mask
        return 0

    def count(self, occupied: int) -> int:
        """How many more instances fit on a GPU with slices `occupied`."""
        found = self.counts.get(occupied)
        if found is None:
            found = 0
            taken = occupied
            for mask in self.masks:
                if not mask & taken:
                    taken |= mask
                    found += 1
            self.counts[occupied] = found
        return found

    def mask_at(self, start: int) -> int:
        """The mask of the instance beginning at `start`; 0 when the profile may not begin there."""
        for position, begin in enumerate(self.starts):
            if begin == start:
                return self.masks[position]
        return 0


def slice_mask(start: int, width: int) -> int:
    """Slices `start` to `start + width - 1` as a bit mask."""
    return ((1 << width) - 1) << start


def start_of(mask: int) -> int:
    """The first slice of an instance's mask."""
    return (mask & -mask).bit_length() - 1


def geometry(profile: PartitionProfile) -> Geometry | None:
    """The placements of `profile`, or None when it declares no geometry."""
    if profile.memory_slices <= 0 or not profile.starts:
        return None
    starts = tuple(sorted(set(profile.starts), reverse=True))
    masks = tuple(slice_mask(start, profile.memory_slices) for start in starts)
    per_empty = 0
    occupied = 0
    for mask in masks:
        if not mask & occupied:
            occupied |= mask
            per_empty += 1
    return Geometry(
        profile.name, profile.gpu_fraction, profile.memory_gib, masks, starts, per_empty
    )


def geometries(gpu_types: Iterable[GpuType]) -> dict[str, dict[str, Geometry]]:
    """By GPU type, then profile name: the placeable profiles (those with geometry)."""
    found: dict[str, dict[str, Geometry]] = {}
    for gpu_type in gpu_types:
        for profile in gpu_type.partition_profiles:
            shape = geometry(profile)
            if shape is not None:
                found.setdefault(gpu_type.name, {})[profile.name] = shape
    return found


def profile_geometry(
    gpu_types: Mapping[str, GpuType], gpu_type: str, profile: str
) -> Geometry | None:
    """The geometry of `profile` on `gpu_type`, or None when the type does not offer it."""
    found = gpu_types.get(gpu_type)
    if found is None:
        return None
    for candidate in found.partition_profiles:
        if candidate.name == profile:
            return geometry(candidate)
    return None


def _profile(
    name: str, sevenths: int, memory_gib: float, width: int, starts: range
) -> PartitionProfile:
    return PartitionProfile(
        name, sevenths / 7 if sevenths < 7 else 1.0, memory_gib, width, tuple(starts)
    )


# The MIG profiles of an A100 80GB and an H100 80GB (identical geometry), for configs and tests.
MIG_80GB_PROFILES: tuple[PartitionProfile, ...] = (
    _profile("1g.10gb", 1, 10.0, 1, range(0, 7)),
    _profile("1g.20gb", 1, 20.0, 2, range(0, 8, 2)),
    _profile("2g.20gb", 2, 20.0, 2, range(0, 6, 2)),
    _profile("3g.40gb", 3, 40.0, 4, range(0, 8, 4)),
    _profile("4g.40gb", 4, 40.0, 4, range(0, 1)),
    _profile("7g.80gb", 7, 80.0, 8, range(0, 1)),
)
