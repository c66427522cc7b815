"""Scenarios: what a simulation runs, read from YAML and validated, every problem with its line.

Durations may be written in seconds or as `90s`, `30m`, `36h`, `7d`, `2w` (as in cluster
config files). The shape:

    name: llm-vs-vision-week       # required
    description: ...
    seed: 1                        # default 0; `gpufair simulate --seed N` overrides it
    duration_s: 7d                 # the simulated span; a trace replay defaults to its last
                                   # arrival plus one day
    cycle_s: 60                    # a scheduling cycle every cycle_s (default 60)
    recompute_s: 60                # fair shares recomputed this often (default: each pool's
                                   # policy.recompute_interval_s)
    timeline_s: 10m                # timeline.csv sampling period (default 600 s)
    on_evict: resume               # an evicted job keeps the work it did (`resume`, default) or
                                   # starts over (`restart`)
    cluster: {...}                 # exactly a cluster config file (see examples/clusters) ...
    cluster_file: ../clusters/x.yaml   # ... or one, relative to the scenario file
    workloads: [...]               # explicit jobs
    generators: [...]              # job streams per queue (`generators`)
    trace: {...}                   # Alibaba 2023 trace replay (`trace`)

A run takes at most 1,000,000 cycles (duration_s / cycle_s), as many periodic fair-share
recomputes (duration_s / recompute_s, or each pool's `policy.recompute_interval_s` when
recompute_s is not given) and 100,000 timeline samples (duration_s / timeline_s): a step smaller
than that is a problem named at its field, or at duration_s when the step is the default
(`scenario_checks`). A pool's fair shares are also recomputed before a cycle when its jobs changed
since the latest recompute (`engine`): at most one more per cycle.

A workload: `queue` (a leaf), `pool` (may be left out when the cluster has one pool), `uid`
(default `<queue>-<index>`), `submit_s` (default 0; at or after the end of the run, the job is
not part of it: the summary notes how many such jobs the workloads and the trace hold), `duration_s` (its run time, required), `pods`
(1), `gpus_per_pod` (1; below 1 a share of one GPU), `min_pods` (default: all pods, a gang),
`partition_profile` (each pod one MIG-style instance of that profile; `gpus_per_pod` then comes
from the profile), `compute_units` (an amount of compute instead of `pods`: placement picks the
GPU type and count, `domain/cu_request.py`; `gpus_per_pod` then 1 unless given),
`mixed_gpu_types` (with `compute_units` and `topology`: a mix of types inside one domain),
`preemptible` (true), `gpu_types` (allowed types, default any), `min_gpu_memory_gib`,
`cpu_millicores_per_pod`, `memory_mib_per_pod`, `priority_class`, `min_runtime_s`, `topology`
({level, required}).

A generator: `queue`, `pool`, `name` (default `<queue>-g<index>`; it names the jobs and seeds
their random stream), exactly one of `rate_per_h` (Poisson arrivals) and `backlog` (keeps that
many jobs waiting), `start_s` (0), `stop_s` (the end), `max_jobs`, `pods` and `gpus_per_pod`
(a number or a choice), `duration_s` (a distribution, see `distributions`), `gang` (true), and
the workload fields above from `preemptible` on. A generator that would make no job (`start_s`
at or after its `stop_s` or the end of the run) is a problem.

A trace replay (`trace`, see `trace` for how pods become jobs): `dir` (the folder with the two CSV
files, relative to the current directory; `--trace-dir` and $GPUFAIR_TRACE_DIR override it),
`pool`, exactly one of `queues` (names; pods spread by a hash of their name) and `qos_queues`
(qos -> queue), `node_count` or `node_fraction`, `time_compression`, `duration_compression`,
`start_s`, `skip_unscheduled`, `non_preemptible_qos`, `max_pods`, `gpu_models` (overrides of the
model table: {MODEL: {memory_gib, compute_weight}}), `nodes_file`, `pods_file`. The trace's nodes
join the cluster section's nodes, in its pool; the cluster section then needs no nodes.

The cluster section goes through `config_file.parse_config` and `api.convert_cluster`, the very
code `gpufair apply` uses, then `domain.config_rules.validate_config`, so what is valid there is
valid here.

Jobs go through the service's submit rules (`domain.workload_rules`, as `SubmitWorkloads` applies
them): a workload written here that the service would refuse (a field out of range, or a job that
would not fit its pool even empty) is a problem with its path and line, and so is a generator
that can draw such a job (any of its pod counts with any of its GPUs per pod). Trace rows are
data, not settings: one the service would refuse is refused at its arrival, as the server would
refuse that pod, and counted in the run's outputs (`admission`), the other rows replayed.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    model_validator,
)

from gpufair.api.convert_cluster import config_from_proto
from gpufair.config_file import ConfigFileError, parse_config, parse_duration_s
from gpufair.domain.config_rules import validate_config
from gpufair.domain.model import (
    ClusterConfig,
    FairSharePolicy,
    GpuType,
    NodePool,
    TopologyConstraint,
    Workload,
)
from gpufair.domain.partitions import with_profile_share
from gpufair.domain.workload_rules import workload_violations
from gpufair.sim.admission import Admission
from gpufair.sim.config_errors import split_config_error
from gpufair.sim.distributions import Distribution, constant, parse_distribution
from gpufair.sim.generators import GeneratorSpec
from gpufair.sim.jobspec import JobSpec
from gpufair.sim.scenario_checks import (
    MAX_SAMPLES,
    MAX_STEPS,
    generator_idle,
    generator_problems,
    too_many_steps,
)
from gpufair.sim.source_lines import (
    DuplicateKeyError,
    Problem,
    ScenarioError,
    SourceLines,
    join_path,
    load_yaml_with_lines,
    path_steps,
)
from gpufair.sim.trace import (
    DEFAULT_GPU_MODELS,
    NODES_FILE,
    PODS_FILE,
    TRACE_DIR_ENV,
    GpuModel,
    TraceError,
    TraceOptions,
    read_trace,
)

DEFAULT_TIMELINE_S = 600.0
DEFAULT_CYCLE_S = 60.0
TRACE_TAIL_S = 86_400.0  # a trace replay without duration_s runs this long past its last arrival


class EvictionMode(enum.StrEnum):
    RESUME = "resume"  # an evicted job keeps its progress (checkpointed work)
    RESTART = "restart"  # an evicted job starts from zero


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    seed: int
    duration_s: float
    cycle_s: float
    recompute_s: float | None  # None: each pool's policy.recompute_interval_s
    timeline_s: float
    on_evict: EvictionMode
    cluster: ClusterConfig
    jobs: tuple[JobSpec, ...]
    generators: tuple[GeneratorSpec, ...]
    notes: tuple[str, ...] = ()  # what loading left out or assumed, for the summary

    def recompute_interval_s(self, pool: NodePool) -> float:
        return self.recompute_s or pool.policy.recompute_interval_s

    def with_policy(self, change: Callable[[FairSharePolicy], FairSharePolicy]) -> Scenario:
        """The same scenario with every pool's fair-share policy changed by `change`."""
        pools = tuple(dataclasses.replace(p, policy=change(p.policy)) for p in self.cluster.pools)
        return dataclasses.replace(self, cluster=dataclasses.replace(self.cluster, pools=pools))

    def with_pools(self, change: Callable[[NodePool], NodePool]) -> Scenario:
        """The same scenario with every pool changed by `change` (e.g. `gang_entitlement`)."""
        pools = tuple(change(p) for p in self.cluster.pools)
        return dataclasses.replace(self, cluster=dataclasses.replace(self.cluster, pools=pools))


# ---- the YAML schema ------------------------------------------------------------------------


def _seconds(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return parse_duration_s(value, "")
        except ConfigFileError:
            raise ValueError(f"{value!r} is not a duration (e.g. 90s, 30m, 36h, 7d)") from None
    return value


Seconds = Annotated[float, BeforeValidator(_seconds), Field(ge=0, allow_inf_nan=False)]
PositiveSeconds = Annotated[float, BeforeValidator(_seconds), Field(gt=0, allow_inf_nan=False)]
DurationDist = Annotated[Distribution, PlainValidator(partial(parse_distribution, seconds=True))]
PodsDist = Annotated[Distribution, PlainValidator(partial(parse_distribution, integer=True))]
GpusDist = Annotated[Distribution, PlainValidator(parse_distribution)]


class _Model(BaseModel):
    # Strict, as the cluster section (protobuf JSON) is: a boolean is true or false, a number a
    # number; no "yes" strings or 1 for true.
    model_config = ConfigDict(
        extra="forbid", frozen=True, arbitrary_types_allowed=True, strict=True
    )


class TopologyModel(_Model):
    level: str = Field(min_length=1)
    required: bool = False


class _JobFields(_Model):
    queue: str = Field(min_length=1)
    pool: str | None = None
    preemptible: bool = True
    gpu_types: list[str] = []
    min_gpu_memory_gib: float = Field(0.0, ge=0)
    cpu_millicores_per_pod: int = Field(0, ge=0)
    memory_mib_per_pod: int = Field(0, ge=0)
    priority_class: int = 0
    min_runtime_s: Seconds = 0.0
    topology: TopologyModel | None = None


class WorkloadModel(_JobFields):
    uid: str | None = None
    submit_s: Seconds = 0.0
    duration_s: PositiveSeconds
    pods: int = Field(1, ge=1)
    gpus_per_pod: float = Field(1.0, gt=0)
    min_pods: int | None = Field(None, ge=1)
    partition_profile: str = ""
    compute_units: float = Field(0.0, ge=0, allow_inf_nan=False)
    mixed_gpu_types: bool = False


class GeneratorModel(_JobFields):
    name: str | None = None
    rate_per_h: float | None = Field(None, gt=0, allow_inf_nan=False)
    backlog: int | None = Field(None, ge=1)
    start_s: Seconds = 0.0
    stop_s: PositiveSeconds | None = None
    max_jobs: int | None = Field(None, ge=1)
    pods: PodsDist = constant(1)
    gpus_per_pod: GpusDist = constant(1)
    gang: bool = True
    duration_s: DurationDist

    @model_validator(mode="after")
    def _one_arrival_process(self) -> GeneratorModel:
        if (self.rate_per_h is None) == (self.backlog is None):
            raise ValueError(
                "give exactly one of rate_per_h (Poisson arrivals) and backlog (jobs kept waiting)"
            )
        return self


class GpuModelModel(_Model):
    type_name: str | None = None
    memory_gib: float = Field(gt=0, allow_inf_nan=False)
    compute_weight: float = Field(gt=0, allow_inf_nan=False)


class TraceModel(_Model):
    dir: str | None = None
    nodes_file: str = NODES_FILE
    pods_file: str = PODS_FILE
    pool: str | None = None
    queues: list[str] | None = Field(None, min_length=1)
    qos_queues: dict[str, str] | None = Field(None, min_length=1)
    node_count: int | None = Field(None, ge=1)
    node_fraction: float | None = Field(None, gt=0, le=1)
    time_compression: float = Field(1.0, gt=0, allow_inf_nan=False)
    duration_compression: float = Field(1.0, gt=0, allow_inf_nan=False)
    start_s: Seconds | None = None
    skip_unscheduled: bool = False
    non_preemptible_qos: list[str] = []
    max_pods: int | None = Field(None, ge=1)
    gpu_models: dict[str, GpuModelModel] = {}

    @model_validator(mode="after")
    def _one_of(self) -> TraceModel:
        if (self.queues is None) == (self.qos_queues is None):
            raise ValueError("give exactly one of queues (by name hash) and qos_queues (by qos)")
        if self.node_count is not None and self.node_fraction is not None:
            raise ValueError("give node_count or node_fraction, not both")
        return self


class ScenarioModel(_Model):
    name: str = Field(min_length=1)
    description: str = ""
    seed: int = 0
    duration_s: PositiveSeconds | None = None
    cycle_s: PositiveSeconds = DEFAULT_CYCLE_S
    recompute_s: PositiveSeconds | None = None
    timeline_s: PositiveSeconds = DEFAULT_TIMELINE_S
    on_evict: Literal["resume", "restart"] = "resume"
    cluster: dict[str, Any] | None = None
    cluster_file: str | None = None
    workloads: list[WorkloadModel] = []
    generators: list[GeneratorModel] = []
    trace: TraceModel | None = None

    @model_validator(mode="after")
    def _one_cluster(self) -> ScenarioModel:
        if (self.cluster is None) == (self.cluster_file is None):
            raise ValueError("give exactly one of cluster (inline) and cluster_file")
        return self


# ---- loading --------------------------------------------------------------------------------


def load_scenario(
    path: Path, *, seed: int | None = None, trace_dir: Path | None = None
) -> Scenario:
    """Read and validate a scenario file; raises `ScenarioError` listing every problem."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScenarioError(str(path), [Problem("(file)", exc.strerror or str(exc))]) from None
    return parse_scenario(text, str(path), base_dir=path.parent, seed=seed, trace_dir=trace_dir)


def parse_scenario(
    text: str,
    source: str = "scenario",
    *,
    base_dir: Path | None = None,
    seed: int | None = None,
    trace_dir: Path | None = None,
) -> Scenario:
    """A scenario from YAML text; `source` names it in errors, `base_dir` anchors cluster_file."""
    data, lines = _load_yaml(text, source)
    try:
        model = ScenarioModel.model_validate(data if data is not None else {})
    except ValidationError as exc:
        raise ScenarioError(source, _pydantic_problems(exc, lines)) from None
    return _Builder(
        model, lines, source=source, base_dir=base_dir or Path("."), seed=seed, trace_dir=trace_dir
    ).build()


def _load_yaml(text: str, source: str) -> tuple[Any, SourceLines]:
    try:
        return load_yaml_with_lines(text)
    except DuplicateKeyError as exc:
        message = (
            f"given twice (first on line {exc.first_line}); the second would replace the first"
        )
        raise ScenarioError(source, [Problem(join_path(exc.steps), message, exc.line)]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError(
            source, [Problem("(yaml)", f"not valid YAML: {problem}", line)]
        ) from None


def _pydantic_problems(exc: ValidationError, lines: SourceLines) -> list[Problem]:
    problems = []
    for error in exc.errors():
        steps = [s for s in error["loc"] if isinstance(s, str | int)]
        path = join_path(steps) or "(scenario)"
        message = str(error["msg"]).removeprefix("Value error, ")
        problems.append(Problem(path, message, lines.line_of(steps)))
    return problems


class _Builder:
    """Turns a schema-valid model into a `Scenario`, gathering every cross-field problem."""

    def __init__(
        self,
        model: ScenarioModel,
        lines: SourceLines,
        *,
        source: str,
        base_dir: Path,
        seed: int | None,
        trace_dir: Path | None,
    ) -> None:
        self.model = model
        self.lines = lines
        self.source = source
        self.base_dir = base_dir
        self.seed = model.seed if seed is None else seed
        self.trace_dir = trace_dir
        self.problems: list[Problem] = []
        self.notes: list[str] = []

    def problem(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message, self.lines.line_of(path)))

    def fail_if_any(self) -> None:
        if self.problems:
            raise ScenarioError(self.source, self.problems)

    def build(self) -> Scenario:
        model = self.model
        cluster, yaml_nodes = self._cluster()
        self.fail_if_any()  # without a cluster nothing else can be checked
        trace_jobs: tuple[JobSpec, ...] = ()
        if model.trace is not None:
            cluster, trace_jobs = self._trace(model.trace, cluster)
            self.fail_if_any()  # an unreadable trace leaves no nodes or jobs to check
        self._validate_cluster(cluster, yaml_nodes)
        jobs = self._workloads(cluster) + trace_jobs
        duration_s = model.duration_s
        if duration_s is None:
            if not trace_jobs:
                self.problem("duration_s", "is required (the simulated span, e.g. 7d)")
            else:
                duration_s = max(j.workload.submit_time_s for j in jobs) + TRACE_TAIL_S
        generators = self._generators(cluster, duration_s or math.inf)
        self._unique_uids(jobs)
        if duration_s is not None:
            self._steps(cluster, duration_s)
            self._late(jobs, duration_s)
        self.fail_if_any()
        assert duration_s is not None
        return Scenario(
            name=model.name,
            description=model.description.strip(),
            seed=self.seed,
            duration_s=duration_s,
            cycle_s=model.cycle_s,
            recompute_s=model.recompute_s,
            timeline_s=model.timeline_s,
            on_evict=EvictionMode(model.on_evict),
            cluster=cluster,
            jobs=tuple(sorted(jobs, key=lambda j: (j.workload.submit_time_s, j.workload.uid))),
            generators=generators,
            notes=tuple(self.notes),
        )

    def _late(self, jobs: tuple[JobSpec, ...], duration_s: float) -> None:
        """A note on the listed and trace jobs arriving at or after the end: not part of the run
        (time runs over [0, duration_s)), so a list or trace longer than the span is said so."""
        late = sum(1 for job in jobs if job.workload.submit_time_s >= duration_s)
        if late:
            self.notes.append(
                f"{late} of the scenario's {len(jobs)} jobs arrive at or after the end "
                f"(duration_s {duration_s:g} s): not submitted, no row in jobs.csv"
            )

    def _steps(self, cluster: ClusterConfig, duration_s: float) -> None:
        """Clocks a run can step through in reasonable time (`scenario_checks`); a problem is
        named at the step's field when the scenario gives it, else at duration_s."""
        model = self.model
        given = model.model_fields_set
        clocks = (
            ("cycle_s", model.cycle_s, "cycles", MAX_STEPS),
            ("timeline_s", model.timeline_s, "timeline samples", MAX_SAMPLES),
            ("recompute_s", model.recompute_s, "recomputes", MAX_STEPS),
        )
        for field, step_s, what, bound in clocks:
            if step_s is None:
                continue
            message = too_many_steps(field, step_s, duration_s, what, bound)
            if message is not None:
                self.problem(field if field in given else "duration_s", message)
        if model.recompute_s is not None:
            return
        for index, pool in enumerate(cluster.pools):
            step_s = pool.policy.recompute_interval_s
            message = too_many_steps(
                f"pool {pool.name}'s recompute_interval_s",
                step_s,
                duration_s,
                "recomputes",
                MAX_STEPS,
            )
            if message is not None:
                self._cluster_problem(
                    f"pools[{index}].policy.recompute_interval_s",
                    f"{message}, or set the scenario's recompute_s",
                )

    # -- cluster ----------------------------------------------------------------------------

    def _cluster(self) -> tuple[ClusterConfig, int]:
        """The cluster section as a domain config, and how many nodes the YAML itself lists."""
        model = self.model
        if model.cluster_file is not None:
            path = self.base_dir / model.cluster_file
            try:
                text = path.read_text()
            except OSError as exc:
                self.problem("cluster_file", f"{path}: {exc.strerror or exc}")
                return ClusterConfig(), 0
            try:
                data, lines = _load_yaml(text, str(path))
            except ScenarioError as exc:
                self.problems.extend(dataclasses.replace(p, source=str(path)) for p in exc.problems)
                return ClusterConfig(), 0
            self.cluster_source: tuple[str | None, str, SourceLines] = (str(path), "", lines)
        else:
            data = model.cluster
            self.cluster_source = (None, "cluster.", self.lines.within(("cluster",)))
        try:
            message = parse_config(data or {}, "cluster")
        except ConfigFileError as exc:
            self._cluster_problem(*split_config_error(str(exc), data))
            return ClusterConfig(), 0
        config, violations = config_from_proto(message)
        for violation in violations:
            self._cluster_problem(violation.field_path, violation.message)
        nodes = data.get("nodes") if isinstance(data, dict) else None
        return config, len(nodes) if isinstance(nodes, list) else 0

    def _cluster_problem(self, path: str, message: str) -> None:
        source, prefix, lines = self.cluster_source
        self.problems.append(Problem(prefix + path, message, lines.line_of(path), source))

    def _validate_cluster(self, cluster: ClusterConfig, yaml_nodes: int) -> None:
        if not cluster.pools:
            self._cluster_problem("pools", "a scenario needs at least one pool")
        for violation in validate_config(cluster):
            steps = path_steps(violation.field_path)
            if steps[:1] == ["nodes"] and len(steps) > 1 and int(steps[1]) >= yaml_nodes:
                node = cluster.nodes[int(steps[1])]
                self.problem("trace", f"trace node {node.name}: {violation.message}")
            else:
                self._cluster_problem(violation.field_path, violation.message)

    def _trace(
        self, trace: TraceModel, cluster: ClusterConfig
    ) -> tuple[ClusterConfig, tuple[JobSpec, ...]]:
        pool = trace.pool or _only_pool(cluster)
        if pool is None:
            self.problem("trace.pool", "is required when the cluster has several pools")
            return cluster, ()
        if pool not in {p.name for p in cluster.pools}:
            self.problem("trace.pool", f"unknown pool {pool!r}")
            return cluster, ()
        directory = self.trace_dir or _env_path(TRACE_DIR_ENV)
        if directory is None:
            if trace.dir is None:
                self.problem(
                    "trace.dir",
                    f"no trace folder: give trace.dir, --trace-dir or ${TRACE_DIR_ENV}",
                )
                return cluster, ()
            directory = Path(trace.dir)
        models = dict(DEFAULT_GPU_MODELS)
        for name, override in trace.gpu_models.items():
            type_name = (
                override.type_name or models.get(name, GpuModel(name.lower(), 1, 1)).type_name
            )
            models[name] = GpuModel(type_name, override.memory_gib, override.compute_weight)
        queue_names = {q.name for q in cluster.queues}
        wanted = trace.queues or sorted(set((trace.qos_queues or {}).values()))
        for name in wanted:
            if name not in queue_names:
                field = "trace.queues" if trace.queues else "trace.qos_queues"
                self.problem(field, f"unknown queue {name!r}")
        if self.problems:
            return cluster, ()
        options = TraceOptions(
            directory=directory,
            pool=pool,
            queue_names=tuple(trace.queues or ()),
            qos_queues=dict(trace.qos_queues or {}),
            node_count=trace.node_count,
            node_fraction=trace.node_fraction,
            time_compression=trace.time_compression,
            duration_compression=trace.duration_compression,
            start_s=trace.start_s,
            skip_unscheduled=trace.skip_unscheduled,
            non_preemptible_qos=tuple(trace.non_preemptible_qos),
            max_pods=trace.max_pods,
            gpu_models=models,
            seed=self.seed,
            nodes_file=trace.nodes_file,
            pods_file=trace.pods_file,
        )
        try:
            replay = read_trace(options)
        except TraceError as exc:
            self.problem("trace", str(exc))
            return cluster, ()
        self.notes.extend(replay.notes)
        declared = {t.name for t in cluster.gpu_types}
        gpu_types: tuple[GpuType, ...] = cluster.gpu_types + tuple(
            t for t in replay.gpu_types if t.name not in declared
        )
        merged = dataclasses.replace(
            cluster, gpu_types=gpu_types, nodes=cluster.nodes + replay.nodes
        )
        return merged, replay.jobs

    # -- workloads and generators -------------------------------------------------------------

    def _job_context(self, cluster: ClusterConfig) -> tuple[set[str], set[str], set[str]]:
        pools = {p.name for p in cluster.pools}
        leaves = {q.name for q in cluster.leaf_queues()}
        return pools, leaves, {t.name for t in cluster.gpu_types}

    def _check_job_fields(self, path: str, fields: _JobFields, cluster: ClusterConfig) -> str:
        """Checks the queue, pool and types of a workload or generator; returns the pool."""
        pools, leaves, types = self._job_context(cluster)
        if fields.queue not in {q.name for q in cluster.queues}:
            self.problem(f"{path}.queue", f"unknown queue {fields.queue!r}")
        elif fields.queue not in leaves:
            self.problem(f"{path}.queue", f"queue {fields.queue!r} has child queues; use a leaf")
        pool = fields.pool or _only_pool(cluster)
        if pool is None:
            self.problem(f"{path}.pool", "is required when the cluster has several pools")
            pool = ""
        elif pool not in pools:
            self.problem(f"{path}.pool", f"unknown pool {pool!r}")
        for index, type_name in enumerate(fields.gpu_types):
            if type_name not in types:
                self.problem(f"{path}.gpu_types[{index}]", f"unknown GPU type {type_name!r}")
        return pool

    def _workload_rules(self, path: str, workload: Workload) -> None:
        for violation in workload_violations(workload, path):
            # The service's "a valid instant" rule is about wall-clock time; the simulated clock
            # starts at 0, and submit_s ≥ 0 is checked by the schema.
            if violation.field_path.endswith(".submit_time"):
                continue
            field = violation.field_path.replace(".allowed_gpu_types", ".gpu_types")
            self.problem(field, violation.message)

    def _workloads(self, cluster: ClusterConfig) -> tuple[JobSpec, ...]:
        jobs = []
        admission = Admission(cluster)
        for index, item in enumerate(self.model.workloads):
            path = f"workloads[{index}]"
            known = len(self.problems)
            pool = self._check_job_fields(path, item, cluster)
            given = item.model_fields_set
            asks_gpus = not (item.compute_units or item.partition_profile)
            workload = Workload(
                uid=item.uid or f"{item.queue}-{index}",
                queue=item.queue,
                pool=pool,
                pods=item.pods if "pods" in given or not item.compute_units else 0,
                gpus_per_pod=item.gpus_per_pod if asks_gpus or "gpus_per_pod" in given else 0.0,
                submit_time_s=item.submit_s,
                min_pods=item.min_pods,
                allowed_gpu_types=tuple(item.gpu_types),
                min_gpu_memory_gib=item.min_gpu_memory_gib,
                cpu_millicores_per_pod=item.cpu_millicores_per_pod,
                memory_mib_per_pod=item.memory_mib_per_pod,
                topology=_topology(item.topology),
                priority_class=item.priority_class,
                preemptible=item.preemptible,
                min_runtime_s=item.min_runtime_s,
                partition_profile=item.partition_profile,
                compute_units=item.compute_units,
                mixed_gpu_types=item.mixed_gpu_types,
            )
            self._workload_rules(path, workload)
            workload, problem = with_profile_share(workload, {t.name: t for t in cluster.gpu_types})
            if problem is not None:
                self.problem(f"{path}.partition_profile", problem)
            elif len(self.problems) == known:  # well-formed: would the cluster take it?
                refusal = admission.cluster_refusal(workload)
                if refusal is not None:
                    self.problem(path, refusal)
            jobs.append(JobSpec(workload, item.duration_s))
        return tuple(jobs)

    def _generators(self, cluster: ClusterConfig, duration_s: float) -> tuple[GeneratorSpec, ...]:
        specs = []
        names: set[str] = set()
        admission = Admission(cluster)
        for index, item in enumerate(self.model.generators):
            path = f"generators[{index}]"
            known = len(self.problems)
            pool = self._check_job_fields(path, item, cluster)
            known = len(self.problems) == known  # its queue, pool and types are known
            name = item.name or f"{item.queue}-g{index}"
            if name in names:
                self.problem(f"{path}.name", f"duplicate generator name {name!r}")
            names.add(name)
            idle = generator_idle(item.start_s, item.stop_s, duration_s)
            if idle is not None:
                self.problem(f"{path}.start_s", idle)
            stop_s = min(item.stop_s or math.inf, duration_s)
            specs.append(
                GeneratorSpec(
                    name=name,
                    queue=item.queue,
                    pool=pool,
                    rate_per_h=item.rate_per_h,
                    backlog=item.backlog,
                    start_s=item.start_s,
                    stop_s=stop_s,
                    max_jobs=item.max_jobs,
                    pods=item.pods,
                    gpus_per_pod=item.gpus_per_pod,
                    duration=item.duration_s,
                    gang=item.gang,
                    preemptible=item.preemptible,
                    allowed_gpu_types=tuple(item.gpu_types),
                    min_gpu_memory_gib=item.min_gpu_memory_gib,
                    cpu_millicores_per_pod=item.cpu_millicores_per_pod,
                    memory_mib_per_pod=item.memory_mib_per_pod,
                    priority_class=item.priority_class,
                    min_runtime_s=item.min_runtime_s,
                    topology=_topology(item.topology),
                )
            )
            if item.gpus_per_pod.kind not in ("constant", "choice"):
                self.problem(f"{path}.gpus_per_pod", "must be a number or a choice")
                continue
            for field, message in generator_problems(path, specs[-1], admission, fit=known):
                self.problem(field, message)
        return tuple(specs)

    def _unique_uids(self, jobs: Iterable[JobSpec]) -> None:
        seen: set[str] = set()
        for index, job in enumerate(jobs):
            uid = job.workload.uid
            if uid in seen:
                where = f"workloads[{index}].uid" if index < len(self.model.workloads) else "trace"
                self.problem(where, f"duplicate uid {uid!r}")
            seen.add(uid)


def _only_pool(cluster: ClusterConfig) -> str | None:
    return cluster.pools[0].name if len(cluster.pools) == 1 else None


def _topology(model: TopologyModel | None) -> TopologyConstraint | None:
    return None if model is None else TopologyConstraint(model.level, model.required)


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None
