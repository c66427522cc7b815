"""`usage.RunningIntegral`: the decayed integral kept as a step function is fed, read at later
instants, against `usage.decayed_integral` over the whole history at each of them."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufair.domain.model import Division, FairSharePolicy, WindowKind
from gpufair.domain.usage import RunningIntegral, Segment, decayed_integral, window_bounds

EXAMPLES = settings(max_examples=300, deadline=None)
REL = 1e-9

# Times on a quarter-second grid; values of a few CU, 0 often (a queue at or below its quota).
steps = st.integers(0, 240).map(lambda q: q / 4)
values = st.one_of(st.just(0.0), st.integers(1, 64).map(lambda q: q / 8))
half_lives = st.one_of(st.none(), st.sampled_from([0.5, 3.0, 17.5, 60.0, 1e4]))


@st.composite
def policies(draw: st.DrawFn) -> FairSharePolicy:
    kind = draw(st.sampled_from(list(WindowKind)))
    window_s = draw(st.sampled_from([5.0, 40.0, 250.0]))
    anchor_s = draw(st.integers(-100, 100).map(lambda q: q / 2))
    division = draw(st.sampled_from(list(Division)))
    return FairSharePolicy(
        window_kind=kind,
        window_s=window_s,
        window_anchor_unix_s=anchor_s,
        half_life_s=draw(half_lives),
        division=division,
    )


# One event: time passes, then the value changes, read the integral, or both; several changes
# may come at one instant (a step of 0).
events = st.lists(st.tuples(steps, values, st.booleans()), min_size=1, max_size=60)


def _segments(changes: list[tuple[float, float]], now_s: float) -> list[Segment]:
    """The stretches of the step function with these (instant, value) changes, up to now."""
    ends = [at_s for at_s, _ in changes[1:]] + [now_s] if changes else []
    return [
        Segment(start_s, end_s, value)
        for (start_s, value), end_s in zip(changes, ends, strict=True)
        if end_s > start_s and value != 0.0
    ]


def _replay(policy: FairSharePolicy, start_s: float, history: list[tuple[float, float, bool]]):
    running = RunningIntegral(
        policy.half_life_s, windowed=policy.window_kind is not WindowKind.NONE
    )
    changes: list[tuple[float, float]] = []
    now_s = start_s
    for step_s, value, read in history:
        now_s += step_s
        if read:
            lo_s, _ = window_bounds(now_s, policy)
            found = running.read(now_s, lo_s)
            expected = decayed_integral(_segments(changes, now_s), now_s, policy)
            yield now_s, found, expected
        else:
            running.set(now_s, value)
            if changes and changes[-1][0] == now_s:
                changes[-1] = (now_s, value)
            else:
                changes.append((now_s, value))


@EXAMPLES
@given(policy=policies(), start_s=st.integers(-200, 200).map(float), history=events)
def test_every_read_is_the_full_integral(
    policy: FairSharePolicy, start_s: float, history: list[tuple[float, float, bool]]
) -> None:
    for _, found, expected in _replay(policy, start_s, history):
        # Values up to 8 CU over at most 240 s per step: a scale for the absolute tolerance.
        assert found == pytest.approx(expected, rel=REL, abs=1e-9)


def test_a_long_history_with_a_short_half_life_rebases_and_agrees() -> None:
    """10 s half-life, changes every 7 s for 21,000 s (2,100 half-lives, so the reference instant
    moves 32 times); a 600 s sliding window, read every 63 s."""
    policy = FairSharePolicy(window_kind=WindowKind.SLIDING, window_s=600.0, half_life_s=10.0)
    running = RunningIntegral(10.0)
    changes = []
    reads = 0
    for step in range(3_000):
        at_s = 7.0 * step
        value = float((step * 37) % 11)  # 0 to 10 CU
        running.set(at_s, value)
        changes.append((at_s, value))
        if step % 9 == 0:
            now_s = at_s + 2.0
            lo_s, _ = window_bounds(now_s, policy)
            expected = decayed_integral(_segments(changes, now_s), now_s, policy)
            assert running.read(now_s, lo_s) == pytest.approx(expected, rel=REL)
            reads += 1
    assert reads == 334


def test_no_residue_once_every_stretch_has_left_the_window() -> None:
    """4 CU from 0 s, 2.5 CU from 100 s, nothing from 130 s; a 60 s window without decay. At
    120 s the window [60, 120) holds 4 · 40 + 2.5 · 20 = 210 CU·s, at 150 s [90, 150) holds
    4 · 10 + 2.5 · 30 = 115, and at 200 s nothing: exactly 0, though terms of 400 and 75 were
    added to the running sum and taken away again."""
    running = RunningIntegral(None)
    running.set(0.0, 4.0)
    running.set(100.0, 2.5)
    assert running.read(120.0, 60.0) == 210.0
    running.set(130.0, 0.0)
    assert running.read(150.0, 90.0) == 115.0
    assert running.read(200.0, 140.0) == 0.0


def test_without_a_window_stretches_are_folded_and_decayed() -> None:
    """Window kind none, half-life 100 s: 3 CU over [0, 100) read at 300 s is
    3 · 100 / ln 2 · (1 - 1/2) · 2^-2 = 54.1011... CU·s, and it keeps no stretch."""
    running = RunningIntegral(100.0, windowed=False)
    running.set(0.0, 3.0)
    running.set(100.0, 0.0)
    expected = 3.0 * 100.0 / math.log(2.0) * 0.5 * 0.25
    assert running.read(300.0, -math.inf) == pytest.approx(expected, rel=1e-12)
    assert round(expected, 4) == 54.1011
    assert running.read(100_000.0, -math.inf) == pytest.approx(expected * 2.0**-997, rel=1e-9)


def test_a_change_before_the_latest_is_refused() -> None:
    running = RunningIntegral(None)
    running.set(10.0, 1.0)
    with pytest.raises(ValueError, match="before the latest change"):
        running.set(9.0, 2.0)
