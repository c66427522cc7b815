"""Cluster config YAML: short enum names, durations, and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufair.config_file import ConfigFileError, load_config_file, parse_config
from gpufair.v1 import cluster_pb2 as pb

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "clusters"


def test_short_enum_names_and_durations() -> None:
    config = parse_config(
        {
            "pools": [
                {
                    "name": "p",
                    "placement": "spread",
                    "gang_reservation_after_s": "15m",
                    "policy": {
                        "window_kind": "tumbling",
                        "window_s": "1w",
                        "half_life_s": "36h",
                        "usage_basis": "total",
                        "rounding": "whole-gpus",
                        "recompute_interval_s": 30,
                    },
                }
            ],
            "budgets": [{"queue": "q", "period": "month", "cu_hours": 10}],
        }
    )
    pool = config.pools[0]
    assert pool.placement == pb.PLACEMENT_STRATEGY_SPREAD
    assert pool.gang_reservation_after_s == 900
    assert pool.policy.window_kind == pb.WINDOW_KIND_TUMBLING
    assert pool.policy.window_s == 604800
    assert pool.policy.half_life_s == 129600
    assert pool.policy.usage_basis == pb.USAGE_BASIS_TOTAL
    assert pool.policy.rounding == pb.ROUNDING_WHOLE_GPUS
    assert pool.policy.recompute_interval_s == 30
    assert config.budgets[0].period == pb.BUDGET_PERIOD_MONTH


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"pools": [{"name": "p", "policy": {"window_kind": "daily"}}]},
            "pools[0].policy.window_kind: unknown value 'daily'; choose one of sliding, tumbling, none",
        ),
        (
            {"pools": [{"name": "p", "policy": {"window_s": "a week"}}]},
            "pools[0].policy.window_s: 'a week' is not a duration",
        ),
        ({"nodes": [{"name": "n", "gpus": 8}]}, "nodes[0].gpus: unknown field"),
        ({"queues": {"name": "q"}}, "queues: expected a list"),
        (
            {"nodes": [{"name": "n"}, {"name": "m", "gpu_count": "eight"}]},
            "config: nodes[1].gpu_count: expected a whole number, got 'eight'",
        ),
        (
            {"queues": [{"name": 2024}]},
            "config: queues[0].name: expected text, got 2024; in YAML, write it in quotes: '2024'",
        ),
        ({"pools": [{"name": ["p"]}]}, "config: pools[0].name: expected text, got a list"),
        (
            {"nodes": [{"name": "n", "ready": "maybe"}]},
            "config: nodes[0].ready: expected true or false, got 'maybe'",
        ),
        (
            {"pools": [{"name": "p", "policy": {"k": "much"}}]},
            "config: pools[0].policy.k: expected a number, got 'much'",
        ),
        (
            {"nodes": [{"name": "n", "gpu_count": 8.5}]},
            "config: nodes[0].gpu_count: expected a whole number, got 8.5",
        ),
    ],
)
def test_errors_name_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigFileError) as err:
        parse_config(data)
    assert message in str(err.value)


def test_numbers_written_as_text_or_whole_floats_are_taken() -> None:
    config = parse_config(
        {
            "nodes": [{"name": "n", "gpu_count": "8"}, {"name": "m", "gpu_count": 4.0}],
            "pools": [{"name": "p", "policy": {"k": "0.5"}}],
        }
    )
    assert [n.gpu_count for n in config.nodes] == [8, 4]
    assert config.pools[0].policy.k == 0.5


def test_examples_load() -> None:
    reference = load_config_file(EXAMPLES / "llm-vs-vision.yaml")
    assert sum(n.gpu_count for n in reference.nodes) == 100
    hetero = load_config_file(EXAMPLES / "heterogeneous.yaml")
    weights = {g.name: g.compute_weight for g in hetero.gpu_types}
    assert weights == {"a100-80gb": 10, "v100-16gb": 4, "rtx4090-24gb": 2}
    assert sum(n.gpu_count * weights[n.gpu_type] for n in hetero.nodes) == 512
    priorities = {q.name: q.quotas[0].priority for q in hetero.queues}
    assert priorities["online-inference"] > priorities["fine-tuning"] > priorities["preprocessing"]


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError, match="No such file"):
        load_config_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: [unclosed\n")
    with pytest.raises(ConfigFileError, match="not valid YAML"):
        load_config_file(bad)
