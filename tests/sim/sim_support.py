"""Helpers for simulator tests: example scenarios loaded and adjusted, tiny clusters, runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from gpufair.sim.engine import SimResult, simulate
from gpufair.sim.metrics import QueueMetrics, RunMetrics, compute_metrics
from gpufair.sim.scenario import Scenario, parse_scenario

REPOSITORY = Path(__file__).resolve().parents[2]
EXAMPLES = REPOSITORY / "examples" / "scenarios"


def example_data(name: str) -> dict[str, Any]:
    """An example scenario's YAML as data, to adjust before `scenario_from`."""
    data: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    return data


def scenario_from(data: dict[str, Any], **kwargs: Any) -> Scenario:
    """A scenario from YAML data; relative paths resolve as if it sat in examples/scenarios."""
    return parse_scenario(yaml.safe_dump(data, sort_keys=False), base_dir=EXAMPLES, **kwargs)


def with_k(scenario: Scenario, k: float, **policy: Any) -> Scenario:
    return scenario.with_policy(lambda p: dataclasses.replace(p, k=k, **policy))


def run(scenario: Scenario) -> tuple[SimResult, RunMetrics]:
    result = simulate(scenario)
    return result, compute_metrics(result)


def queue_metrics(metrics: RunMetrics, queue: str) -> QueueMetrics:
    (found,) = [q for q in metrics.queues if q.queue == queue]
    return found


def unit_cluster(
    nodes: list[tuple[str, int]], queues: list[dict[str, Any]], **policy: Any
) -> dict[str, Any]:
    """A cluster section with one GPU type of 1 CU (CU read as GPUs) and one pool `default`."""
    return {
        "gpu_types": [{"name": "unit", "memory_gib": 80, "compute_weight": 1}],
        "pools": [{"name": "default", "policy": {"window_s": "1d", **policy}}],
        "queues": [
            {
                "name": q["name"],
                "quotas": [
                    {
                        "pool": "default",
                        "deserved_cu": q.get("deserved_cu", 0),
                        "over_quota_weight": q.get("weight", 1),
                    }
                ],
            }
            for q in queues
        ],
        "nodes": [
            {
                "name": name,
                "pool": "default",
                "gpu_type": "unit",
                "gpu_count": gpus,
                "cpu_millicores": 64000,
                "memory_mib": 262144,
            }
            for name, gpus in nodes
        ],
    }
