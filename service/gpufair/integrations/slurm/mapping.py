"""Slurm jobs and nodes in gpufair's terms, or why a job cannot be (pure; no I/O).

A node of a mapped partition becomes a gpufair `Node` of that partition's pool: its GPU GRES (type
through `gpu_types`, count), CPUs (x1000 millicores), real memory, features as labels
(`slurm.feature/NAME: "true"`) and ready = up and not drained.

A job becomes a `Workload` whose pods are its nodes:

| Slurm | gpufair |
|---|---|
| `-N n` (a fixed count) | `pods = n` |
| `--gres=gpu[:TYPE]:g` (per node), or `--gpus=G` on one node | `gpus_per_pod = g` (or `G`) |
| a GRES TYPE, `--constraint` features (`a\\|b` either, `a&b` both) | `allowed_gpu_types`, `min_gpu_memory_gib` (constraints.py) |
| CPUs and memory per node | `cpu_millicores_per_pod`, `memory_mib_per_pod` |
| account | queue (`accounts`, else `default_queue`) |
| `--nice=v` | `priority_class = -v` (a held job's Slurm priority is 0, so nice carries the order) |
| QOS in `non_preemptible_qos` | `preemptible = false` |
| submit time | `submit_time` |

Anything else that changes where a job may run (node ranges, `--gpus-per-task`, `--gpus` on
several nodes, arrays, brackets or counts in constraints, a constraint that no GPU type meets,
unknown GPU types or features, several partitions) makes the job unmappable: it stays held, and
the reason is written to its Comment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpufair.integrations.slurm.config import BridgeConfig
from gpufair.integrations.slurm.constraints import GpuMemory, gpu_choice
from gpufair.integrations.slurm.records import SlurmJob, SlurmNode
from gpufair.v1 import cluster_pb2, scheduler_pb2

_GPU_GRES_RE = re.compile(r"^(?:gres[:/])?gpu(?::([A-Za-z0-9._-]+))?:(\d+)(?:\(.*\))?$")


@dataclass(frozen=True)
class GpuRequest:
    slurm_type: str  # "" = any type
    count: int


def parse_gpu_gres(text: str) -> GpuRequest | None:
    """The GPU part of a GRES or TRES string ('gres:gpu:a100:2', 'gpu:8(S:0-1)'), if any."""
    for part in text.split(","):
        match = _GPU_GRES_RE.match(part.strip())
        if match:
            return GpuRequest(match.group(1) or "", int(match.group(2)))
    return None


def node_pool(config: BridgeConfig, node: SlurmNode) -> str | None:
    """The pool of the first mapped partition (in the mapping file's order) holding the node."""
    for partition, pool in config.partitions.items():
        if partition in node.partitions:
            return pool
    return None


def map_node(config: BridgeConfig, node: SlurmNode) -> cluster_pb2.Node | None:
    """The gpufair node for a Slurm node of a mapped partition with mapped GPUs; else None."""
    pool = node_pool(config, node)
    gpus = parse_gpu_gres(node.gres)
    if pool is None or gpus is None or gpus.slurm_type not in config.gpu_types:
        return None
    return cluster_pb2.Node(
        name=node.name,
        pool=pool,
        gpu_type=config.gpu_types[gpus.slurm_type],
        gpu_count=gpus.count,
        cpu_millicores=node.cpus * 1000,
        memory_mib=node.real_memory_mib,
        labels={f"slurm.feature/{f}": "true" for f in node.features},
        ready=node.ready,
    )


@dataclass(frozen=True)
class Unmappable:
    """Why a job cannot become a workload; written to its Comment."""

    reason: str


def _gpus_per_node(job: SlurmJob) -> tuple[GpuRequest | None, str]:
    if job.tres_per_task and parse_gpu_gres(job.tres_per_task.replace("gres:", "", 1)):
        return None, "--gpus-per-task is not supported; ask --gres=gpu:N per node"
    per_node = parse_gpu_gres(job.tres_per_node)
    if per_node is not None:
        return per_node, ""
    per_job = parse_gpu_gres(job.tres_per_job)
    if per_job is not None:
        if job.node_count > 1:
            # Slurm splits GPUs per job over the nodes as it likes (8 over 2 idle nodes: 7 + 1);
            # a workload has one count per pod, so gpufair would count GPUs Slurm gave away.
            return None, (
                f"--gpus={per_job.count} over {job.node_count} nodes: Slurm may give each node "
                "a different count; ask --gres=gpu:N per node"
            )
        return per_job, ""
    return None, "the job asks for no GPU (use --gres=gpu:N)"


def map_job(
    config: BridgeConfig,
    job: SlurmJob,
    *,
    gpu_memory: GpuMemory | None = None,
    revision: int = 0,
) -> scheduler_pb2.Workload | Unmappable:
    """The workload for a job of a mapped partition, or why there is none. `gpu_memory` (gpufair's
    GPU types and their memory) is asked only for a constraint that needs it (constraints.py);
    `revision` names the job's workload after its request changed (`uid_of`)."""
    if job.partition not in config.partitions:
        return Unmappable(f"submitted to several partitions ({job.partition}); name one")
    pool = config.partitions[job.partition]
    if job.is_array:
        return Unmappable("job arrays are not supported; submit one job per task")
    if job.max_nodes and job.max_nodes != job.node_count:
        return Unmappable(f"a node range ({job.node_count}-{job.max_nodes}) is not supported")
    nodes = max(1, job.node_count)
    gpus, error = _gpus_per_node(job)
    if gpus is None:
        return Unmappable(error)
    queue = config.queue_of(job.account)
    if not queue:
        return Unmappable(f"account {job.account!r} maps to no gpufair queue")
    choice = gpu_choice(config, job.features, gpu_memory)
    if isinstance(choice, str):
        return Unmappable(choice)
    allowed, min_memory_gib = set(choice.types), choice.min_memory_gib
    if gpus.slurm_type:
        if gpus.slurm_type not in config.gpu_types:
            return Unmappable(f"GPU type {gpus.slurm_type!r} is not in the bridge's gpu_types")
        typed = {config.gpu_types[gpus.slurm_type]}
        allowed = typed & allowed if allowed else typed
        if not allowed:
            return Unmappable(f"GPU type {gpus.slurm_type!r} contradicts the constraint")
    cpus_per_node = job.cpus_per_node or -(-job.cpus // nodes)
    memory_mib = job.memory_per_node_mib or job.memory_per_cpu_mib * cpus_per_node
    workload = scheduler_pb2.Workload(
        uid=uid_of(config, job.job_id, revision),
        queue=queue,
        pool=pool,
        pods=nodes,
        gpus_per_pod=gpus.count,
        allowed_gpu_types=sorted(allowed),
        min_gpu_memory_gib=min_memory_gib,
        cpu_millicores_per_pod=cpus_per_node * 1000,
        memory_mib_per_pod=memory_mib,
        priority_class=-job.nice,
        preemptible=job.qos not in config.non_preemptible_qos,
        # Slurm runs a multi-node job on as many distinct nodes: never two pods on one.
        pods_on_distinct_nodes=nodes > 1,
    )
    if job.submit_time:
        workload.submit_time.FromMicroseconds(submit_time_us(job))
    return workload


def submit_time_us(job: SlurmJob) -> int:
    """Slurm's whole-second submit time with the job id's last six digits as microseconds, so
    jobs of one second are ordered by job id (see the module's docstring)."""
    return job.submit_time * 1_000_000 + job.job_id % 1_000_000


_UID_REST_RE = re.compile(r"(\d+)(?:\.([1-9]\d*))?", re.ASCII)


def uid_of(config: BridgeConfig, job_id: int, revision: int = 0) -> str:
    """A job's workload uid: `uid_prefix` + job id (`slurm-42`); after the job was changed or
    withdrawn while pending, each new workload adds a revision (`slurm-42.1`, `slurm-42.2`), as
    a workload's uid names one request for good."""
    return f"{config.uid_prefix}{job_id}" + (f".{revision}" if revision else "")


def parse_uid(config: BridgeConfig, uid: str) -> tuple[int, int] | None:
    """(job id, revision) of a workload uid of this bridge, or None."""
    if not uid.startswith(config.uid_prefix):
        return None
    match = _UID_REST_RE.fullmatch(uid[len(config.uid_prefix) :])
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2) or 0)


def job_id_of(config: BridgeConfig, uid: str) -> int | None:
    """The Slurm job id behind a workload uid of this bridge, or None."""
    parsed = parse_uid(config, uid)
    return None if parsed is None else parsed[0]


def same_request(a: scheduler_pb2.Workload, b: scheduler_pb2.Workload) -> bool:
    """Whether two workloads ask the same of gpufair, whatever their uid and submit time."""
    left, right = scheduler_pb2.Workload(), scheduler_pb2.Workload()
    left.CopyFrom(a)
    right.CopyFrom(b)
    for message in (left, right):
        message.ClearField("uid")
        message.ClearField("submit_time")
        if not message.HasField("preemptible"):
            message.preemptible = True
    return left == right
