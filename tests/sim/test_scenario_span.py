"""Clocks a run can step through: cycle_s, timeline_s and recompute_s against duration_s. Each
problem names its field path and line."""

from __future__ import annotations

import pytest
from test_scenario import CLUSTER, problems

from gpufair.sim.scenario import parse_scenario

MAX_STEPS = 1_000_000  # cycles or recomputes a run may take (the scenario docs say so)
MAX_SAMPLES = 100_000  # timeline samples


def text(head: str, body: str = "", cluster: str = CLUSTER) -> str:
    return "name: test\n" + head + cluster + body


@pytest.mark.parametrize("field", ["cycle_s", "timeline_s", "recompute_s"])
def test_a_step_too_small_for_the_span_is_named_with_its_line(field: str) -> None:
    found = problems(text(f"duration_s: 1d\n{field}: 0.000000001\n"))
    ((line, path, message),) = found
    assert (line, path) == (3, field)
    bound = MAX_SAMPLES if field == "timeline_s" else MAX_STEPS
    assert f"at most {bound:,}" in message and "duration_s" in message


def test_a_span_too_long_for_the_default_cycle_is_named_at_duration_s() -> None:
    ((line, path, message),) = problems(
        text("duration_s: 1000w\ntimeline_s: 1w\nrecompute_s: 1d\n")
    )
    assert (line, path) == (2, "duration_s")
    assert "cycle_s 60 s" in message and f"at most {MAX_STEPS:,}" in message


def test_a_pool_recompute_interval_too_small_is_named_in_the_cluster_section() -> None:
    policy = "{window_s: 1d, k: 2, recompute_interval_s: 0.01}"
    cluster = CLUSTER.replace("{window_s: 1d, k: 2}", policy)
    ((line, path, message),) = problems(text("duration_s: 1w\n", cluster=cluster))
    assert (line, path) == (8, "cluster.pools[0].policy.recompute_interval_s")
    assert "recompute_s" in message  # the scenario's own setting overrides it
    parse_scenario(text("duration_s: 1w\nrecompute_s: 5m\n", cluster=cluster))


def test_the_largest_run_allowed_still_loads() -> None:
    cycle_s = 86_400 / MAX_STEPS
    timeline_s = 86_400 / MAX_SAMPLES
    head = f"duration_s: 1d\ncycle_s: {cycle_s}\ntimeline_s: {timeline_s}\nrecompute_s: 1h\n"
    assert parse_scenario(text(head)).cycle_s == cycle_s
