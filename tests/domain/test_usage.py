"""Decayed usage integrals: closed forms against brute-force numerical integration."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from fairshare_support import A100, POOL, queue
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufair.domain.errors import InvalidInputError
from gpufair.domain.model import FairSharePolicy, UsageBasis, WindowKind
from gpufair.domain.usage import (
    Segment,
    decayed_integral,
    decayed_segment_integral,
    step_pieces,
    usage_inputs,
    window_bounds,
)

EXAMPLES = settings(max_examples=150, deadline=None)
REL = 1e-9
NODES, NODE_WEIGHTS = np.polynomial.legendre.leggauss(16)

# Times on a quarter-second grid, so window boundaries computed two ways agree exactly.
instants = st.integers(-400, 400).map(lambda q: q / 4)
durations = st.integers(1, 400).map(lambda q: q / 4)


def _window(now_s: float, policy: FairSharePolicy) -> tuple[float, float]:
    """The window, derived independently of `window_bounds` (floor division, not modulo)."""
    if policy.window_kind == WindowKind.SLIDING:
        return now_s - policy.window_s, now_s
    if policy.window_kind == WindowKind.TUMBLING:
        periods = math.floor((now_s - policy.window_anchor_unix_s) / policy.window_s)
        return policy.window_anchor_unix_s + periods * policy.window_s, now_s
    return -math.inf, now_s


def brute_force(
    value_at: Callable[[np.ndarray], np.ndarray],
    edges: Sequence[float],
    now_s: float,
    policy: FairSharePolicy,
) -> float:
    """Gauss–Legendre quadrature of value(t) · decay(t) between consecutive edges.

    `value_at` is evaluated pointwise; `edges` are where it may jump (so every sub-interval is
    smooth). Sub-intervals longer than a quarter half-life are cut so the quadrature is exact to
    far below the tolerance.
    """
    lo_s, hi_s = _window(now_s, policy)
    points = sorted({min(max(e, lo_s), hi_s) for e in edges if math.isfinite(e)} | {hi_s})
    if math.isfinite(lo_s):
        points = sorted(set(points) | {lo_s})
    total = 0.0
    for a, b in itertools.pairwise(points):
        if b <= a or a < lo_s or b > hi_s:
            continue
        pieces = 1
        if policy.half_life_s is not None:
            pieces = max(1, math.ceil((b - a) / (policy.half_life_s / 4)))
        cuts = np.linspace(a, b, pieces + 1)
        for c0, c1 in itertools.pairwise(cuts):
            t = (c1 - c0) / 2 * NODES + (c0 + c1) / 2
            weight = np.ones_like(t)
            if policy.half_life_s is not None:
                weight = np.exp2(-(now_s - t) / policy.half_life_s)
            total += float(np.sum(NODE_WEIGHTS * value_at(t) * weight) * (c1 - c0) / 2)
    return total


def _value_of(segments: Sequence[Segment]) -> Callable[[np.ndarray], np.ndarray]:
    def value_at(t: np.ndarray) -> np.ndarray:
        total = np.zeros_like(t)
        for s in segments:
            total += np.where((t >= s.start_s) & (t < s.end_s), s.value, 0.0)
        return total

    return value_at


def _edges(segments: Sequence[Segment]) -> list[float]:
    return [e for s in segments for e in (s.start_s, s.end_s)]


@st.composite
def policies(draw: st.DrawFn) -> FairSharePolicy:
    kind = draw(st.sampled_from(list(WindowKind)))
    window_s = draw(durations) + 1.0
    half_life_s = draw(st.none() | st.integers(1, 40).map(lambda q: q / 2))
    if half_life_s is not None and kind != WindowKind.NONE:
        window_s = max(window_s, half_life_s)
    return FairSharePolicy(
        window_kind=kind,
        window_s=window_s,
        window_anchor_unix_s=draw(instants),
        half_life_s=half_life_s,
    )


@st.composite
def timelines(draw: st.DrawFn, max_segments: int = 6) -> list[Segment]:
    segments = []
    for _ in range(draw(st.integers(0, max_segments))):
        start_s = draw(instants)
        segments.append(Segment(start_s, start_s + draw(durations), float(draw(st.integers(0, 9)))))
    return segments


def _close(actual: float, expected: float, scale: float) -> bool:
    # Relative 1e-9, with an absolute floor of 1e-9 of the integral's scale for zero results.
    return math.isclose(actual, expected, rel_tol=REL, abs_tol=REL * scale)


@EXAMPLES
@given(timelines(), policies(), instants)
def test_decayed_integral_equals_numerical_integration(
    segments: list[Segment], policy: FairSharePolicy, now_s: float
) -> None:
    actual = decayed_integral(segments, now_s, policy)
    expected = brute_force(_value_of(segments), _edges(segments), now_s, policy)
    scale = sum(s.value * (s.end_s - s.start_s) for s in segments) + 1.0
    assert _close(actual, expected, scale)


@pytest.mark.parametrize("half_life_s", [None, 3600.0])
@pytest.mark.parametrize("kind", list(WindowKind))
def test_intervals_crossing_window_edges_count_only_inside(
    kind: WindowKind, half_life_s: float | None
) -> None:
    policy = FairSharePolicy(
        window_kind=kind, window_s=86400.0, window_anchor_unix_s=3600.0, half_life_s=half_life_s
    )
    now_s = 10 * 86400.0 + 7200.0
    segments = [
        Segment(now_s - 90000.0, now_s - 80000.0, 3.0),  # crosses the sliding edge
        Segment(now_s - 7200.0, now_s - 1800.0, 5.0),  # crosses the tumbling boundary
        Segment(now_s - 600.0, math.inf, 2.0),  # still open
    ]
    actual = decayed_integral(segments, now_s, policy)
    finite = [Segment(s.start_s, min(s.end_s, now_s), s.value) for s in segments]
    expected = brute_force(_value_of(finite), _edges(finite), now_s, policy)
    assert actual == pytest.approx(expected, rel=REL)


def test_segment_ending_now_of_one_half_life_is_worth_half_over_ln2() -> None:
    half_life_s = 3600.0
    integral = decayed_segment_integral(0.0, half_life_s, 2.0, half_life_s, half_life_s)
    assert integral == pytest.approx(2.0 * half_life_s / (2 * math.log(2)), rel=1e-15)


def test_segment_without_half_life_is_value_times_length() -> None:
    assert decayed_segment_integral(10.0, 70.0, 3.0, 1000.0, None) == 180.0


def test_tiny_segment_long_ago_keeps_full_relative_precision() -> None:
    half_life_s = 86400.0
    integral = decayed_segment_integral(0.0, 1e-3, 1.0, 30 * half_life_s, half_life_s)
    assert integral == pytest.approx(1e-3 * 2.0**-30, rel=1e-9)


def test_segment_ending_before_it_starts_is_rejected() -> None:
    with pytest.raises(ValueError, match="ends before"):
        decayed_segment_integral(5.0, 4.0, 1.0, 10.0, None)


def test_tumbling_window_restarts_at_each_boundary() -> None:
    policy = FairSharePolicy(
        window_kind=WindowKind.TUMBLING, window_s=100.0, window_anchor_unix_s=1000.0
    )
    assert window_bounds(1250.0, policy) == (1200.0, 1250.0)
    assert window_bounds(1300.0, policy) == (1300.0, 1300.0)  # a boundary: nothing yet
    assert window_bounds(950.0, policy) == (900.0, 950.0)  # before the anchor too
    assert decayed_integral([Segment(1100.0, 1300.0, 1.0)], 1300.0, policy) == 0.0


def test_sliding_and_unbounded_windows() -> None:
    assert window_bounds(500.0, FairSharePolicy(window_s=100.0)) == (400.0, 500.0)
    unbounded = FairSharePolicy(window_kind=WindowKind.NONE, half_life_s=10.0)
    assert window_bounds(500.0, unbounded) == (-math.inf, 500.0)
    # All history counts, decayed: an open-ended past reaching now is worth h / ln 2 per CU.
    assert decayed_integral([Segment(-math.inf, 500.0, 1.0)], 500.0, unbounded) == pytest.approx(
        10.0 / math.log(2)
    )


def test_step_pieces_add_overlaps_and_clip_to_the_window() -> None:
    pieces = step_pieces([(0.0, 10.0, 1.0), (5.0, 15.0, 2.0), (20.0, 30.0, 4.0)], 2.0, 25.0)
    assert pieces == [(2.0, 5.0, 1.0), (5.0, 10.0, 3.0), (10.0, 15.0, 2.0), (20.0, 25.0, 4.0)]


def test_over_quota_usage_clamps_the_sum_not_each_workload() -> None:
    # Two 6-CU workloads overlap for 10 s in a queue deserving 10 CU: 2 CU over for 10 s.
    # Clamping each workload alone would find no over-quota usage at all.
    policy = FairSharePolicy(window_s=1000.0)
    usage = usage_inputs(
        pool=POOL,
        policy=policy,
        queues=[queue("a", deserved_cu=10.0)],
        gpu_types={"a100": A100},
        leaf_allocations={"a": [Segment(0.0, 20.0, 6.0), Segment(10.0, 30.0, 6.0)]},
        capacity=[Segment(0.0, 100.0, 20.0)],
        now_s=100.0,
    )
    assert usage.usage_cu_s["a"] == pytest.approx(20.0)
    assert usage.group_capacity_cu_s[None] == pytest.approx(1000.0)


def test_allocation_given_for_an_inner_queue_is_rejected() -> None:
    with pytest.raises(InvalidInputError):
        usage_inputs(
            pool=POOL,
            policy=FairSharePolicy(),
            queues=[queue("dept"), queue("team", parent="dept")],
            gpu_types={"a100": A100},
            leaf_allocations={"dept": [Segment(0.0, 1.0, 1.0)]},
            capacity=[],
            now_s=1.0,
        )


TREE = [
    queue("d0", deserved_cu=6.0),
    queue("d0a", parent="d0", deserved_cu=2.0),
    queue("d0b", parent="d0", deserved_cu=3.0),
    queue("d1", deserved_cu=4.0),
    queue("d2"),
]
LEAVES = {"d0": ("d0a", "d0b"), "d1": ("d1",), "d2": ("d2",), "d0a": ("d0a",), "d0b": ("d0b",)}


@EXAMPLES
@given(
    st.fixed_dictionaries({leaf: timelines(4) for leaf in ("d0a", "d0b", "d1", "d2")}),
    timelines(3),
    policies(),
    instants,
    st.sampled_from(list(UsageBasis)),
)
def test_usage_inputs_equal_numerical_integration_of_their_definition(
    allocations: dict[str, list[Segment]],
    capacity: list[Segment],
    policy: FairSharePolicy,
    now_s: float,
    basis: UsageBasis,
) -> None:
    policy = FairSharePolicy(
        window_kind=policy.window_kind,
        window_s=policy.window_s,
        window_anchor_unix_s=policy.window_anchor_unix_s,
        half_life_s=policy.half_life_s,
        usage_basis=basis,
    )
    usage = usage_inputs(
        pool=POOL,
        policy=policy,
        queues=TREE,
        gpu_types={"a100": A100},
        leaf_allocations=allocations,
        capacity=capacity,
        now_s=now_s,
    )
    edges = [e for segments in (*allocations.values(), capacity) for e in _edges(segments)]
    deserved = {q.name: q.quota(POOL).deserved_cu for q in TREE}
    scale = 1.0 + sum(
        s.value * (s.end_s - s.start_s) for segs in (*allocations.values(), capacity) for s in segs
    )

    def held(name: str) -> Callable[[np.ndarray], np.ndarray]:
        parts = [_value_of(allocations[leaf]) for leaf in LEAVES[name]]
        return lambda t: sum((part(t) for part in parts), np.zeros_like(t))

    def over(value_at: Callable[[np.ndarray], np.ndarray], threshold: float) -> float:
        clamp = 0.0 if basis == UsageBasis.OVER_QUOTA else -math.inf
        cut = threshold if basis == UsageBasis.OVER_QUOTA else 0.0
        return brute_force(lambda t: np.maximum(clamp, value_at(t) - cut), edges, now_s, policy)

    for name, deserved_cu in deserved.items():
        assert _close(usage.usage_cu_s[name], over(held(name), deserved_cu), scale)
    if basis == UsageBasis.TOTAL:
        pool_capacity = over(_value_of(capacity), 0.0)
        assert _close(usage.group_capacity_cu_s[None], pool_capacity, scale)
        assert _close(usage.group_capacity_cu_s["d0"], pool_capacity, scale)
    else:
        top = over(_value_of(capacity), 10.0)  # 6 + 4 + 0 deserved at the top level
        assert _close(usage.group_capacity_cu_s[None], top, scale)
        assert _close(usage.group_capacity_cu_s["d0"], over(held("d0"), 5.0), scale)
