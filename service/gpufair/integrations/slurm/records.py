"""Slurm's jobs and nodes as the bridge reads them: parsed from `squeue --json` and `sinfo --json`
(Slurm 22.05's data_parser shapes), plus the two compact notations Slurm prints: host lists
(`a100-[0-1],rtx-3`) and GPU index lists (`gpu:a100:2(IDX:0,2-3)`). Pure: no commands run here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+))?$")
_IDX_RE = re.compile(r"\(IDX:([^)]*)\)")


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if current:
        parts.append(current)
    return parts


def _ranges(text: str) -> list[str]:
    """'0-2,5' -> ['0', '1', '2', '5'], keeping zero padding ('01-02' -> ['01', '02'])."""
    out = []
    for part in text.split(","):
        match = _RANGE_RE.match(part.strip())
        if not match:
            raise ValueError(f"not a number range: {part!r}")
        low, high = match.group(1), match.group(2) or match.group(1)
        width = len(low)
        out += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return out


def expand_hostlist(text: str) -> list[str]:
    """Slurm's host list notation, expanded in order: 'a100-[0-1],rtx-0' -> three names."""
    names: list[str] = []
    for part in _split_top(text.strip()):
        match = re.match(r"^([^\[]*)\[([^\]]+)\](.*)$", part)
        if match is None:
            names.append(part)
            continue
        head, body, tail = match.groups()
        for middle in _ranges(body):
            names += [head + middle + rest for rest in expand_hostlist(tail) or [""]]
    return names


def gpu_indices(gres_detail: str) -> list[int]:
    """The GPU indices in one node's GRES detail: 'gpu:a100:2(IDX:0-1)' -> [0, 1]."""
    match = _IDX_RE.search(gres_detail)
    if match is None or match.group(1) in ("", "N/A"):
        return []
    return [int(n) for n in _ranges(match.group(1))]


@dataclass(frozen=True)
class SlurmJob:
    """One job as squeue reports it. Times are Unix seconds (Slurm's clock); 0 = unset."""

    job_id: int
    state: str  # PENDING, RUNNING, COMPLETED, CANCELLED, FAILED, ...
    state_reason: str
    partition: str
    account: str
    qos: str
    priority: int  # 0 while held
    nice: int
    node_count: int
    max_nodes: int
    cpus: int
    cpus_per_node: int
    memory_per_node_mib: int
    memory_per_cpu_mib: int
    tres_per_node: str
    tres_per_job: str
    tres_per_task: str
    features: str
    nodes: tuple[str, ...]  # where it runs or ran
    gpu_indices: tuple[tuple[int, ...], ...]  # per node of `nodes`, as Slurm gave them
    restart_count: int
    submit_time: int
    start_time: int
    end_time: int
    comment: str
    is_array: bool
    dependency: str = ""  # as squeue prints it: 'afterok:7(unfulfilled)'; '' = none
    # The time Slurm may start the job from (`--begin`, `scontrol update StartTime=`, or the
    # delay a requeue sets); 0 = none set.
    eligible_time: int = 0
    # Of an array: its master job id (`N` in `N_3`); the task this record is, None for the
    # record of the tasks still pending, listed in `array_tasks` ('1-3', '5,7', '0-9:2%4').
    array_job_id: int = 0
    array_task_id: int | None = None
    array_tasks: str = ""

    @property
    def held(self) -> bool:
        return self.state == "PENDING" and self.priority == 0

    @property
    def finished(self) -> bool:
        return self.state not in ("PENDING", "RUNNING", "SUSPENDED", "CONFIGURING", "COMPLETING")


def _int(value: Any) -> int:
    """Slurm 22.05 prints unset numbers as null, or as a huge sentinel."""
    if value is None or isinstance(value, bool):
        return 0
    number = int(value)
    return 0 if number >= 2**31 - 2 else number


def parse_job(raw: dict[str, Any]) -> SlurmJob:
    nodes = tuple(expand_hostlist(raw.get("nodes") or ""))
    details = raw.get("gres_detail") or []
    task_id = raw.get("array_task_id")
    return SlurmJob(
        job_id=int(raw["job_id"]),
        state=str(raw.get("job_state", "")),
        state_reason=str(raw.get("state_reason") or ""),
        partition=str(raw.get("partition") or ""),
        account=str(raw.get("account") or ""),
        qos=str(raw.get("qos") or ""),
        # Not through _int: a released job's priority is a large unsigned 32-bit number.
        priority=int(raw.get("priority") or 0),
        nice=int(raw.get("nice") or 0),
        node_count=_int(raw.get("node_count")),
        max_nodes=_int(raw.get("max_nodes")),
        cpus=_int(raw.get("cpus")),
        cpus_per_node=_int(raw.get("minimum_cpus_per_node")),
        memory_per_node_mib=_int(raw.get("memory_per_node")),
        memory_per_cpu_mib=_int(raw.get("memory_per_cpu")),
        tres_per_node=str(raw.get("tres_per_node") or ""),
        tres_per_job=str(raw.get("tres_per_job") or ""),
        tres_per_task=str(raw.get("tres_per_task") or ""),
        features=str(raw.get("features") or ""),
        nodes=nodes,
        gpu_indices=tuple(tuple(gpu_indices(d)) for d in details),
        restart_count=_int(raw.get("restart_cnt")),
        submit_time=_int(raw.get("submit_time")),
        start_time=int(raw.get("start_time") or 0),
        end_time=int(raw.get("end_time") or 0),
        comment=str(raw.get("comment") or ""),
        is_array=bool(raw.get("array_task_string")) or raw.get("array_task_id") is not None,
        dependency=str(raw.get("dependency") or ""),
        eligible_time=int(raw.get("eligible_time") or 0),  # not _int: 2099 is past 2**31
        array_job_id=_int(raw.get("array_job_id")),
        array_task_id=None if task_id is None else int(task_id),
        array_tasks=str(raw.get("array_task_string") or ""),
    )


@dataclass(frozen=True)
class SlurmNode:
    name: str
    partitions: tuple[str, ...]
    gres: str  # e.g. 'gpu:a100:8'
    cpus: int
    real_memory_mib: int
    state: str  # idle, mixed, allocated, down, ...
    state_flags: tuple[str, ...]  # DRAIN, NOT_RESPONDING, ...
    features: tuple[str, ...]

    @property
    def ready(self) -> bool:
        """Takes new work: up, and neither drained, draining, failing nor in maintenance."""
        bad_flags = {"DRAIN", "DRAINED", "DRAINING", "FAIL", "MAINTENANCE", "NOT_RESPONDING"}
        bad_flags |= {"POWER_DOWN", "POWERED_DOWN", "REBOOT_REQUESTED", "REBOOT_ISSUED"}
        return self.state.lower() in ("idle", "mixed", "allocated", "completing") and not (
            bad_flags & {f.upper() for f in self.state_flags}
        )


def parse_node(raw: dict[str, Any]) -> SlurmNode:
    state = str(raw.get("state") or "")
    # Some builds print compound states ('idle+drain'); split them into base state and flags.
    # A trailing '*' is Slurm's mark of a node that does not respond.
    base, *flags = state.replace("*", "").split("+")
    if "*" in state:
        flags.append("NOT_RESPONDING")
    return SlurmNode(
        name=str(raw["name"]),
        partitions=tuple(raw.get("partitions") or ()),
        gres=str(raw.get("gres") or ""),
        cpus=_int(raw.get("cpus")),
        real_memory_mib=_int(raw.get("real_memory")),
        state=base,
        state_flags=tuple([*flags, *(raw.get("state_flags") or ())]),
        features=tuple(f for f in str(raw.get("features") or "").split(",") if f),
    )
