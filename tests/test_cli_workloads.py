"""`gpufair get workloads` and the integrator options of `gpufair apply` against a real server."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from gpufair.api.server import RunningServer
from gpufair.cli import main
from gpufair.client import GpufairClient
from gpufair.v1 import scheduler_pb2
from tests.api.ledger_support import CLUSTER, cluster


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def submit(client: GpufairClient, uid: str, queue: str, gpus: int, age_s: float) -> None:
    w = scheduler_pb2.Workload(uid=uid, queue=queue, pool="main", pods=2, gpus_per_pod=gpus)
    w.submit_time.FromNanoseconds(round((time.time() - age_s) * 1e9))
    assert client.submit_workloads([w]).results[0].accepted


def test_get_workloads_table_and_formats(
    client: GpufairClient, server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{server.port}"
    client.apply_config(cluster())
    submit(client, "fits", "llm", 8, age_s=7200)  # 2 x 8 A100: a1 and a2
    submit(client, "too-big", "llm", 8, age_s=3 * 86400)  # older, but no room left after
    submit(client, "waits", "vision", 4, age_s=90)
    reply = client.schedule("main")
    assert [b.uid for b in reply.binds] == ["too-big"]  # oldest first: it takes a1 and a2

    code, out, _ = run(capsys, "get", "workloads", "--address", address)
    assert code == 0
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["UID", "QUEUE", "POOL", "STATE", "REASON", "POSITION", "GPUS", "AGE"]
    reasons = {p.uid: p.reason_code for p in reply.pending}
    assert rows[1:] == [
        ["too-big", "llm", "main", "bound", "bound", "-", "16", "3d"],
        ["fits", "llm", "main", "pending", reasons["fits"], "1", "16", "2h"],
        ["waits", "vision", "main", "pending", reasons["waits"], "1", "8", "1m"],
    ]

    code, out, _ = run(
        capsys, "get", "workloads", "--queue", "llm", "--state", "pending", "--address", address
    )
    assert [line.split()[0] for line in out.splitlines()] == ["UID", "fits"]
    code, out, _ = run(
        capsys, "get", "workloads", "--state", "finished,cancelled", "--address", address
    )
    assert code == 0 and out.splitlines()[-1] == "no workloads"

    code, out, _ = run(capsys, "get", "workloads", "-o", "yaml", "--address", address)
    listed = yaml.safe_load(out)["workloads"]
    assert [(w["workload"]["uid"], w["state"]) for w in listed] == [
        ("too-big", "bound"),
        ("fits", "pending"),
        ("waits", "pending"),
    ]
    assert [p["node"] for p in listed[0]["pods"]] == ["a1", "a2"]
    code, out, _ = run(capsys, "get", "workloads", "-o", "json", "--address", address)
    as_json = json.loads(out)["workloads"]
    assert [(w["workload"]["uid"], w["queue_position"]) for w in as_json] == [
        ("too-big", 0),  # bound: at no position, a 0 written out like any other number
        ("fits", 1),
        ("waits", 1),  # first of its queue
    ]
    assert [w["evicting"] for w in as_json] == [False, False, False]
    assert [w["workload"]["min_runtime_s"] for w in as_json] == [0, 0, 0]

    code, _, err = run(capsys, "get", "workloads", "--state", "waiting", "--address", address)
    assert code == 1
    assert "  - states[0]: 'waiting' is not one of pending, bound, running" in err
    # A mistyped pool is named as not found, not shown as "no workloads".
    code, out, err = run(capsys, "get", "workloads", "--pool", "mian", "--address", address)
    assert (code, out, err) == (1, "", "error: NOT_FOUND: pool 'mian' not found\n")


def test_apply_conflict_is_one_line(
    client: GpufairClient,
    server: RunningServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    address = f"127.0.0.1:{server.port}"
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(CLUSTER))
    code, out, _ = run(
        capsys, "apply", "-f", str(path), "--expected-version", "0", "--address", address
    )
    assert code == 0 and out.strip().endswith("applied: config version 1")
    changed = {**CLUSTER, "queues": [CLUSTER["queues"][0]]}
    path.write_text(yaml.safe_dump(changed))
    code, out, err = run(
        capsys, "apply", "-f", str(path), "--expected-version", "0", "--address", address
    )
    assert code == 1 and out == ""
    assert err.splitlines() == [
        "error: conflict: config version is 1, not the expected 0: the config changed since it "
        "was read. Nothing was changed: read it again and retry."
    ]
    assert [q.name for q in client.get_config().config.queues] == ["llm", "vision"]


def test_empty_file_scoped_apply_and_confirm(
    client: GpufairClient,
    server: RunningServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    address = f"127.0.0.1:{server.port}"
    client.apply_config(cluster())
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    code, _, err = run(capsys, "apply", "-f", str(empty), "--address", address)
    assert code == 1
    assert err.startswith("error: FAILED_PRECONDITION: this apply would delete all 8 stored")
    assert len(client.get_config().config.nodes) == 3

    queues = tmp_path / "queues.yaml"
    queues.write_text(yaml.safe_dump({"queues": [{"name": "research"}]}))
    code, out, _ = run(capsys, "apply", "-f", str(queues), "--kinds", "queue", "--address", address)
    assert code == 0
    assert out.splitlines()[:3] == [
        "create queue research",
        "delete queue llm",
        "delete queue vision",
    ]
    assert len(client.get_config().config.nodes) == 3

    code, out, _ = run(
        capsys,
        "apply",
        "-f",
        str(empty),
        "--kinds",
        "gpu-type,pool,node,queue",
        "--confirm-delete-all",
        "--address",
        address,
    )
    assert code == 0 and out.strip().endswith("applied: config version 3")
    assert client.get_config().config.nodes == []

    with pytest.raises(SystemExit) as exit_info:
        main(["apply", "-f", str(empty), "--kinds", "queue,planet"])
    assert exit_info.value.code == 2
    assert (
        "planet: name kinds among gpu-types, pools, nodes, queues, budgets "
        "(singular too, - or _ alike)"
    ) in capsys.readouterr().err


def test_get_workloads_shows_what_a_compute_unit_request_asks_and_holds(
    client: GpufairClient, server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A request for compute units names no pods: pending, it shows the CU it asks for; bound,
    the GPUs gpufair chose (not pods x GPUs per pod, which are 0 for such a request)."""
    address = f"127.0.0.1:{server.port}"
    client.apply_config(cluster())
    w = scheduler_pb2.Workload(
        uid="by-cu", queue="llm", pool="main", compute_units=8, allowed_gpu_types=["rtx4090"]
    )
    assert client.submit_workloads([w]).results[0].accepted
    code, out, _ = run(capsys, "get", "workloads", "--address", address)
    assert code == 0
    assert out.splitlines()[1].split()[6:8] == ["8", "CU"]

    assert [b.uid for b in client.schedule("main").binds] == ["by-cu"]  # 4 RTX 4090 at 2 CU
    code, out, _ = run(capsys, "get", "workloads", "--address", address)
    assert code == 0
    assert out.splitlines()[1].split()[:3] + out.splitlines()[1].split()[6:7] == [
        "by-cu",
        "llm",
        "main",
        "4",
    ]
