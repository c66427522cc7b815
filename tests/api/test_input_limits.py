"""The input limits over a real channel: each case a caller could send is INVALID_ARGUMENT with
the field named and a short status, never INTERNAL, a database error or an unreadable reply."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_status import rpc_status

from gpufair.api.server import RunningServer
from gpufair.client import GpufairClient, field_violations
from gpufair.domain.limits import MAX_QUEUE_DEPTH, MAX_VIOLATIONS_SHOWN
from gpufair.metrics import RPCS
from gpufair.v1 import cluster_pb2, ledger_pb2, scheduler_pb2

MB = 1024 * 1024


def small_cluster() -> cluster_pb2.ClusterConfig:
    config = cluster_pb2.ClusterConfig()
    config.gpu_types.add(name="a100", memory_gib=80, compute_weight=10)
    config.pools.add(name="main")
    config.nodes.add(name="n1", pool="main", gpu_type="a100", gpu_count=8, labels={"rack": "r1"})
    config.queues.add(name="team").quotas.add(pool="main", deserved_cu=40)
    return config


def refused(call: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()  # type: ignore[operator]
    error = caught.value
    assert isinstance(error, grpc.Call)
    return error


def fields_of(error: grpc.RpcError) -> dict[str, str]:
    assert isinstance(error, grpc.Call)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (error.code(), error.details())
    return dict(field_violations(error))


def test_a_tiny_gpus_per_pod_and_a_year_10000_submit_time_are_invalid_argument(
    client: GpufairClient,
) -> None:
    client.apply_config(small_cluster())
    tiny = scheduler_pb2.Workload(uid="w1", queue="team", pool="main", pods=1, gpus_per_pod=5e-324)
    error = refused(lambda: client.submit_workloads([tiny]))
    assert fields_of(error) == {
        "workloads[0].gpus_per_pod": "must be in [0.001, 64], got 4.94066e-324"
    }

    late = scheduler_pb2.Workload(uid="w2", queue="team", pool="main", pods=1, gpus_per_pod=1)
    late.submit_time.seconds = 253_402_300_800  # 10000-01-01T00:00:00Z
    error = refused(lambda: client.submit_workloads([late]))
    assert fields_of(error) == {
        "workloads[0].submit_time": "must be an instant between 1970-01-01 and 9999-12-31 (UTC)"
    }
    late.submit_time.seconds = 253_402_300_799  # the last second of 9999 is fine
    assert [r.accepted for r in client.submit_workloads([late]).results] == [True]


def test_submit_time_nanos_out_of_range_are_refused_at_their_field(
    client: GpufairClient,
) -> None:
    client.apply_config(small_cluster())
    sent = []
    for uid, seconds, nanos in (
        ("neg", 1_700_000_000, -1),  # read as 1 ns before the second
        ("big", 1_700_000_000, 2_000_000_000),  # read as 2 s after it
        ("pre", -1, 2_000_000_000),  # a second before 1970 read as 1970-01-01T00:00:01
        ("far", 253_402_300_800, -1),  # the year 10000 read as 9999
    ):
        w = scheduler_pb2.Workload(uid=uid, queue="team", pool="main", pods=1, gpus_per_pod=1)
        w.submit_time.seconds, w.submit_time.nanos = seconds, nanos
        sent.append(w)
    error = refused(lambda: client.submit_workloads(sent))
    assert fields_of(error) == {
        f"workloads[{i}].submit_time.nanos": "must be in [0, 999999999]" for i in range(4)
    }
    sent[1].submit_time.nanos = 500_000_000
    sent[2].submit_time.nanos = 0
    error = refused(lambda: client.submit_workloads(sent[1:3]))
    # Each field once: the Timestamp's check, not again the instant made of it.
    assert field_violations(error) == [
        ("workloads[1].submit_time", "must be an instant between 1970-01-01 and 9999-12-31 (UTC)")
    ]
    assert [r.accepted for r in client.submit_workloads(sent[1:2]).results] == [True]
    assert client.list_workloads(pool="main")[0].workload.submit_time == sent[1].submit_time
    usage = ledger_pb2.GetUsageRequest(since=Timestamp(seconds=1, nanos=2_000_000_000))
    assert fields_of(refused(lambda: client.ledger.GetUsage(usage))) == {
        "since.nanos": "must be in [0, 999999999]"
    }


def test_absurd_numbers_in_a_config_are_refused_with_their_fields(client: GpufairClient) -> None:
    config = small_cluster()
    config.gpu_types[0].compute_weight = 1e308
    config.queues[0].quotas[0].deserved_cu = float("inf")
    config.pools[0].policy.half_life_s = 5e-324
    config.nodes[0].cpu_millicores = 2**62
    error = refused(lambda: client.apply_config(config, dry_run=True))
    assert fields_of(error) == {
        "config.gpu_types[0].compute_weight": "must be in [0.001, 10000], got 1e+308",
        "config.queues[0].quotas[0].deserved_cu": "must be a finite number, got inf",
        "config.pools[0].policy.half_life_s": "must be in [0.001, 3.16224e+08], got 4.94066e-324",
        "config.nodes[0].cpu_millicores": "must be in [0, 1e+09], got 4.61169e+18",
    }
    assert client.get_config().config_version == 0  # nothing stored


def test_nul_in_a_node_label_is_refused_by_the_dry_run(client: GpufairClient) -> None:
    config = small_cluster()
    config.nodes[0].labels["rack"] = "r\x001"
    for dry_run in (True, False):
        error = refused(lambda dry=dry_run: client.apply_config(config, dry_run=dry))
        assert fields_of(error) == {
            "config.nodes[0].labels[rack]": "contains a NUL character (U+0000)"
        }


def test_nul_is_refused_with_its_field_on_every_rpc_that_takes_strings(
    client: GpufairClient,
) -> None:
    client.apply_config(small_cluster())
    nul = "a\x00b"
    history = ledger_pb2.GetFairShareHistoryRequest(pool="main", queue=nul)
    cases = {
        "pool": lambda: client.schedule(nul),
        "uid": lambda: client.cancel_workload(nul),
        "request_id": lambda: client.cancel_workload("w", request_id=nul),
        "queue": lambda: client.get_usage(queue=nul),
        "names[0]": lambda: client.delete_objects("queue", [nul]),
        "workloads[0].queue": lambda: client.submit_workloads(
            [scheduler_pb2.Workload(uid="w", queue=nul, pool="main", pods=1, gpus_per_pod=1)]
        ),
        "workloads[0].allowed_gpu_types[0]": lambda: client.submit_workloads(
            [
                scheduler_pb2.Workload(
                    uid="w",
                    queue="team",
                    pool="main",
                    pods=1,
                    gpus_per_pod=1,
                    allowed_gpu_types=[nul],
                )
            ]
        ),
    }
    for field, call in cases.items():
        assert fields_of(refused(call)) == {field: "contains a NUL character (U+0000)"}, field
    assert fields_of(refused(lambda: client.explain(nul))) == {
        "uid": "contains a NUL character (U+0000)"
    }
    assert fields_of(refused(lambda: client.get_fair_share(nul))) == {
        "pool": "contains a NUL character (U+0000)"
    }
    assert fields_of(refused(lambda: client.ledger.GetFairShareHistory(history))) == {
        "queue": "contains a NUL character (U+0000)"
    }
    assert fields_of(refused(lambda: client.schedule("tab\there"))) == {
        "pool": "contains a control character (U+0009)"
    }


def test_a_megabyte_of_name_gives_a_short_status(client: GpufairClient) -> None:
    huge = "x" * MB
    for call, field in (
        (lambda: client.explain(huge), "uid"),
        (lambda: client.delete_objects("node", [huge]), "names[0]"),
        (lambda: client.get_fair_share(huge), "pool"),
    ):
        error = refused(call)
        assert fields_of(error) == {
            field: f"longer than {253 if field != 'pool' else 63} characters ({MB})"
        }
        assert len(error.details()) < 200
    # An unknown name within the limits: NOT_FOUND quotes it, cut short.
    long_uid = "u" * 253
    error = refused(lambda: client.cancel_workload(long_uid))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert error.details() == f"workload '{'u' * 78}… (253 characters) not found"


def test_a_thousand_deep_queue_tree_gives_a_short_readable_list(
    client: GpufairClient,
) -> None:
    config = small_cluster()
    for i in range(1000):
        config.queues.add(name=f"q{i}", parent=f"q{i - 1}" if i else "")
    error = refused(lambda: client.apply_config(config, dry_run=True))
    violations = field_violations(error)
    too_deep = 1000 - MAX_QUEUE_DEPTH
    assert len(violations) == MAX_VIOLATIONS_SHOWN + 1
    assert violations[0] == (
        f"config.queues[{MAX_QUEUE_DEPTH + 1}].parent",
        f"queue tree deeper than {MAX_QUEUE_DEPTH} levels ({MAX_QUEUE_DEPTH + 1})",
    )
    assert violations[-1] == (
        f"config.queues[{MAX_QUEUE_DEPTH + 1 + MAX_VIOLATIONS_SHOWN}].parent",
        f"and {too_deep - MAX_VIOLATIONS_SHOWN} more violations like the above",
    )
    status = rpc_status.from_call(error)
    assert status is not None and len(status.SerializeToString()) < 4096


def test_malformed_bytes_are_invalid_argument_and_counted(
    client: GpufairClient, server: RunningServer
) -> None:
    counted = RPCS.labels("ApplyConfig", "INVALID_ARGUMENT")
    before = counted._value.get()
    raw = client._channel.unary_unary(
        "/gpufair.v1.ClusterAdmin/ApplyConfig",
        request_serializer=None,
        response_deserializer=None,
    )
    error = refused(lambda: raw(b"\xff\xff\xff\xff\x0f garbage", timeout=10))
    fields = fields_of(error)
    assert list(fields) == ["request"]
    assert fields["request"].startswith("not a valid ApplyConfig request message")
    assert counted._value.get() == before + 1

    stream = client._channel.stream_unary(
        "/gpufair.v1.Ledger/StreamEvents", request_serializer=None, response_deserializer=None
    )
    good = ledger_pb2.ReportEventsRequest().SerializeToString()
    error = refused(lambda: stream(iter([good, b"\x0a\x05\xff"]), timeout=10))
    assert list(fields_of(error)) == ["messages[1]"]


def test_far_timestamps_in_reads_are_invalid_argument(client: GpufairClient) -> None:
    request = ledger_pb2.GetUsageRequest(until=Timestamp(seconds=-1))
    assert fields_of(refused(lambda: client.ledger.GetUsage(request))) == {
        "until": "must be an instant between 1970-01-01 and 9999-12-31 (UTC)"
    }
    history = ledger_pb2.GetFairShareHistoryRequest(
        pool="main", since=Timestamp(seconds=10**12), until=Timestamp(nanos=-5)
    )
    assert fields_of(refused(lambda: client.ledger.GetFairShareHistory(history))) == {
        "since": "must be an instant between 1970-01-01 and 9999-12-31 (UTC)",
        "until.nanos": "must be in [0, 999999999]",
    }


def test_the_node_and_listing_rpcs_keep_the_same_limits(client: GpufairClient) -> None:
    client.apply_config(small_cluster())
    node = cluster_pb2.Node(
        name="n2", pool="main", gpu_type="a100", gpu_count=8, labels={"rack": "r\x002"}
    )
    for dry_run in (True, False):
        error = refused(lambda dry=dry_run: client.upsert_nodes([node], dry_run=dry))
        assert fields_of(error) == {"nodes[0].labels[rack]": "contains a NUL character (U+0000)"}
    huge = cluster_pb2.Node(name="n3", pool="main", gpu_type="a100", gpu_count=8)
    huge.cpu_millicores = 2**63 - 1
    assert fields_of(refused(lambda: client.upsert_nodes([huge]))) == {
        "nodes[0].cpu_millicores": "must be in [0, 1e+09], got 9.22337e+18"
    }
    assert fields_of(refused(lambda: client.upsert_nodes([], prune_pools=["m\x00"]))) == {
        "prune_pools[0]": "contains a NUL character (U+0000)"
    }
    assert fields_of(refused(lambda: client.set_nodes_ready(["n1", "x" * MB], False))) == {
        "names[1]": f"longer than 253 characters ({MB})"
    }
    assert fields_of(refused(lambda: client.list_workloads(pool="main\x00"))) == {
        "pool": "contains a NUL character (U+0000)"
    }
    token = scheduler_pb2.ListWorkloadsRequest(page_token="t" * MB)
    assert fields_of(refused(lambda: client.scheduler.ListWorkloads(token))) == {
        "page_token": "longer than 2048 characters"
    }
    assert client.get_config().config.nodes[0].labels["rack"] == "r1"
