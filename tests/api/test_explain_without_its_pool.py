"""ExplainWorkload of a pending workload whose pool is no longer in the config.

A pool may be removed (or renamed) while workloads of it are pending: they do not block it, and
simply wait until the pool exists again or they are cancelled. Asked about such a workload,
explain says so; it answered NOT_FOUND for a pool the caller never named.
"""

from __future__ import annotations

import copy

from gpufair.client import GpufairClient
from gpufair.config_file import parse_config
from tests.api.ledger_support import CLUSTER, cluster, submit


def renamed_pool(name: str) -> dict[str, object]:
    config = copy.deepcopy(CLUSTER)
    config["pools"][0]["name"] = name
    for obj in (*config["nodes"], *(q["quotas"][0] for q in config["queues"])):
        obj["pool"] = name
    return config


def test_a_pending_workload_of_a_removed_pool_is_explained(client: GpufairClient) -> None:
    client.apply_config(cluster())
    submit(client, "w1", queue="llm")
    before = client.explain("w1")

    client.apply_config(parse_config(renamed_pool("main2")))
    explained = client.explain("w1")
    assert (explained.uid, explained.state, explained.reason_code) == (
        "w1",
        "pending",
        "unknown_pool",
    )
    assert explained.message == (
        "w1 is pending (unknown_pool): pool main is not in the config; it waits until the "
        "pool is declared again, or until it is cancelled"
    )
    assert not explained.HasField("queue_share")

    # Declared again, the pool serves it as before.
    client.apply_config(cluster())
    again = client.explain("w1")
    assert (again.state, again.reason_code, again.message) == (
        "pending",
        before.reason_code,
        before.message,
    )
    assert [b.uid for b in client.schedule("main").binds] == ["w1"]
