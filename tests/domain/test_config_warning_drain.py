"""The configuration's warning that a pool's guarantees cannot all hold counts every node of the
pool, ready or not: a drain is operations, not a configuration that over-promises."""

from __future__ import annotations

from dataclasses import replace

from gpufair.domain.config_rules import config_warnings
from gpufair.domain.model import (
    ClusterConfig,
    GpuType,
    Node,
    NodePool,
    Queue,
    QueueQuota,
    frozen_map,
)


def _config(deserved: tuple[float, ...], ready: tuple[bool, ...]) -> ClusterConfig:
    """Pool main: four nodes of 8 `unit` GPUs (1 CU each), 32 CU; one queue per quota."""
    return ClusterConfig(
        gpu_types=(GpuType("unit", 40, 1),),
        pools=(NodePool("main"),),
        nodes=tuple(
            Node(f"n{i}", "main", "unit", 8, 64000, 512000, ready=ok) for i, ok in enumerate(ready)
        ),
        queues=tuple(
            Queue(f"q{i}", None, frozen_map({"main": QueueQuota("main", deserved_cu=cu)}))
            for i, cu in enumerate(deserved)
        ),
    )


def test_a_drained_node_in_a_pool_its_quotas_fill_gives_no_warning() -> None:
    # 20 + 12 CU deserved of 32: the quotas fill the pool. n0 drained (24 CU ready).
    assert config_warnings(_config((20, 12), (True,) * 4)) == []
    assert config_warnings(_config((20, 12), (False, True, True, True))) == []
    # Every node drained at once: still the configuration's 32 CU.
    assert config_warnings(_config((20, 12), (False,) * 4)) == []


def test_quotas_beyond_the_configured_nodes_still_warn_drained_or_not() -> None:
    want = [
        "pool 'main': top-level deserved quotas add up to 33 CU, more than its 32 CU: "
        "guarantees cannot all hold at once"
    ]
    assert config_warnings(_config((20, 13), (True,) * 4)) == want
    assert config_warnings(_config((20, 13), (True, False, True, True))) == want
    # A node removed from the config (not drained) does take its CU away.
    fewer = _config((20, 12), (True,) * 4)
    fewer = replace(fewer, nodes=fewer.nodes[:3])
    assert config_warnings(fewer) == [
        "pool 'main': top-level deserved quotas add up to 32 CU, more than its 24 CU: "
        "guarantees cannot all hold at once"
    ]
