"""Scenario files: what is accepted, and errors that name the field path and the line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from sim_support import EXAMPLES

from gpufair.sim.scenario import EvictionMode, load_scenario, parse_scenario
from gpufair.sim.source_lines import ScenarioError

CLUSTER = """\
cluster:
  gpu_types:
    - {name: unit, memory_gib: 80, compute_weight: 1}
  pools:
    - name: default
      policy: {window_s: 1d, k: 2}
  queues:
    - name: team
      quotas:
        - pool: default
          deserved_cu: 4
  nodes:
    - {name: n1, pool: default, gpu_type: unit, gpu_count: 8, cpu_millicores: 64000, memory_mib: 65536}
"""


def scenario_text(body: str, cluster: str = CLUSTER) -> str:
    return "name: test\nduration_s: 1d\n" + cluster + textwrap.dedent(body)


def problems(text: str) -> list[tuple[int | None, str, str]]:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(text, "s.yaml", base_dir=EXAMPLES)
    return [(p.line, p.path, p.message) for p in caught.value.problems]


def test_a_valid_scenario_reads_durations_defaults_and_the_cluster_section() -> None:
    scenario = parse_scenario(
        scenario_text(
            """\
            cycle_s: 2m
            on_evict: restart
            workloads:
              - {queue: team, pods: 2, gpus_per_pod: 4, submit_s: 1h, duration_s: 90m}
            generators:
              - queue: team
                rate_per_h: 6
                gpus_per_pod: {choice: [1, 2]}
                duration_s: {exponential: 30m, max: 2h}
            """
        )
    )
    assert scenario.duration_s == 86_400 and scenario.cycle_s == 120
    assert scenario.on_evict is EvictionMode.RESTART
    (pool,) = scenario.cluster.pools
    assert pool.policy.window_s == 86_400 and pool.policy.k == 2
    (job,) = scenario.jobs
    assert job.workload.uid == "team-0" and job.workload.pool == "default"
    assert (job.workload.submit_time_s, job.duration_s, job.workload.total_gpus) == (3600, 5400, 8)
    (generator,) = scenario.generators
    assert generator.name == "team-g0" and generator.stop_s == 86_400
    assert generator.duration.mean == 1800 and generator.duration.upper == 7200


def test_every_example_scenario_is_valid(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The trace replay needs the trace folder; an empty pair of CSVs stands in for it here.
    (tmp_path / "openb_node_list_gpu_node.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\n")
    (tmp_path / "openb_pod_list_gpuspec33.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
        "deletion_time,scheduled_time\n"
    )
    monkeypatch.setenv("GPUFAIR_TRACE_DIR", str(tmp_path))
    names = sorted(path.stem for path in EXAMPLES.glob("*.yaml"))
    assert len(names) == 8
    for path in EXAMPLES.glob("*.yaml"):
        assert load_scenario(path).name == path.stem


def test_a_misspelt_field_is_named_with_its_line() -> None:
    text = scenario_text(
        """\
        workloads:
          - queue: team
            duration_s: 1h
            gpus_per_pdo: 2
        """
    )
    assert problems(text) == [(19, "workloads[0].gpus_per_pdo", "Extra inputs are not permitted")]


def test_a_bad_duration_and_a_bad_distribution_are_reported_together() -> None:
    text = scenario_text(
        """\
        cycle_s: 5 minutes
        generators:
          - queue: team
            backlog: 2
            duration_s: {lognormal: {median: 2h}}
        """
    )
    found = problems(text)
    assert (16, "cycle_s", "'5 minutes' is not a duration (e.g. 90s, 30m, 36h, 7d)") in found
    assert (
        20,
        "generators[0].duration_s",
        "lognormal: expected {median: ..., sigma: ...}",
    ) in found


def test_a_generator_needs_exactly_one_arrival_process() -> None:
    text = scenario_text(
        """\
        generators:
          - queue: team
            duration_s: 1h
        """
    )
    ((line, path, message),) = problems(text)
    assert (line, path) == (17, "generators[0]")
    assert "exactly one of rate_per_h" in message


def test_unknown_queues_pools_and_types_are_all_listed_with_their_lines() -> None:
    text = scenario_text(
        """\
        workloads:
          - {queue: nobody, duration_s: 1h}
          - {queue: team, pool: elsewhere, duration_s: 1h, gpu_types: [h100]}
        """
    )
    assert problems(text) == [
        (17, "workloads[0].queue", "unknown queue 'nobody'"),
        (18, "workloads[1].pool", "unknown pool 'elsewhere'"),
        (18, "workloads[1].gpu_types[0]", "unknown GPU type 'h100'"),
    ]


def test_workload_rules_of_the_service_apply() -> None:
    text = scenario_text(
        """\
        workloads:
          - {queue: team, duration_s: 1h, pods: 2, min_pods: 3, gpus_per_pod: 1.5}
        """
    )
    found = {(path, line) for line, path, _ in problems(text)}
    assert found == {("workloads[0].min_pods", 17), ("workloads[0].gpus_per_pod", 17)}


def test_cluster_section_errors_carry_the_cluster_path_and_line() -> None:
    bad_type = CLUSTER.replace("deserved_cu: 4", "deserved_cu: lots")
    ((line, path, message),) = problems(scenario_text("", bad_type))
    assert (line, path) == (13, "cluster.queues[0].quotas[0].deserved_cu")
    assert "lots" in message
    bad_node = CLUSTER.replace("gpu_type: unit, gpu_count", "gpu_type: h100, gpu_count")
    assert problems(scenario_text("", bad_node)) == [
        (15, "cluster.nodes[0].gpu_type", "unknown GPU type 'h100'")
    ]
    bad_enum = CLUSTER.replace("{window_s: 1d, k: 2}", "{window_kind: rolling}")
    ((line, path, message),) = problems(scenario_text("", bad_enum))
    assert (line, path) == (8, "cluster.pools[0].policy.window_kind")
    assert "sliding" in message


def test_a_value_of_the_wrong_kind_in_the_cluster_section_is_named_by_its_path() -> None:
    """Protobuf's parser names no index for some of these ("Failed to parse nodes field: ...");
    the problem still carries the element's path and line, and a message without the prefixes."""
    two_nodes = CLUSTER + (
        "    - {name: n2, pool: default, gpu_type: unit, gpu_count: eight, cpu_millicores: 1,"
        " memory_mib: 1}\n"
    )
    assert problems(scenario_text("", two_nodes)) == [
        (16, "cluster.nodes[1].gpu_count", "expected a whole number, got 'eight'")
    ]
    number_name = CLUSTER.replace("- name: team", "- name: 2024")
    assert problems(scenario_text("", number_name)) == [
        (
            10,
            "cluster.queues[0].name",
            "expected text, got 2024; in YAML, write it in quotes: '2024'",
        )
    ]


def test_a_cluster_file_is_read_relative_to_the_scenario_and_its_errors_name_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "clusters").mkdir()
    (tmp_path / "clusters" / "c.yaml").write_text(
        CLUSTER.removeprefix("cluster:\n").replace("\n  ", "\n").lstrip()
    )
    scenario_file = tmp_path / "s.yaml"
    scenario_file.write_text("name: x\nduration_s: 1h\ncluster_file: clusters/c.yaml\n")
    assert load_scenario(scenario_file).cluster.queues[0].name == "team"
    broken = (tmp_path / "clusters" / "c.yaml").read_text().replace("gpu_type: unit", "gpu_type: x")
    (tmp_path / "clusters" / "c.yaml").write_text(broken)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(scenario_file)
    assert str(caught.value) == (
        f"{tmp_path / 'clusters' / 'c.yaml'}:12: nodes[0].gpu_type: unknown GPU type 'x'"
    )


def test_text_that_is_not_yaml_names_the_line() -> None:
    ((line, path, _),) = problems("name: x\nduration_s: 1d\ncluster: {pools: [\n")
    assert (line, path) == (4, "(yaml)")


def test_a_key_given_twice_is_a_problem_not_a_silent_override() -> None:
    """YAML loaders keep the last of two equal keys: a second `generators:` block would drop the
    first without a word. Keys merged in with `<<` may still be overridden."""
    body = """\
        generators:
          - {queue: team, rate_per_h: 1, duration_s: 1h}
        workloads:
          - {queue: team, duration_s: 1h, pods: 1, gpus_per_pod: 1}
        generators:
          - {queue: team, rate_per_h: 2, duration_s: 2h}
        """
    assert problems(scenario_text(body)) == [
        (20, "generators", "given twice (first on line 16); the second would replace the first")
    ]
    nested = CLUSTER.replace("deserved_cu: 4", "deserved_cu: 4\n          deserved_cu: 8")
    assert problems(scenario_text("", nested)) == [
        (
            14,
            "cluster.queues[0].quotas[0].deserved_cu",
            "given twice (first on line 13); the second would replace the first",
        )
    ]
    merged = """\
        defaults: &job {queue: team, duration_s: 1h}
        workloads:
          - {<<: *job, duration_s: 2h}
        """
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(scenario_text(merged))
    assert [p.path for p in caught.value.problems] == ["defaults"]  # not a known field


def test_seed_given_on_the_command_line_wins() -> None:
    text = scenario_text("seed: 5\n")
    assert parse_scenario(text).seed == 5
    assert parse_scenario(text, seed=9).seed == 9


def test_booleans_are_read_alike_in_the_workloads_and_in_the_cluster_section() -> None:
    """A quoted "yes" or a 1 is not a boolean anywhere in a scenario: the workloads (pydantic,
    strict) refuse it as the cluster section (protobuf JSON) does, each with its field."""
    quoted = scenario_text(
        """\
        workloads:
          - {queue: team, duration_s: 1h, preemptible: "yes"}
          - {queue: team, duration_s: 1h, preemptible: 1}
          - {queue: team, duration_s: 1h, preemptible: false}
        """
    )
    assert [(line, path) for line, path, _ in problems(quoted)] == [
        (17, "workloads[0].preemptible"),
        (18, "workloads[1].preemptible"),
    ]
    not_ready = CLUSTER.replace("memory_mib: 65536}", 'memory_mib: 65536, ready: "yes"}')
    ((line, path, _),) = problems(scenario_text("", not_ready))
    assert (line, path) == (15, "cluster.nodes[0].ready")
