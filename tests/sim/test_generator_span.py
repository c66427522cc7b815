"""Generators that start before they stop and before the end of the run; one that would make no
job is a problem with its field path and line."""

from __future__ import annotations

from test_scenario import CLUSTER, problems


def text(body: str) -> str:
    return "name: test\nduration_s: 1d\n" + CLUSTER + body


def test_a_generator_starting_at_or_after_its_stop_is_a_problem() -> None:
    body = """\
generators:
  - {queue: team, rate_per_h: 1, duration_s: 1h, start_s: 2h, stop_s: 1h}
  - {queue: team, backlog: 2, duration_s: 1h, start_s: 3h, stop_s: 3h}
  - {queue: team, backlog: 2, duration_s: 1h, start_s: 1h, stop_s: 3h}
"""
    found = problems(text(body))
    assert [(line, path) for line, path, _ in found] == [
        (17, "generators[0].start_s"),
        (18, "generators[1].start_s"),
    ]
    assert all("stop_s" in message and "no jobs" in message for _, _, message in found)


def test_a_generator_starting_at_or_after_the_end_is_a_problem() -> None:
    body = """\
generators:
  - {queue: team, rate_per_h: 1, duration_s: 1h, start_s: 2d}
  - {queue: team, backlog: 1, duration_s: 1h, start_s: 1d, stop_s: 3d}
"""
    found = problems(text(body))
    assert [(line, path) for line, path, _ in found] == [
        (17, "generators[0].start_s"),
        (18, "generators[1].start_s"),
    ]
    assert all("duration_s" in message and "no jobs" in message for _, _, message in found)
