"""The pure parts of the Slurm bridge: the mapping file, Slurm's notations, jobs and nodes in
gpufair's terms (and why a job cannot be), and event ids a restarted bridge derives again.
No Slurm needed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpufair.config_file import ConfigFileError
from gpufair.integrations.slurm import events
from gpufair.integrations.slurm.config import BridgeConfig, FeatureRule, load_config, parse_config
from gpufair.integrations.slurm.mapping import (
    Unmappable,
    job_id_of,
    map_job,
    map_node,
    node_pool,
)
from gpufair.integrations.slurm.records import (
    SlurmJob,
    expand_hostlist,
    gpu_indices,
    parse_job,
    parse_node,
)
from gpufair.v1 import ledger_pb2

ROOT = Path(__file__).resolve().parents[3]
CONFIG = parse_config(
    {
        "partitions": {"gpu": "main"},
        "accounts": {"vision": "vision-train"},
        "gpu_types": {"a100": "a100-80gb", "rtx4090": "rtx4090-24gb"},
        "features": {"gpumem40": {"min_gpu_memory_gib": 40}},
        "non_preemptible_qos": ["inference"],
    }
)

# A held job as `squeue --json` (Slurm 22.05) prints it; only the fields the bridge reads.
RAW_JOB: dict[str, Any] = {
    "job_id": 42,
    "job_state": "PENDING",
    "state_reason": "JobHeldUser",
    "partition": "gpu",
    "account": "vision",
    "qos": "",
    "priority": 0,
    "nice": None,
    "node_count": 2,
    "max_nodes": 2,
    "cpus": 8,
    "minimum_cpus_per_node": 4,
    "memory_per_node": 16000,
    "memory_per_cpu": None,
    "tres_per_node": "gres:gpu:4",
    "tres_per_job": "",
    "tres_per_task": "",
    "features": "",
    "nodes": "",
    "gres_detail": [],
    "restart_cnt": 0,
    "submit_time": 1796136508,
    "start_time": 0,
    "end_time": 0,
    "comment": "",
    "array_task_string": "",
    "array_task_id": None,
}


def job(**changes: Any) -> SlurmJob:
    return replace(parse_job(RAW_JOB), **changes)


def test_mapping_file_errors_are_listed_together_with_their_fields(tmp_path: Path) -> None:
    path = tmp_path / "bridge.yaml"
    path.write_text(
        "partitions: {}\ngpu_types: {a100: 'a 100'}\ncycle_s: -1\nfeatures: {x: {gpu_typ: []}}\n"
        "colour: blue\n"
    )
    with pytest.raises(ConfigFileError) as err:
        load_config(path)
    message = str(err.value)
    for expected in (
        "colour: unknown field",
        "partitions: expected a non-empty mapping",
        "gpu_types.a100: expected a name",
        "cycle_s: expected a positive duration",
        "features.x: expected gpu_types and/or min_gpu_memory_gib",
    ):
        assert expected in message


def test_example_mapping_file_loads() -> None:
    config = load_config(ROOT / "examples" / "slurm" / "bridge.yaml")
    assert config == BridgeConfig(
        partitions={"gpu": "gpu"},
        gpu_types={"a100": "a100-80gb", "rtx4090": "rtx4090-24gb"},
        accounts={"acct-a": "team-a", "acct-b": "team-b"},
        default_queue="",
        features={"gpumem40": FeatureRule(gpu_types=(), min_gpu_memory_gib=40.0)},
        non_preemptible_qos=frozenset({"inference"}),
        uid_prefix="slurm-",
        cycle_s=5.0,
        heartbeat_s=60.0,
        slurm_bin="",
    )
    assert config.pools == ["gpu"]
    assert (config.queue_of("acct-a"), config.queue_of("acct-b"), config.queue_of("x")) == (
        "team-a",
        "team-b",
        "",
    )


def test_default_queue_takes_the_accounts_not_listed() -> None:
    config = replace(CONFIG, default_queue="shared")
    workload = map_job(config, job(account="finance"))
    assert not isinstance(workload, Unmappable) and workload.queue == "shared"
    listed = map_job(config, job(account="vision"))
    assert not isinstance(listed, Unmappable) and listed.queue == "vision-train"


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"default_queue": 3}, "default_queue: expected a queue name, got 3"),
        ({"uid_prefix": "bad prefix!"}, "uid_prefix: expected [A-Za-z0-9._-]*, got 'bad prefix!'"),
        ({"uid_prefix": 7}, "uid_prefix: expected [A-Za-z0-9._-]*, got 7"),
        ({"heartbeat_s": "soon"}, "heartbeat_s"),
        ({"non_preemptible_qos": "inference"}, "non_preemptible_qos: expected a list of QOS names"),
        ({"slurm_bin": ["/bin"]}, "slurm_bin: expected a folder"),
    ],
)
def test_mapping_file_field_errors(changes: dict[str, Any], error: str) -> None:
    base = {"partitions": {"gpu": "main"}, "gpu_types": {"a100": "a100-80gb"}}
    with pytest.raises(ConfigFileError) as err:
        parse_config({**base, **changes})
    assert str(err.value).startswith("the mapping file is invalid:\n  - " + error), err.value
    assert str(err.value).count("\n  - ") == 1


def test_uid_prefix_names_the_workloads_of_this_bridge_only() -> None:
    bare = replace(CONFIG, uid_prefix="")
    workload = map_job(bare, job())
    assert not isinstance(workload, Unmappable) and workload.uid == "42"
    assert (job_id_of(bare, "42"), job_id_of(bare, "slurm-42")) == (42, None)
    dotted = parse_config(
        {"partitions": {"gpu": "main"}, "gpu_types": {"a100": "a"}, "uid_prefix": "site.b-"}
    )
    assert dotted.uid_prefix == "site.b-"
    assert [job_id_of(dotted, uid) for uid in ("site.b-7", "slurm-7", "site.b-7x", "site.b-")] == [
        7,
        None,
        None,
        None,
    ]


def test_unreadable_or_malformed_mapping_file_is_reported_with_its_path(tmp_path: Path) -> None:
    absent = tmp_path / "absent.yaml"
    with pytest.raises(ConfigFileError) as err:
        load_config(absent)
    assert str(err.value) == f"{absent}: cannot read: No such file or directory"
    with pytest.raises(ConfigFileError) as err:
        load_config(tmp_path)
    assert str(err.value) == f"{tmp_path}: cannot read: Is a directory"
    broken = tmp_path / "broken.yaml"
    broken.write_text("partitions: [gpu\n")
    with pytest.raises(ConfigFileError) as err:
        load_config(broken)
    assert str(err.value).startswith(f"{broken}: not valid YAML: ")
    listed = tmp_path / "list.yaml"
    listed.write_text("- gpu\n")
    with pytest.raises(ConfigFileError) as err:
        load_config(listed)
    assert str(err.value) == f"{listed}: the mapping file: expected a mapping at the top"


def test_hostlists_and_gpu_indices() -> None:
    assert expand_hostlist("a100-[0-1],rtx-[08-10],login") == [
        "a100-0",
        "a100-1",
        "rtx-08",
        "rtx-09",
        "rtx-10",
        "login",
    ]
    assert expand_hostlist("") == []
    assert gpu_indices("gpu:a100:4(IDX:0,2-3,7)") == [0, 2, 3, 7]
    assert gpu_indices("gpu:a100:0(IDX:N/A)") == []


def test_held_two_node_job_becomes_a_gang_workload() -> None:
    workload = map_job(CONFIG, job(nice=-5))
    assert not isinstance(workload, Unmappable)
    assert (workload.uid, workload.queue, workload.pool) == ("slurm-42", "vision-train", "main")
    assert (workload.pods, workload.gpus_per_pod) == (2, 4)
    assert (workload.cpu_millicores_per_pod, workload.memory_mib_per_pod) == (4000, 16000)
    assert list(workload.allowed_gpu_types) == [] and workload.min_gpu_memory_gib == 0
    assert workload.priority_class == 5 and workload.preemptible
    # Slurm's whole second, and the job id's last six digits as microseconds (job-id order).
    assert (workload.submit_time.seconds, workload.submit_time.nanos) == (1796136508, 42_000)
    later = map_job(CONFIG, job(job_id=1_234_567))
    assert not isinstance(later, Unmappable) and later.submit_time.nanos == 234_567_000
    assert job_id_of(CONFIG, workload.uid) == 42
    # Slurm runs the job's two tasks on two distinct nodes: gpufair must never put both on one.
    assert workload.pods_on_distinct_nodes is True
    single = map_job(CONFIG, job(node_count=1, max_nodes=1))
    assert not isinstance(single, Unmappable) and single.pods_on_distinct_nodes is False


def test_gpu_type_constraint_memory_and_qos_map_to_workload_fields() -> None:
    typed = map_job(CONFIG, job(tres_per_node="gres:gpu:a100:8", qos="inference"))
    assert not isinstance(typed, Unmappable)
    assert list(typed.allowed_gpu_types) == ["a100-80gb"] and typed.preemptible is False
    either = map_job(CONFIG, job(features="a100|rtx4090"))
    assert not isinstance(either, Unmappable)
    assert list(either.allowed_gpu_types) == ["a100-80gb", "rtx4090-24gb"]
    big = map_job(CONFIG, job(features="gpumem40", memory_per_node_mib=0, memory_per_cpu_mib=2048))
    assert not isinstance(big, Unmappable)
    assert big.min_gpu_memory_gib == 40 and list(big.allowed_gpu_types) == []
    assert big.memory_mib_per_pod == 4 * 2048
    per_job = map_job(
        CONFIG, job(tres_per_node="", tres_per_job="gres:gpu:8", node_count=1, max_nodes=1)
    )
    assert not isinstance(per_job, Unmappable) and per_job.gpus_per_pod == 8


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"account": "finance"}, "account 'finance' maps to no gpufair queue"),
        ({"tres_per_node": ""}, "the job asks for no GPU (use --gres=gpu:N)"),
        ({"max_nodes": 4}, "a node range (2-4) is not supported"),
        ({"tres_per_node": "gres:gpu:h100:1"}, "GPU type 'h100' is not in the bridge's gpu_types"),
        (
            {"tres_per_node": "", "tres_per_job": "gres:gpu:8"},
            "--gpus=8 over 2 nodes: Slurm may give each node a different count; "
            "ask --gres=gpu:N per node",
        ),
        # A node feature gpufair cannot read is refused, in an AND as alone.
        ({"features": "a100&ib"}, "constraint 'ib' is not in the bridge's features or gpu_types"),
        ({"features": "fast"}, "constraint 'fast' is not in the bridge's features or gpu_types"),
        (
            {"tres_per_node": "gres:gpu:a100:1", "features": "rtx4090"},
            "GPU type 'a100' contradicts the constraint",
        ),
        ({"is_array": True}, "job arrays are not supported; submit one job per task"),
        (
            {"tres_per_task": "gres:gpu:1"},
            "--gpus-per-task is not supported; ask --gres=gpu:N per node",
        ),
        ({"partition": "gpu,debug"}, "submitted to several partitions (gpu,debug); name one"),
    ],
)
def test_unmappable_jobs_say_why(changes: dict[str, Any], reason: str) -> None:
    assert map_job(CONFIG, job(**changes)) == Unmappable(reason)


def test_cpus_per_task_is_not_a_gpu_request() -> None:
    workload = map_job(CONFIG, job(tres_per_task="cpu:4"))
    assert not isinstance(workload, Unmappable) and workload.gpus_per_pod == 4


# Feature rules that name gpufair GPU types, with and without GPU memory.
TYPED = replace(
    CONFIG,
    features={
        "gpumem40": FeatureRule(min_gpu_memory_gib=40),
        "gpumem80": FeatureRule(min_gpu_memory_gib=80),
        "fast": FeatureRule(gpu_types=("a100-80gb",)),
        "big": FeatureRule(gpu_types=("a100-80gb", "h100-80gb"), min_gpu_memory_gib=80),
    },
)


@pytest.mark.parametrize(
    ("tres", "features", "types", "memory_gib"),
    [
        ("gres:gpu:4", "fast", ["a100-80gb"], 0),
        ("gres:gpu:4", "big", ["a100-80gb", "h100-80gb"], 80),
        ("gres:gpu:4", "fast|rtx4090", ["a100-80gb", "rtx4090-24gb"], 0),
        # Either memory: the lesser. A typed rule asking at least that memory adds nothing.
        ("gres:gpu:4", "gpumem80|gpumem40", [], 40),
        ("gres:gpu:4", "big|gpumem40", [], 40),
        # The GRES type narrows the rule's types.
        ("gres:gpu:a100:4", "big", ["a100-80gb"], 80),
    ],
)
def test_constraint_features_map_to_gpu_types_and_memory(
    tres: str, features: str, types: list[str], memory_gib: float
) -> None:
    workload = map_job(TYPED, job(tres_per_node=tres, features=features))
    assert not isinstance(workload, Unmappable), workload
    assert (list(workload.allowed_gpu_types), workload.min_gpu_memory_gib) == (types, memory_gib)


def test_alternatives_of_types_and_memory_become_gpu_types_by_their_memory() -> None:
    # An A100, or any type with 40 GiB: no (types, memory) says that, so the GPU types of
    # gpufair's config that either admits (test_slurm_constraints.py: every combination).
    memory = {"a100-80gb": 80.0, "rtx4090-24gb": 24.0, "h100-80gb": 80.0}
    for features, types in (("a100|gpumem40", ["a100-80gb"]), ("fast|big", ["a100-80gb"])):
        workload = map_job(TYPED, job(features=features), gpu_memory=lambda: memory)
        assert not isinstance(workload, Unmappable), workload
        assert (list(workload.allowed_gpu_types), workload.min_gpu_memory_gib) == (types, 0)
    contradicted = map_job(TYPED, job(tres_per_node="gres:gpu:rtx4090:4", features="fast"))
    assert contradicted == Unmappable("GPU type 'rtx4090' contradicts the constraint")


def test_node_pool_is_that_of_the_first_mapped_partition_in_the_mapping_file() -> None:
    node = parse_node(
        {"name": "a100-0", "partitions": ["gpu", "a100"], "gres": "gpu:a100:8", "state": "idle"}
    )
    fast_first = replace(CONFIG, partitions={"a100": "fast", "gpu": "main"})
    main_first = replace(CONFIG, partitions={"gpu": "main", "a100": "fast"})
    assert (node_pool(fast_first, node), node_pool(main_first, node)) == ("fast", "main")
    assert node_pool(CONFIG, replace(node, partitions=("debug",))) is None


@pytest.mark.parametrize(
    ("state", "flags", "base", "ready"),
    [
        ("idle", [], "idle", True),
        ("MIXED", [], "MIXED", True),
        ("allocated", ["COMPLETING"], "allocated", True),
        ("idle+drain", [], "idle", False),
        ("mixed+draining", [], "mixed", False),
        ("idle", ["DRAIN"], "idle", False),
        ("idle", ["MAINTENANCE"], "idle", False),
        # Slurm's mark of a node that does not respond.
        ("idle*", [], "idle", False),
        ("down*", [], "down", False),
        ("idle+drain*", [], "idle", False),
        ("future", [], "future", False),
    ],
)
def test_node_states_compound_or_flagged(
    state: str, flags: list[str], base: str, ready: bool
) -> None:
    node = parse_node({"name": "a100-0", "state": state, "state_flags": flags})
    assert (node.state, node.ready) == (base, ready)


def test_nodes_map_with_their_type_and_readiness() -> None:
    raw = {
        "name": "a100-0",
        "partitions": ["gpu"],
        "gres": "gpu:a100:8(S:0-1)",
        "cpus": 64,
        "real_memory": 512000,
        "state": "idle",
        "state_flags": [],
        "features": "a100,gpumem40",
    }
    node = map_node(CONFIG, parse_node(raw))
    assert node is not None
    assert (node.pool, node.gpu_type, node.gpu_count) == ("main", "a100-80gb", 8)
    assert (node.cpu_millicores, node.memory_mib, node.ready) == (64000, 512000, True)
    assert dict(node.labels) == {"slurm.feature/a100": "true", "slurm.feature/gpumem40": "true"}
    drained = map_node(CONFIG, parse_node({**raw, "state": "idle", "state_flags": ["DRAIN"]}))
    assert drained is not None and drained.ready is False
    assert map_node(CONFIG, parse_node({**raw, "state": "down"})).ready is False  # type: ignore[union-attr]
    assert map_node(CONFIG, parse_node({**raw, "partitions": ["debug"]})) is None
    assert map_node(CONFIG, parse_node({**raw, "gres": "gpu:h100:8"})) is None


def test_event_ids_and_payloads_are_derived_again_after_a_restart() -> None:
    first = events.started("slurm-42", 0, 1796136514, ["a100-0"], [[0, 1]])
    again = events.started("slurm-42", 0, 1796136514, ["a100-0"], [[0, 1]])
    assert first == again
    assert first.occurred_at.seconds == 1796136514
    assert [(p.node, list(p.gpu_indices)) for p in first.pods] == [("a100-0", [0, 1])]
    rerun = events.started("slurm-42", 1, 1796136600, ["a100-1"], [[3]])
    assert rerun.event_id != first.event_id
    stop = events.ended("slurm-42", 0, 1796136520, ledger_pb2.EVENT_KIND_PREEMPTED)
    assert stop.event_id == events.event_id("slurm-42", 0, "preempted")
    assert events.stamped_requeue_s(events.requeue_stamp(0, 1796136520.25), 0) == 1796136520.25
    assert events.stamped_requeue_s(events.requeue_stamp(0, 1796136520.25), 1) is None
    beat = events.heartbeat("slurm-42", 0, started_s=1796136514, now_s=1796136700, period_s=60)
    assert beat.occurred_at.seconds == 1796136660
    assert beat == events.heartbeat("slurm-42", 0, 1796136514, 1796136719, 60)


@pytest.mark.parametrize(
    ("now_s", "due"),
    [
        (1000.0 + 30, False),  # within the run's first minute
        (1020.0 + 60, True),  # 1080 = 18 x 60: a period's first cycle
        (1089.0, True),  # its second cycle (5 s cycles)
        (1090.0, False),  # later in the period: already sent
        (1140.0, True),  # the next period
    ],
)
def test_heartbeat_is_due_once_per_period_after_the_first(now_s: float, due: bool) -> None:
    assert events.heartbeat_due(1000.0, now_s, period_s=60, cycle_s=5) is due


def test_slurm_bridge_command_refuses_a_bad_mapping_file_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpufair.cli import main

    path = tmp_path / "bridge.yaml"
    path.write_text("partitions: {gpu: main}\n")
    assert main(["slurm-bridge", "--config", str(path), "--once"]) == 2
    assert "gpu_types: required" in capsys.readouterr().err
