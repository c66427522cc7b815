"""`gpufair convert kai-queues`: KAI-Scheduler Queue YAML to a cluster file that gpufair accepts
and that divides GPUs by KAI's rules (docs/kai-compatibility.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpufair.api.convert_cluster import config_from_proto
from gpufair.api.server import RunningServer
from gpufair.cli import main
from gpufair.client import GpufairClient
from gpufair.config_file import load_config_file
from gpufair.domain.fairshare import FairShareInput, QueueDemand, compute_fair_shares
from gpufair.domain.model import Division
from gpufair.v1 import cluster_pb2 as pb

# The shape KAI-Scheduler installs by default: a parent and a leaf, no quotas, no limits.
KAI_DEFAULT_QUEUES = """\
apiVersion: scheduling.run.ai/v2
kind: Queue
metadata:
  name: default-parent-queue
spec:
  resources:
    cpu: {limit: -1, overQuotaWeight: 1, quota: 0}
    gpu: {limit: -1, overQuotaWeight: 1, quota: 0}
    memory: {limit: -1, overQuotaWeight: 1, quota: 0}
---
apiVersion: scheduling.run.ai/v2
kind: Queue
metadata:
  name: default-queue
spec:
  parentQueue: default-parent-queue
  resources:
    cpu: {limit: -1, overQuotaWeight: 1, quota: 0}
    gpu: {limit: -1, overQuotaWeight: 1, quota: 0}
    memory: {limit: -1, overQuotaWeight: 1, quota: 0}
"""

# A department with two teams as `kubectl get queues -o yaml` lists them: quotas, a limit below
# the quota (KAI accepts it), weights, priorities.
KAI_TEAMS_LIST = """\
apiVersion: v1
kind: List
items:
- apiVersion: scheduling.run.ai/v2
  kind: Queue
  metadata: {name: research}
  spec:
    resources:
      gpu: {quota: 16, limit: -1, overQuotaWeight: 1}
- apiVersion: scheduling.run.ai/v2
  kind: Queue
  metadata: {name: team-a}
  spec:
    parentQueue: research
    priority: 150
    resources:
      gpu: {quota: 10, limit: 6, overQuotaWeight: 2}
- apiVersion: scheduling.run.ai/v2
  kind: Queue
  metadata: {name: team-b}
  spec:
    parentQueue: research
    resources:
      gpu: {quota: 4, limit: -1, overQuotaWeight: 1}
"""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_kai_default_queues_become_a_kai_pool_with_the_same_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "queues.yaml"
    source.write_text(KAI_DEFAULT_QUEUES)
    code, out, err = run(capsys, "convert", "kai-queues", str(source))
    assert (code, err) == (0, "")
    data = yaml.safe_load(out)
    assert data["pools"] == [
        {
            "name": "default",
            "policy": {
                "division": "kai",
                "usage_basis": "total",
                "rounding": "whole_gpus",
                "k": 1.0,
                "window_kind": "sliding",
                "window_s": "7d",
            },
        }
    ]
    assert data["queues"] == [
        {
            "name": "default-parent-queue",
            "quotas": [
                {"pool": "default", "deserved_cu": 0.0, "over_quota_weight": 1.0, "priority": 100}
            ],
        },
        {
            "name": "default-queue",
            "parent": "default-parent-queue",
            "quotas": [
                {"pool": "default", "deserved_cu": 0.0, "over_quota_weight": 1.0, "priority": 100}
            ],
        },
    ]


def test_a_kubectl_list_converts_with_cu_priorities_and_a_limit_below_the_quota(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "teams.yaml"
    source.write_text(KAI_TEAMS_LIST)
    out_file = tmp_path / "cluster.yaml"
    code, _, err = run(
        capsys,
        "convert",
        "kai-queues",
        str(source),
        "--gpu-type",
        "h100",
        "--compute-weight",
        "10",
        "--pool",
        "train",
        "-O",
        str(out_file),
    )
    assert (code, err) == (0, "")
    config, violations = config_from_proto(load_config_file(out_file))
    assert violations == []
    [pool] = config.pools
    assert (pool.name, pool.policy.division) == ("train", Division.KAI)
    quotas = {q.name: q.quotas["train"] for q in config.queues}
    assert {
        n: (q.deserved_cu, q.limit_cu, q.over_quota_weight, q.priority) for n, q in quotas.items()
    } == {
        "research": (160.0, None, 1.0, 100),
        "team-a": (100.0, 60.0, 2.0, 150),
        "team-b": (40.0, None, 1.0, 100),
    }
    # The converted pool divides 20 H100s as KAI would: team-a's limit of 6 caps its quota of
    # 10; team-b gets its 4 and the rest of research's 16 + 4 over-quota, up to its wish of 12.
    result = compute_fair_shares(
        FairShareInput(
            pool="train",
            policy=pool.policy,
            gpu_types={t.name: t for t in config.gpu_types},
            capacity_gpus_by_type={"h100": 20.0},
            queues=config.queues,
            demands={
                "team-a": QueueDemand(pending_gpus_by_type={"h100": 20.0}),
                "team-b": QueueDemand(pending_gpus_by_type={"h100": 12.0}),
            },
        )
    )
    gpus = {name: share.fair_share_cu / 10 for name, share in result.shares.items()}
    assert gpus == {"research": 18.0, "team-a": 6.0, "team-b": 12.0}


def test_the_converted_file_is_accepted_by_the_service(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    server: RunningServer,
    client: GpufairClient,
) -> None:
    source = tmp_path / "teams.yaml"
    source.write_text(KAI_TEAMS_LIST)
    out_file = tmp_path / "cluster.yaml"
    assert run(capsys, "convert", "kai-queues", str(source), "-O", str(out_file))[0] == 0
    code, _, err = run(
        capsys, "apply", "-f", str(out_file), "--address", f"127.0.0.1:{server.port}"
    )
    assert (code, err) == (0, "")
    stored = client.get_config().config
    assert stored.pools[0].policy.division == pb.DIVISION_KAI
    team_a = next(q for q in stored.queues if q.name == "team-a")
    assert (team_a.quotas[0].deserved_cu, team_a.quotas[0].limit_cu) == (10.0, 6.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            KAI_DEFAULT_QUEUES.replace("default-parent-queue\nspec", "top\nspec"),
            "queue 'default-queue': spec.parentQueue 'default-parent-queue' is not among them",
        ),
        (
            KAI_DEFAULT_QUEUES.replace("scheduling.run.ai/v2", "scheduling.run.ai/v1", 1),
            "apiVersion 'scheduling.run.ai/v1'; only scheduling.run.ai/v2 is read",
        ),
        (
            KAI_DEFAULT_QUEUES.replace(
                "gpu: {limit: -1, overQuotaWeight: 1, quota: 0}", "gpu: {quota: -1}", 1
            ),
            "gpu quota -1 (unlimited) needs the pool's GPU count (--pool-gpus)",
        ),
        (
            KAI_DEFAULT_QUEUES.replace(
                "overQuotaWeight: 1, quota: 0}", "overQuotaWeight: x, quota: 0}"
            ),
            "spec.resources.gpu.overQuotaWeight must be a number",
        ),
        (
            KAI_TEAMS_LIST.replace("limit: 6,", "limit: -5,"),
            "queue 'team-a': spec.resources.gpu.limit must be ≥ 0 or -1, got -5",
        ),
    ],
)
def test_queues_that_cannot_convert_are_one_clear_line_and_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    text: str,
    message: str,
) -> None:
    source = tmp_path / "queues.yaml"
    source.write_text(text)
    code, out, err = run(capsys, "convert", "kai-queues", str(source))
    assert (code, out) == (2, "")
    assert message in err


def test_quota_minus_one_takes_the_whole_pool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "queues.yaml"
    source.write_text(
        KAI_DEFAULT_QUEUES.replace(
            "gpu: {limit: -1, overQuotaWeight: 1, quota: 0}", "gpu: {quota: -1, limit: -1}", 1
        )
    )
    code, out, _ = run(capsys, "convert", "kai-queues", str(source), "--pool-gpus", "64")
    assert code == 0
    assert yaml.safe_load(out)["queues"][0]["quotas"][0]["deserved_cu"] == 64.0
