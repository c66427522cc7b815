"""Slurm's jobs and nodes as the bridge reads them: parsed from `squeue --json` and `sinfo --json`
(Slurm 22.05's data_parser shapes), or a job from the text read (`squeue -O` with the memory and
GPU indices of `scontrol -d show job -o`, `parse_squeue_text`), plus the two compact notations
Slurm prints: host lists (`a100-[0-1],rtx-3`) and GPU index lists (`gpu:a100:2(IDX:0,2-3)`).
Pure: no commands run here.

The text read, as `SlurmCtl.jobs` runs it (see bench/results/slurm_bridge.md, round 29):

- `squeue --all --states=all -h -O <SQUEUE_FORMAT>` with `SLURM_TIME_FORMAT=%s` (times as epoch
  seconds): every field but the last two ends with the unit separator `\x1f`, which none of
  them holds as Slurm writes them (states, reasons, partitions, features, TRES, node lists,
  numbers, dependencies; an account or QOS with one, possible without accounting, makes the
  record not parse), and a record that does not parse fails the read rather than guess. The
  last two are the JobName and the Comment, which a user may fill with anything (spaces, `=`,
  the separator, newlines): squeue prints each padded or cut to exactly `NAME_BYTES` and
  `COMMENT_BYTES` bytes, so they are read by their position, never by a separator, and each
  record ends with `\x1e` and a newline, which is checked. A Comment of `COMMENT_BYTES` bytes or
  more (Slurm 22.05 refused 1,100 on the test cluster) is read cut, marked with `COMMENT_CUT` at
  its end (no text the bridge writes is that long, so it never equals one); trailing spaces are
  lost to the padding (the bridge writes no Comment that ends in one); `(null)` is no Comment
  (as a user's Comment `(null)` reads: the bridge matches neither).
- Unset values print as `N/A`, `(null)`, `NONE` or `Unknown` depending on the field: each is
  read as the JSON read gives it (0 or ""). `ArrayJobID` is a job's own id outside an array (0
  in JSON), and so is it of an array's record with neither task id nor pending tasks left (JSON:
  the array's id): the array's id is read from `scontrol` (`ArrayJobId=`, below), `ArrayTaskID` the task id or the pending tasks ('1-3'); `MaxNodes` is the node count where
  JSON has 0 (a started job, or one that asked no `-N`), so a `MaxNodes` equal to the count is
  read 0 (the mapping sees no node range either way); `EndTime` of a job that has not ended is
  `NONE` or `N/A`, read 0 (JSON has its time limit's end, start + 1 year without one; the
  bridge reads it only of an ended job, or in a cycle that reads `squeue --json`). Of a job
  that ended pending (cancelled), `NumCPUs` and `MaxNodes` are its request, where JSON has 0
  CPUs: the bridge maps no ended job.
- `Reason` is the job's description where Slurm set one, not its reason: `job requeued in held
  state` after a `requeuehold`, and still after an operator's `scontrol hold` of that job
  (JSON: `JobHeldAdmin`; seen on 22.05), `ReqNodeNotAvail, UnavailableNodes:...`. The bridge
  reads the reason of a pending job (an operator's hold, `BeginTime`): a pending job whose
  `Reason` is not a reason's name (letters only, as Slurm names them all) fails the read. A job
  requeued with `requeuehold` shows such a description until it is released, so a cycle with
  one reads `squeue --json`: no text field tells that hold from an operator's later hold of the
  job (round 31, on 22.05: `squeue -o %all` and `scontrol -dd show job -o` print the same for
  both, `Reason=job_requeued_in_held_state` and `Priority=0`; `uhold`, `hold`, `Priority=0`,
  `Nice=` and Comment updates leave the description, a release clears it). The bridge's own
  evictions (`uhold`, then `requeue`) leave none: `JobHeldUser`, `JobHeldAdmin` after an
  operator's hold. Of a running or ended job, the description is read as is.
- `MinMemory` there does not say whether it is per CPU or per node (nor is it always exact:
  `1.50G`), and a wrong guess changes a job's request: the memory is read from `scontrol show
  job -o` (`MinMemoryCPU=` or `MinMemoryNode=`, exact units), in a record that user text can
  not forge (`_Scontrol.record`), found by the job's name, account and QOS from the squeue
  read: the `Name` field, fixed-width as the Comment (`NAME_BYTES`; a name that fills it is
  not clear, nor is a job's memory when its record is not found once).
- GPU indices (round 31): `scontrol -d` prints, in the same record right before the memory
  fields, a job's detail once it holds resources (running, completing, or ended after a run):
  `JOB_GRES=gpu:a100:4   Nodes=a100-0 CPU_IDs=1 Mem=1024 GRES=gpu:a100:2(IDX:3-4)   Nodes=a100-1
  ...`, one `Nodes=` for each run of consecutive nodes with the same CPU ids, memory and GRES
  (`Nodes=a100-[0-1] ... GRES=gpu:a100:8(IDX:0-7)`), GRES as `squeue --json`'s `gres_detail`
  of each node (`gpu:2(IDX:0-1)` where the node's GRES has no type; empty for a job without
  GPUs, and once the job completes, as `gres_detail` is then). Seen on 22.05 for typed and
  untyped requests and node GRES, one and several nodes, array tasks, `--gpus` and
  `--gpus-per-task` (`detail_gpu_indices`). A detail that is not read exactly so, or a job
  with nodes and no detail, leaves the record without indices (`gpu_indices_read` false), and
  the bridge reads `squeue --json` in a cycle whose rows need them.
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
    # False for a record of the text read (`parse_squeue_text`) whose GPU indices `scontrol -d`
    # did not give clearly (`detail_gpu_indices`): `gpu_indices` is empty there whatever Slurm
    # allocated, and the bridge reads the job again from `squeue --json` (`parse_job`) in a
    # cycle that needs them.
    gpu_indices_read: bool = True
    # Slurm's description of the job's state (`job requeued in held state`), which squeue's
    # text prints in place of the reason: from `squeue --json` only ("" in the text read).
    state_description: str = ""

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
        state_description=str(raw.get("state_description") or ""),
    )


# ---- the text read ------------------------------------------------------------------------

SEP = b"\x1f"  # ends every field of a record but the last two
END = b"\x1e\n"  # ends a record
NAME_BYTES = 256
COMMENT_BYTES = 1024
COMMENT_CUT = "\u2026"  # marks a Comment of COMMENT_BYTES bytes or more, read cut
# The fields of SlurmJob, in the order squeue prints them; then the JobName and the Comment,
# each padded or cut to a fixed width.
_TEXT_FIELDS = (
    "JobID", "State", "Reason", "Partition", "Account", "QOS", "PriorityLong", "Nice",
    "NumNodes", "MaxNodes", "NumCPUs", "MinCpus", "tres-per-node", "tres-per-job",
    "tres-per-task", "Feature", "NodeList", "RestartCnt", "SubmitTime", "StartTime", "EndTime",
    "EligibleTime", "ArrayJobID", "ArrayTaskID", "Dependency",
)  # fmt: skip
SQUEUE_FORMAT = ",".join(f"{name}:{SEP.decode()}" for name in _TEXT_FIELDS) + (
    f",Name:{NAME_BYTES},Comment:{COMMENT_BYTES}{END[:1].decode()}"
)
_RECORD_RE = re.compile(
    b"((?:[^\x1f\n]*\x1f){%d})(.{%d})(.{%d})\x1e\n"
    % (len(_TEXT_FIELDS), NAME_BYTES, COMMENT_BYTES),
    re.DOTALL,
)
_UNSET = frozenset(("", "N/A", "(null)", "NONE", "Unknown"))
_REASON_NAME_RE = re.compile(r"[A-Za-z]+")  # JobHeldUser, BeginTime, None, ...
_JOB_START_RE = re.compile(r"^JobId=(\d+) ", re.MULTILINE)
# `JobId=N`, Slurm's array and heterogeneous job fields (`ArrayJobId=2 ArrayTaskId=4,6,8%2
# ArrayTaskThrottle=2`, `HetJobId=...`), then the name.
_NAME_AT_RE = re.compile(
    r"JobId=\d+ (?:ArrayJobId=(\d+) )?(?:(?:Array|HetJob)[A-Za-z]*=[^ \n]* )*JobName="
)
_AFTER_NAME_RE = re.compile(r" +UserId=")
_MEMORY_RE = re.compile(r" MinCPUsNode=\d+ MinMemory(Node|CPU)=(\S+) MinTmpDiskNode=")
# `scontrol -d`'s detail of a job holding resources (running, completing, or ended after a run;
# not a pending job), right before its memory fields: ` JOB_GRES=gpu:a100:4`, then for each run of
# consecutive nodes alike (the same CPU ids, memory and GRES: `Nodes=a100-[0-1]`)
# `   Nodes=HOSTS CPU_IDs=... Mem=MiB GRES=DETAIL`, DETAIL as `squeue --json`'s `gres_detail` of
# each of those nodes (empty once the job completes, and for a job without GRES).
_JOB_GRES = " JOB_GRES="
_DETAIL_RE = re.compile(r" JOB_GRES=\S*((?:   Nodes=\S+ CPU_IDs=\S+ Mem=\d+ GRES=\S*)+)")
_DETAIL_NODES_RE = re.compile(r"   Nodes=(\S+) CPU_IDs=\S+ Mem=\d+ GRES=(\S*)")
# One node's GPUs: `gpu:a100:2(IDX:0-1)`, or `gpu:2(IDX:0,3)` where the node's GRES has no type.
# Anything else (two GRES, a count without indices `(CNT:2)`, another GRES name) is not read.
_GPU_DETAIL_RE = re.compile(r"gpu(?::[^:(),\s]+)?:(\d+)\(IDX:(\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*)\)")
_UNIT_MIB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2, "P": 1024**3}
_MEMORY_VALUE_RE = re.compile(r"^(\d+(?:\.\d+)?)([KMGTP]?)$")


class TextReadError(ValueError):
    """The text read is not what `SQUEUE_FORMAT` asks for, or a job's memory is not clear
    from `scontrol show job -o`: the caller reads `squeue --json` instead."""


def _text(value: bytes) -> str:
    text = value.decode("utf-8", "replace")
    return "" if text in _UNSET else text


def _number(value: bytes) -> int:
    """A number field: unset ones (N/A, NONE, Unknown) are 0, as JSON's null."""
    text = value.decode("ascii", "replace")
    return 0 if text in _UNSET else int(text)


def _padded(value: bytes) -> str | None:
    """A fixed-width field, its padding gone; None when it fills the width (maybe cut)."""
    if value[-1:] not in (b" ", b""):
        return None
    return value.rstrip(b" ").decode("utf-8", "surrogateescape")


def _comment(value: bytes) -> str:
    text = _padded(value)
    if text is None:
        # Cut at COMMENT_BYTES (possibly in a character): never equal to a Comment the bridge
        # writes, and its start, which the bridge matches, kept.
        return value.decode("utf-8", "replace") + COMMENT_CUT
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return "" if text == "(null)" else text


@dataclass(frozen=True)
class _Record:
    """What the bridge reads of a job's `scontrol -d show job -o` record."""

    memory_per_node_mib: int
    memory_per_cpu_mib: int
    array_job_id: int  # `ArrayJobId=`; 0 without one
    # The detail's runs of nodes, (HOSTS, GRES) each; None: the record has no detail (a pending
    # job); `detail_clear` false: it has one that does not read as Slurm prints it.
    detail: tuple[tuple[str, str], ...] | None
    detail_clear: bool = True


class _Scontrol:
    """`scontrol -d show job -o`, for each job's memory, array id and GPU indices (`record`)."""

    def __init__(self, out: bytes) -> None:
        self.text = out.decode("utf-8", "surrogateescape")
        self.starts: dict[int, list[int]] = {}
        for match in _JOB_START_RE.finditer(self.text):
            self.starts.setdefault(int(match.group(1)), []).append(match.start())

    def record(self, job_id: int, name: str, account: str, qos: str) -> _Record | None:
        """The job's (per node, per CPU) memory in MiB, the other 0: its `MinMemoryNode=` or
        `MinMemoryCPU=` (units exact: `1536M`, `1G`), and its `ArrayJobId=` (0 without one: a
        job's record of an array whose tasks are all split off or done shows it, where squeue's
        text has nothing to tell it from a job outside an array), and the detail `-d` prints
        right before the memory (`_DETAIL_RE`: the nodes and their GPU indices); or None when
        the memory is not clear.

        A record is a line starting `JobId=N `, but a user's JobName, Comment, paths, and
        (without accounting) account and QOS may hold newlines, spaces and `=`, and so forged
        fields and lines. So the job's record is found by what precedes its memory fields, as
        the squeue text read gave them, which no user text can forge there: a line starting
        `JobId=N `, then `JobName=` and the job's exact name, then `UserId=`, and after that,
        the first ` Account=A QOS=Q JobState=` with the job's account and QOS as squeue printed
        them. Between that and the memory fields Slurm writes every field (state, reason,
        dependency, times, partition, node lists, counts, TRES, the detail). No such record, or
        two of them (a forged line of another job's name), and the job's memory is not
        clear."""
        found: list[_Record] = []
        for start in self.starts.get(job_id, ()):
            at = _NAME_AT_RE.match(self.text, start)
            if at is None or not self.text.startswith(name, at.end()):
                continue
            after = _AFTER_NAME_RE.match(self.text, at.end() + len(name))
            if after is None:
                continue
            line_end = self.text.find("\nJobId=", after.end())
            end = len(self.text) if line_end < 0 else line_end
            fields = self.text.find(f" Account={account} QOS={qos} JobState=", after.end(), end)
            if fields < 0:
                continue
            memory = _MEMORY_RE.search(self.text, fields, end)
            mib = None if memory is None else _memory_mib(memory.group(2))
            if memory is None or mib is None:
                return None
            array_job_id = int(at.group(1) or 0)
            per = (mib, 0) if memory.group(1) == "Node" else (0, mib)
            found.append(_Record(*per, array_job_id, *self._detail(fields, memory.start())))
        return found[0] if len(found) == 1 else None

    def _detail(self, start: int, end: int) -> tuple[tuple[tuple[str, str], ...] | None, bool]:
        """The detail ending at `end` (the memory fields), not before `start`: its runs of
        nodes, or None where there is none; and whether it reads as Slurm prints it."""
        at = self.text.rfind(_JOB_GRES, start, end)
        if at < 0:
            return None, True
        block = _DETAIL_RE.fullmatch(self.text, at, end)
        if block is None:
            return (), False
        runs = _DETAIL_NODES_RE.findall(block.group(1))
        return tuple((hosts, gres) for hosts, gres in runs), True


def detail_gpu_indices(
    detail: tuple[tuple[str, str], ...] | None, nodes: tuple[str, ...]
) -> tuple[tuple[int, ...], ...] | None:
    """The GPU indices of each of the job's `nodes` (squeue's node list, expanded) from the runs
    of nodes of `scontrol -d`'s detail, as `parse_job` reads them from `squeue --json`'s
    `gres_detail`: () when no node shows a GPU (a job without GPUs, or completing: Slurm clears
    the detail then, in both reads), else one tuple per node. None when that is not clear: a job
    with nodes and no detail, runs with GPUs that do not name exactly those nodes in that order,
    a GRES not of the one form `_GPU_DETAIL_RE` reads, a count other than its indices', or some
    nodes with GPUs and some without. Never a guess: the bridge reads `squeue --json` for such a
    job's indices when it needs them."""
    if detail is None:
        return () if not nodes else None
    if not any(gres for _, gres in detail):
        # No node shows a GPU (no GPUs, or completing: `gres_detail` is empty too), whichever
        # nodes the runs name: a completing job's node list shrinks as its nodes finish (squeue
        # and `squeue --json`: `rtx-0`), while the detail still names them all (`rtx-[0-1]`).
        return ()
    names: list[str] = []
    per_node: list[tuple[int, ...]] = []
    for hosts, gres in detail:
        try:
            run = expand_hostlist(hosts)
        except ValueError:
            return None
        indices: tuple[int, ...] = ()
        if gres:
            match = _GPU_DETAIL_RE.fullmatch(gres)
            if match is None:
                return None
            indices = tuple(int(n) for n in _ranges(match.group(2)))
            if len(indices) != int(match.group(1)) or len(set(indices)) != len(indices):
                return None
        names += run
        per_node += [indices] * len(run)
    if tuple(names) != nodes:
        return None
    if not any(per_node):
        return ()
    return tuple(per_node) if all(per_node) else None


def _memory_mib(value: str) -> int | None:
    match = _MEMORY_VALUE_RE.match(value)
    if match is None:
        return None
    mib = float(match.group(1)) * _UNIT_MIB[match.group(2) or "M"]
    return _int(round(mib)) if mib == int(mib) else None


def parse_squeue_text(out: bytes, scontrol_out: bytes) -> list[SlurmJob]:
    """The jobs of `squeue -h -O SQUEUE_FORMAT` (times `%s`), each with its memory from
    `scontrol -d show job -o` (`scontrol_out`). A record that does not parse, or a job whose
    memory is not clear there, raises `TextReadError`: nothing is guessed."""
    jobs: list[SlurmJob] = []
    scontrol = _Scontrol(scontrol_out)
    pos, size = 0, len(out)
    while pos < size:
        match = _RECORD_RE.match(out, pos)
        if match is None:
            raise TextReadError(f"squeue -O: a record that does not parse at byte {pos}")
        pos = match.end()
        fields = match.group(1).split(SEP)
        try:
            jobs.append(_text_job(fields, match.group(2), match.group(3), scontrol))
        except (ValueError, IndexError) as exc:
            raise TextReadError(f"squeue -O: {exc}: {match.group(1)[:200]!r}") from exc
    return jobs


def _text_job(fields: list[bytes], name: bytes, comment: bytes, scontrol: _Scontrol) -> SlurmJob:
    (
        job_id_b, state, reason, partition, account, qos, priority, nice, node_count, max_nodes,
        cpus, cpus_per_node, tres_per_node, tres_per_job, tres_per_task, features, nodes,
        restart_count, submit_time, start_time, end_time, eligible_time, array_job_id,
        array_task, dependency, _,
    ) = fields  # fmt: skip
    job_id = int(job_id_b)
    job_name = _padded(name)
    raw = [v.decode("utf-8", "surrogateescape") for v in (account, qos)]
    record = None if job_name is None else scontrol.record(job_id, job_name, *raw)
    if record is None:
        raise TextReadError(f"job {job_id}: no clear MinMemoryNode/MinMemoryCPU in scontrol")
    per_node, per_cpu = record.memory_per_node_mib, record.memory_per_cpu_mib
    array_master = record.array_job_id
    job_state, state_reason = _text(state), _text(reason)
    if job_state == "PENDING" and not _REASON_NAME_RE.fullmatch(state_reason):
        raise TextReadError(f"job {job_id}: a reason that is not Slurm's name: {state_reason!r}")
    tasks = _text(array_task)
    task_id = int(tasks) if tasks.isdigit() else None
    in_array = bool(tasks)
    if in_array and array_master != _number(array_job_id):
        raise TextReadError(f"job {job_id}: ArrayJobID {array_job_id!r} is not scontrol's")
    count = _int(_number(node_count))
    highest = _int(_number(max_nodes))
    if highest == count:
        highest = 0  # squeue prints the count where JSON has 0 (a started job, no -N asked)
    on_nodes = tuple(expand_hostlist(_text(nodes)))
    indices = detail_gpu_indices(record.detail, on_nodes) if record.detail_clear else None
    return SlurmJob(
        job_id=job_id,
        state=job_state,
        state_reason=state_reason,
        partition=_text(partition),
        account=_text(account),
        qos=_text(qos),
        priority=_number(priority),
        nice=_number(nice),
        node_count=count,
        max_nodes=highest,
        cpus=_int(_number(cpus)),
        cpus_per_node=_int(_number(cpus_per_node)),
        memory_per_node_mib=per_node,
        memory_per_cpu_mib=per_cpu,
        tres_per_node=_text(tres_per_node),
        tres_per_job=_text(tres_per_job),
        tres_per_task=_text(tres_per_task),
        features=_text(features),
        nodes=on_nodes,
        gpu_indices=indices or (),
        restart_count=_int(_number(restart_count)),
        submit_time=_int(_number(submit_time)),
        start_time=_number(start_time),
        end_time=_number(end_time),
        comment=_comment(comment),
        is_array=in_array,
        dependency=_text(dependency),
        eligible_time=_number(eligible_time),
        array_job_id=array_master,
        array_task_id=task_id,
        array_tasks="" if task_id is not None else tasks,
        gpu_indices_read=indices is not None,
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
