"""Reading the Alibaba 2023 trace format, on a small pair of CSV files written here."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest
from sim_support import run, scenario_from

from gpufair.sim.scenario import Scenario
from gpufair.sim.source_lines import ScenarioError
from gpufair.sim.trace import (
    DEFAULT_GPU_MODELS,
    NODES_FILE,
    PODS_FILE,
    TraceOptions,
    read_trace,
)

NODES = [
    "sn,cpu_milli,memory_mib,gpu,model",
    *(f"node-g2-{i},96000,786432,8,G2" for i in range(6)),
    *(f"node-t4-{i},64000,262144,2,T4" for i in range(3)),
    "node-p100-0,64000,262144,2,P100",
]
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
    "deletion_time,scheduled_time"
)
PODS = [
    POD_HEADER,
    "pod-a,8000,16384,1,1000,,LS,Running,1000,4600,1000",  # 1 GPU, 1 h
    "pod-b,4000,8192,1,500,T4,BE,Running,1200,2400,1300",  # half a T4, ran 1100 s
    "pod-c,2000,4096,0,0,,BE,Running,1300,9000,1300",  # no GPU: left out
    "pod-d,16000,65536,8,1000,G2|G3|G2,Burstable,Running,1500,9300,2100",  # 8 GPUs, 2 h 10 m
    "pod-e,4000,8192,1,1000,,BE,Pending,1600,1900,",  # never scheduled: wanted 300 s
]


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    (tmp_path / NODES_FILE).write_text("\n".join(NODES) + "\n")
    (tmp_path / PODS_FILE).write_text("\n".join(PODS) + "\n")
    return tmp_path


def options(directory: Path, **overrides: object) -> TraceOptions:
    fields: dict[str, object] = {
        "directory": directory,
        "pool": "default",
        "qos_queues": {"LS": "online", "BE": "batch", "Burstable": "batch"},
    }
    fields.update(overrides)
    return TraceOptions(**fields)  # type: ignore[arg-type]


def test_pods_become_one_pod_workloads_with_compressed_arrivals(trace_dir: Path) -> None:
    replay = read_trace(options(trace_dir, time_compression=10))
    jobs = {j.workload.uid: j for j in replay.jobs}
    assert list(jobs) == ["pod-a", "pod-b", "pod-d", "pod-e"]
    a, b, d, e = jobs.values()
    assert (a.workload.submit_time_s, a.duration_s, a.workload.gpus_per_pod) == (0, 3600, 1)
    assert a.workload.queue == "online" and b.workload.queue == "batch"
    assert (b.workload.submit_time_s, b.duration_s, b.workload.gpus_per_pod) == (20, 1100, 0.5)
    assert b.workload.allowed_gpu_types == ("t4",)
    assert d.workload.allowed_gpu_types == ("g2", "g3")
    assert (d.workload.gpus_per_pod, d.duration_s) == (8, 7200)
    assert (d.workload.cpu_millicores_per_pod, d.workload.memory_mib_per_pod) == (16000, 65536)
    assert e.duration_s == 300  # never scheduled: replayed for as long as it was wanted
    assert all(j.workload.preemptible for j in replay.jobs)
    assert "trace: 5 pods read, 4 replayed" in replay.notes


def test_options_skip_unscheduled_pods_and_mark_qos_non_preemptible(trace_dir: Path) -> None:
    replay = read_trace(options(trace_dir, skip_unscheduled=True, non_preemptible_qos=("LS",)))
    assert [j.workload.uid for j in replay.jobs] == ["pod-a", "pod-b", "pod-d"]
    assert [j.workload.preemptible for j in replay.jobs] == [False, True, True]


def test_queues_by_name_hash_are_stable(trace_dir: Path) -> None:
    names = ("team-a", "team-b", "team-c")
    replay = read_trace(options(trace_dir, qos_queues={}, queue_names=names))
    for job in replay.jobs:
        expected = names[zlib.crc32(job.workload.uid.encode()) % 3]
        assert job.workload.queue == expected


def test_a_node_subset_keeps_the_gpu_model_mix(trace_dir: Path) -> None:
    replay = read_trace(options(trace_dir, node_count=5, seed=4))
    models = [n.gpu_type for n in replay.nodes]
    # 5 of 10 nodes: G2 6 -> 3, T4 3 -> 1.5, P100 1 -> 0.5; the last node by largest remainder,
    # ties by model name (P100 before T4).
    assert sorted(models) == ["g2", "g2", "g2", "p100", "t4"]
    assert replay.nodes == read_trace(options(trace_dir, node_count=5, seed=4)).nodes
    # Every model of the table is a GPU type, with its documented weight and memory.
    types = {t.name: t for t in replay.gpu_types}
    assert set(types) == {m.type_name for m in DEFAULT_GPU_MODELS.values()}
    assert (types["t4"].memory_gib, types["t4"].compute_weight) == (16, 1.5)


def test_an_unknown_gpu_model_names_the_file_and_line(trace_dir: Path) -> None:
    (trace_dir / PODS_FILE).write_text("\n".join([*PODS, "pod-f,1,1,1,1000,H800,BE,x,9,99,9"]))
    data = trace_scenario_data()
    with pytest.raises(ScenarioError) as caught:
        scenario_from(data, trace_dir=trace_dir)
    (problem,) = caught.value.problems
    assert problem.path == "trace"
    assert problem.message == (
        f"{trace_dir / PODS_FILE}:7: gpu_spec names unknown GPU model 'H800'"
    )


def test_a_row_cut_short_names_the_file_line_and_first_missing_column(trace_dir: Path) -> None:
    """A file cut off mid-row (an interrupted download) is a problem with its line, not a crash."""
    (trace_dir / PODS_FILE).write_text("\n".join([*PODS, "pod-f,4000,8192,1"]) + "\n")
    (trace_dir / NODES_FILE).write_text("\n".join([*NODES, "node-x,64000"]) + "\n")
    with pytest.raises(ScenarioError) as caught:
        scenario_from(trace_scenario_data(), trace_dir=trace_dir)
    (problem,) = caught.value.problems
    assert problem.message == (
        f"{trace_dir / NODES_FILE}:12: the row ends before column memory_mib (3 of 5 missing)"
    )
    (trace_dir / NODES_FILE).write_text("\n".join(NODES) + "\n")
    with pytest.raises(ScenarioError) as caught:
        scenario_from(trace_scenario_data(), trace_dir=trace_dir)
    (problem,) = caught.value.problems
    assert problem.message == (
        f"{trace_dir / PODS_FILE}:7: the row ends before column gpu_milli (7 of 11 missing)"
    )


def test_files_saved_with_a_byte_order_mark_read_alike(trace_dir: Path) -> None:
    """A spreadsheet's "CSV UTF-8" starts with a byte order mark; the first column is still
    `name` (and `sn`), not a missing one."""
    plain = read_trace(options(trace_dir))
    for name in (NODES_FILE, PODS_FILE):
        (trace_dir / name).write_bytes(b"\xef\xbb\xbf" + (trace_dir / name).read_bytes())
    marked = read_trace(options(trace_dir))
    assert [j.workload.uid for j in marked.jobs] == ["pod-a", "pod-b", "pod-d", "pod-e"]
    assert (marked.nodes, marked.jobs) == (plain.nodes, plain.jobs)


def trace_scenario_data() -> dict[str, object]:
    return {
        "name": "replay",
        "cycle_s": 60,
        "cluster": {
            "pools": [{"name": "default"}],
            "queues": [
                {"name": "online", "quotas": [{"pool": "default", "deserved_cu": 8}]},
                {"name": "batch", "quotas": [{"pool": "default", "deserved_cu": 8}]},
            ],
        },
        "trace": {
            "dir": "no/such/folder",  # --trace-dir wins
            "qos_queues": {"LS": "online", "BE": "batch", "Burstable": "batch"},
            "gpu_models": {"T4": {"memory_gib": 16, "compute_weight": 2}},
        },
    }


def test_a_trace_scenario_runs_its_pods_on_its_nodes(trace_dir: Path) -> None:
    scenario: Scenario = scenario_from(trace_scenario_data(), trace_dir=trace_dir)
    assert len(scenario.cluster.nodes) == 10
    t4 = next(t for t in scenario.cluster.gpu_types if t.name == "t4")
    assert t4.compute_weight == 2  # the scenario's override of the table
    # Without duration_s: the last arrival plus one day.
    assert scenario.duration_s == 600 + 86_400
    result, metrics = run(scenario)
    done = {j.workload.uid: (j.first_start_s, j.end_s) for j in result.jobs}
    assert done["pod-a"] == (0.0, 3600.0)
    assert done["pod-b"] == (240.0, 1340.0)  # arrives at 200 s, starts at the next cycle
    assert done["pod-d"][1] is not None
    assert sum(q.jobs_started for q in metrics.queues) == 4


def test_a_pod_deleted_before_it_was_scheduled_names_the_file_and_line(trace_dir: Path) -> None:
    """Times out of order within a row are a broken row, not a pod that ran for one second."""
    bad = "pod-f,4000,8192,1,1000,,LS,Running,1700,1500,1800"  # deleted 300 s before scheduled
    (trace_dir / PODS_FILE).write_text("\n".join([*PODS, bad]) + "\n")
    with pytest.raises(ScenarioError) as caught:
        scenario_from(trace_scenario_data(), trace_dir=trace_dir)
    (problem,) = caught.value.problems
    assert problem.message == (
        f"{trace_dir / PODS_FILE}:7: deletion_time 1500 is before scheduled_time 1800"
    )
    never = "pod-f,4000,8192,1,1000,,BE,Pending,1700,1600,"  # never scheduled, deleted first
    (trace_dir / PODS_FILE).write_text("\n".join([*PODS, never]) + "\n")
    with pytest.raises(ScenarioError) as caught:
        scenario_from(trace_scenario_data(), trace_dir=trace_dir)
    (problem,) = caught.value.problems
    assert problem.message == (
        f"{trace_dir / PODS_FILE}:7: deletion_time 1600 is before creation_time 1700"
    )


def test_an_empty_file_says_so(trace_dir: Path) -> None:
    (trace_dir / PODS_FILE).write_text("")
    with pytest.raises(ScenarioError) as caught:
        scenario_from(trace_scenario_data(), trace_dir=trace_dir)
    (problem,) = caught.value.problems
    assert problem.message == f"{trace_dir / PODS_FILE}:1: the file is empty (no header row)"
