"""A GPU type's partition profiles are named once each: a workload asks for one by name, so two
profiles of one name on one type would leave it to chance which slice geometry it gets."""

from __future__ import annotations

import grpc
import pytest

from gpufair.client import GpufairClient, field_violations
from tests.api.ledger_support import cluster


def test_a_profile_name_twice_on_one_gpu_type_is_a_field_violation(
    client: GpufairClient,
) -> None:
    config = cluster()
    a100 = config.gpu_types[0]
    a100.partition_profiles.add(
        name="1g.10gb", gpu_fraction=1 / 7, memory_gib=10, memory_slices=1, starts=[0, 1, 2]
    )
    a100.partition_profiles.add(
        name="3g.40gb", gpu_fraction=3 / 7, memory_gib=40, memory_slices=4, starts=[0, 4]
    )
    a100.partition_profiles.add(
        name="1g.10gb", gpu_fraction=2 / 7, memory_gib=20, memory_slices=2, starts=[0, 2]
    )
    # Another type may use the same name.
    config.gpu_types[1].partition_profiles.add(name="1g.10gb", gpu_fraction=0.5, memory_gib=10)
    for dry_run in (True, False):
        with pytest.raises(grpc.RpcError) as caught:
            client.apply_config(config, dry_run=dry_run)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field_violations(caught.value) == [
            ("config.gpu_types[0].partition_profiles[2].name", "duplicate name '1g.10gb'")
        ]
    assert client.get_config().config_version == 0

    del a100.partition_profiles[2]
    assert client.apply_config(config).config_version == 1
    stored = {
        g.name: [p.name for p in g.partition_profiles] for g in client.get_config().config.gpu_types
    }
    assert stored == {"a100": ["1g.10gb", "3g.40gb"], "rtx4090": ["1g.10gb"]}
