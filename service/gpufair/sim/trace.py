"""Replay of the Alibaba GPU cluster trace 2023 (`cluster-trace-gpu-v2023`, "openb") as a scenario.

The trace is two CSV files (their README sits beside them in
`../shared/traces/alibaba-gpu-2023`, relative to the repository root; they are never copied
into the repository):

- the node list: `sn, cpu_milli, memory_mib, gpu, model`;
- the pod list: `name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, qos, pod_phase,
  creation_time, deletion_time, scheduled_time` (times in seconds from the trace's start).

How a pod becomes a simulated job:

- **One pod, one workload** of one pod (the trace has no gang information), uid = pod name.
  GPUs per pod: `num_gpu`, or `gpu_milli / 1000` of one GPU for a one-GPU pod asking for less
  (a shared GPU). CPU and memory as in the trace. `gpu_spec` (models separated by `|`) becomes the
  allowed GPU types. Pods asking for no GPU are read but not replayed: gpufair schedules GPUs
  only, and the service refuses a workload without one. A pod the service would refuse at
  submit (a negative or oversized request, more than 64 GPUs, a pod no node of the replayed
  subset can hold) is refused at its arrival, and counted as refused (`admission`).
- **Arrival** = `(creation_time - start_s) / time_compression` (start_s defaults to the first
  creation time). Compressing arrivals, or replaying on a subset of the nodes, creates the
  contention the full cluster lacks (its peak demand is about 66 of 6,212 GPUs).
- **Run time** = `deletion_time - scheduled_time` for pods the production cluster scheduled, and
  `deletion_time - creation_time` (how long the pod was wanted) for pods it never scheduled, unless
  `skip_unscheduled` drops them; at least one second. A row deleted before it was scheduled (or,
  never scheduled, before it was created) is a broken row: an error naming its file and line. Run times are divided by
  `duration_compression` (1 by default: the work a pod does does not change with arrival speed).
- **Queues**: by a stable hash of the pod name (CRC-32, the same on every machine) over the listed
  queue names, or by `qos` through a mapping.
- **Preemptible** unless the pod's `qos` is listed in `non_preemptible_qos` (none by default:
  non-preemptible work is admitted only within a queue's deserved quota, so marking pods so
  needs quotas that can hold them).
- **Nodes**: all, or a subset of `node_count` nodes (or `node_fraction` of them) with the same
  GPU model mix: each model gets its share by largest remainder, its nodes drawn with a random
  source seeded from the scenario seed, then kept in file order.

GPU models. The trace names models, gpufair needs a memory size and a compute weight (CU per GPU,
on DESIGN's scale where an A100 is 10 and a V100 4). `DEFAULT_GPU_MODELS` holds the defaults;
a scenario may override any of them. The weights are rough training-throughput ratios to a V100:
P100 about half (no tensor cores), T4 a little under 40 %, A10 about three quarters. G1, G2 and
G3 are undisclosed internal models: they are assumed V100-class (4 CU; 32 GiB for the 8-GPU G2/G3
servers, 16 GiB for G1). The trace asks for no GPU memory, so memory only matters for scenarios
that add such constraints.
"""

from __future__ import annotations

import csv
import math
import random
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpufair.domain.model import GpuType, Node, Workload, frozen_map
from gpufair.sim.jobspec import JobSpec

TRACE_DIR_ENV = "GPUFAIR_TRACE_DIR"  # where the trace folder is, unless given otherwise
NODES_FILE = "openb_node_list_gpu_node.csv"
PODS_FILE = "openb_pod_list_gpuspec33.csv"
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
MIN_RUN_S = 1.0


@dataclass(frozen=True, slots=True)
class GpuModel:
    """How one of the trace's GPU models is seen by gpufair."""

    type_name: str
    memory_gib: float
    compute_weight: float


DEFAULT_GPU_MODELS: Mapping[str, GpuModel] = frozen_map(
    {
        "V100M32": GpuModel("v100m32", 32, 4.0),
        "V100M16": GpuModel("v100m16", 16, 4.0),
        "A10": GpuModel("a10", 24, 3.0),
        "P100": GpuModel("p100", 16, 2.0),
        "T4": GpuModel("t4", 16, 1.5),
        "G1": GpuModel("g1", 16, 4.0),
        "G2": GpuModel("g2", 32, 4.0),
        "G3": GpuModel("g3", 32, 4.0),
    }
)


class TraceError(ValueError):
    """A trace file that cannot be read as the Alibaba 2023 format; names the file and line."""


@dataclass(frozen=True, slots=True)
class TraceOptions:
    directory: Path
    pool: str
    queue_names: tuple[str, ...] = ()  # by hash of the pod name (when qos_queues is empty)
    qos_queues: Mapping[str, str] = field(default_factory=frozen_map)  # qos -> queue
    node_count: int | None = None
    node_fraction: float | None = None
    time_compression: float = 1.0
    duration_compression: float = 1.0
    start_s: float | None = None
    skip_unscheduled: bool = False
    non_preemptible_qos: tuple[str, ...] = ()
    max_pods: int | None = None  # the first pods by creation time only
    gpu_models: Mapping[str, GpuModel] = field(default_factory=lambda: DEFAULT_GPU_MODELS)
    seed: int = 0
    nodes_file: str = NODES_FILE
    pods_file: str = PODS_FILE


@dataclass(frozen=True, slots=True)
class TraceReplay:
    gpu_types: tuple[GpuType, ...]  # every model of the table
    nodes: tuple[Node, ...]
    jobs: tuple[JobSpec, ...]
    notes: tuple[str, ...]  # what was read and what was left out, for the summary


def _rows(path: Path, columns: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    try:
        handle = path.open(newline="", encoding="utf-8-sig")  # a leading BOM is no column
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from None
    with handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None:
            raise TraceError(f"{path}:1: the file is empty (no header row)")
        missing = [c for c in columns if c not in reader.fieldnames]
        if missing:
            raise TraceError(f"{path}:1: missing column(s) {', '.join(missing)}")
        for row in reader:
            cut = [c for c in columns if row.get(c) is None]
            if cut:  # csv leaves the columns of a short row None
                raise TraceError(
                    f"{path}:{reader.line_num}: the row ends before column {cut[0]} "
                    f"({len(cut)} of {len(columns)} missing)"
                )
            yield reader.line_num, row


def _int(path: Path, line: int, row: Mapping[str, str], column: str) -> int:
    text = row[column]
    try:
        return int(text)
    except ValueError:
        raise TraceError(
            f"{path}:{line}: {column}: expected a whole number, got {text!r}"
        ) from None


def _node_type(options: TraceOptions, path: Path, line: int, model: str) -> GpuModel:
    found = options.gpu_models.get(model)
    if found is None:
        raise TraceError(
            f"{path}:{line}: GPU model {model!r} has no compute weight; add it under "
            "trace.gpu_models"
        )
    return found


def read_nodes(options: TraceOptions) -> tuple[tuple[GpuType, ...], tuple[Node, ...]]:
    path = options.directory / options.nodes_file
    by_model: dict[str, list[Node]] = {}
    order: dict[str, int] = {}
    for line, row in _rows(path, NODE_COLUMNS):
        model = _node_type(options, path, line, row["model"])
        node = Node(
            name=row["sn"],
            pool=options.pool,
            gpu_type=model.type_name,
            gpu_count=_int(path, line, row, "gpu"),
            cpu_millicores=_int(path, line, row, "cpu_milli"),
            memory_mib=_int(path, line, row, "memory_mib"),
        )
        order[node.name] = len(order)
        by_model.setdefault(row["model"], []).append(node)
    total = sum(len(nodes) for nodes in by_model.values())
    wanted = total
    if options.node_count is not None:
        wanted = min(options.node_count, total)
    elif options.node_fraction is not None:
        wanted = round(total * options.node_fraction)
    chosen: list[Node] = []
    rng = random.Random(f"{options.seed}:trace-nodes")
    for model_name, count in _shares(by_model, wanted).items():
        nodes = by_model[model_name]
        chosen.extend(nodes if count >= len(nodes) else rng.sample(nodes, count))
    chosen.sort(key=lambda node: order[node.name])
    # Every model of the table becomes a type, also those without chosen nodes: a pod's gpu_spec
    # may name them, and the constraint must stay one rather than vanish.
    gpu_types = tuple(
        GpuType(m.type_name, memory_gib=m.memory_gib, compute_weight=m.compute_weight)
        for m in sorted(options.gpu_models.values(), key=lambda m: m.type_name)
    )
    return gpu_types, tuple(chosen)


def _shares(by_model: Mapping[str, list[Node]], wanted: int) -> dict[str, int]:
    """Nodes per model in proportion to the trace's mix, by largest remainder (then model name)."""
    total = sum(len(nodes) for nodes in by_model.values())
    if total == 0:
        return {}
    exact = {model: wanted * len(nodes) / total for model, nodes in sorted(by_model.items())}
    counts = {model: math.floor(value) for model, value in exact.items()}
    left = wanted - sum(counts.values())
    for model in sorted(exact, key=lambda m: (-(exact[m] - counts[m]), m))[:left]:
        counts[model] += 1
    return counts


def _queue_of(options: TraceOptions, path: Path, line: int, row: Mapping[str, str]) -> str:
    if options.qos_queues:
        queue = options.qos_queues.get(row["qos"])
        if queue is None:
            raise TraceError(f"{path}:{line}: qos {row['qos']!r} is not mapped to a queue")
        return queue
    index = zlib.crc32(row["name"].encode()) % len(options.queue_names)
    return options.queue_names[index]


def read_pods(
    options: TraceOptions, allowed_models: Mapping[str, str]
) -> tuple[list[JobSpec], list[str]]:
    """The pods as jobs, in arrival order, and notes on what was left out.

    `allowed_models` maps trace model names to gpufair type names (every model the table knows,
    so a constraint naming a model absent from the chosen nodes stays a real constraint).
    """
    path = options.directory / options.pods_file
    rows: list[tuple[int, int, dict[str, str]]] = []
    for line, row in _rows(path, POD_COLUMNS):
        rows.append((_int(path, line, row, "creation_time"), line, row))
    rows.sort(key=lambda item: (item[0], item[2]["name"]))
    if options.max_pods is not None:
        rows = rows[: options.max_pods]
    start_s = options.start_s if options.start_s is not None else (rows[0][0] if rows else 0)
    jobs: list[JobSpec] = []
    cpu_only = unscheduled_skipped = before_start = 0
    for created_s, line, row in rows:
        num_gpu = _int(path, line, row, "num_gpu")
        if num_gpu <= 0:
            cpu_only += 1
            continue
        if created_s < start_s:
            before_start += 1
            continue
        gpu_milli = _int(path, line, row, "gpu_milli")
        deleted_s = _int(path, line, row, "deletion_time")
        scheduled = row["scheduled_time"].strip()
        if scheduled:
            began_s, began = _int(path, line, row, "scheduled_time"), "scheduled_time"
        elif options.skip_unscheduled:
            unscheduled_skipped += 1
            continue
        else:
            began_s, began = created_s, "creation_time"
        if deleted_s < began_s:
            raise TraceError(
                f"{path}:{line}: deletion_time {deleted_s} is before {began} {began_s}"
            )
        run_s = float(deleted_s - began_s)
        types: list[str] = []
        for part in row["gpu_spec"].split("|"):
            name = part.strip()
            if not name:
                continue
            if name not in allowed_models:
                raise TraceError(f"{path}:{line}: gpu_spec names unknown GPU model {name!r}")
            if allowed_models[name] not in types:
                types.append(allowed_models[name])
        shared = num_gpu == 1 and 0 < gpu_milli < 1000
        workload = Workload(
            uid=row["name"],
            queue=_queue_of(options, path, line, row),
            pool=options.pool,
            pods=1,
            gpus_per_pod=gpu_milli / 1000.0 if shared else float(num_gpu),
            submit_time_s=(created_s - start_s) / options.time_compression,
            allowed_gpu_types=tuple(sorted(types)),
            cpu_millicores_per_pod=_int(path, line, row, "cpu_milli"),
            memory_mib_per_pod=_int(path, line, row, "memory_mib"),
            preemptible=row["qos"] not in options.non_preemptible_qos,
        )
        jobs.append(JobSpec(workload, max(MIN_RUN_S, run_s / options.duration_compression)))
    notes = [f"trace: {len(rows)} pods read, {len(jobs)} replayed"]
    if cpu_only:
        notes.append(f"trace: {cpu_only} pods without GPUs left out (gpufair schedules GPUs)")
    if unscheduled_skipped:
        notes.append(f"trace: {unscheduled_skipped} never-scheduled pods left out")
    if before_start:
        notes.append(f"trace: {before_start} pods created before start_s left out")
    return jobs, notes


def read_trace(options: TraceOptions) -> TraceReplay:
    """Nodes and jobs of the trace under `options` (module docstring)."""
    gpu_types, nodes = read_nodes(options)
    allowed = {model: m.type_name for model, m in options.gpu_models.items()}
    jobs, notes = read_pods(options, allowed)
    notes.insert(0, f"trace: {len(nodes)} nodes, {sum(n.gpu_count for n in nodes)} GPUs")
    return TraceReplay(gpu_types, nodes, tuple(jobs), tuple(notes))
