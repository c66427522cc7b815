"""The bridge's per-cycle job read: `squeue -O` text with the memory and GPU indices of
`scontrol -d show job -o` (records.py, `parse_squeue_text`), against the `squeue --json` read it
replaces in most cycles.

On the real cluster, job by job: the text read gives what the JSON read gives (and the same
gpufair request from `map_job`) for pending, held, running, COMPLETING, requeued, ended and
array jobs, memory per CPU and per node, dependencies, begin times, GPU indices (one node and
several, in one `Nodes=` run or apart, typed and untyped requests, array tasks, `--gpus`), and
Comments holding spaces, `=`, the read's own separators, newlines and non-ASCII text; a JobName
or Comment that forges `scontrol`'s memory fields makes the read fall back to `squeue --json`,
never guess; a bridge placing jobs and reporting their starts runs no `squeue --json`. Without
Slurm: the parsers on canned output (the detail as Slurm 22.05 printed it here, and malformed),
and which rows of the bridge's table make a cycle read `squeue --json` (`_needs_gpu_indices`,
checked against the rows themselves).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import asdict, replace
from itertools import pairwise
from typing import Any, NamedTuple, cast

import pytest
from slurm_support import bridge_config, cluster_config, cycle_until, sbatch, squeue
from test_slurm_mapping import CONFIG, RAW_JOB

from gpufair.client import GpufairClient
from gpufair.integrations.slurm import bridge as bridge_module
from gpufair.integrations.slurm import job_states
from gpufair.integrations.slurm.bridge import Bridge, CycleReport
from gpufair.integrations.slurm.mapping import map_job
from gpufair.integrations.slurm.records import (
    COMMENT_BYTES,
    COMMENT_CUT,
    NAME_BYTES,
    SlurmJob,
    TextReadError,
    _Scontrol,
    expand_hostlist,
    gpu_indices,
    parse_job,
    parse_squeue_text,
)
from gpufair.integrations.slurm.slurmctl import SlurmCommandError, SlurmCtl
from gpufair.v1 import scheduler_pb2

ODD_COMMENTS = [
    "gpufair: not scheduled (withdrew slurm-42): a = b  c",
    "key=value Comment=x MinMemoryNode=99G  two  spaces",
    "sep \x1f unit \x1e record\nnewline\n1\x1fPENDING\x1f",
    "ünïcode ✓ x=1 y = 2",
    "é" * 400,  # 800 bytes
    "x" * 1000,
]


class CountingSlurmCtl(SlurmCtl):
    """The real Slurm commands, each recorded (program and arguments) as it runs."""

    def __init__(self, bin_dir: str = "") -> None:
        super().__init__(bin_dir)
        self.commands: list[list[str]] = []

    def _run_full(
        self, program: str, *args: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        self.commands.append([program, *args])
        return super()._run_full(program, *args, check=check)

    def _run_bytes(self, program: str, *args: str, env: dict[str, str] | None = None) -> bytes:
        self.commands.append([program, *args])
        return super()._run_bytes(program, *args, env=env)

    def json_reads(self) -> int:
        return sum(1 for c in self.commands if c[0] == "squeue" and "--json" in c)


def _submit(slurm: Any, *args: str, wrap: str = "sleep 300") -> int:
    out = slurm.run(
        "sbatch", "--parsable", "-o", "/dev/null", "-A", "acct-a", "-p", "gpu", *args,
        "--wrap", wrap,
    ).stdout  # fmt: skip
    return int(out.strip().split(";")[0])


def _comparable(job: SlurmJob, *, from_json: bool) -> dict[str, Any]:
    """The fields the text read gives as the JSON read does, GPU indices included. Apart
    (records.py's docstring): a node count's upper bound equal to the count (0 or the count);
    the end time of a job that has not ended (JSON's time limit end); the CPUs and node count
    bound of an ended job (JSON has 0 for a job cancelled pending); trailing spaces of a
    Comment (the text read's padding)."""
    fields = asdict(job)
    del fields["gpu_indices_read"]
    if fields["max_nodes"] == fields["node_count"]:
        fields["max_nodes"] = 0
    if not job.finished:
        fields["end_time"] = None
    else:  # the request of an ended job, which the bridge never maps: JSON has 0 CPUs or so
        fields["cpus"] = fields["max_nodes"] = None
    if from_json:
        fields["comment"] = job.comment.rstrip(" ")
    return fields


def _now_started(job: SlurmJob) -> bool:
    """A requeued job still COMPLETING: Slurm 22.05 gives its clock's now as its start time
    (test_slurm_admin_requeue), so two reads a second apart differ there alone."""
    return job.state == "COMPLETING" and job.restart_count > 0


def _timeless(job: SlurmJob | None) -> SlurmJob | None:
    """`job` without a start time that is only Slurm's now (`_now_started`)."""
    return replace(job, start_time=0) if job is not None and _now_started(job) else job


class _Reads(NamedTuple):
    stable: dict[int, SlurmJob]  # text records the two text reads agree on
    json: dict[int, SlurmJob]
    window: tuple[float, float]  # the wall clock before the first read and after the last
    seconds: tuple[float, ...]  # each read's, for a failure's message


def _stable_reads(ctl: SlurmCtl) -> _Reads:
    """Text, JSON, text again: the jobs whose two text records agree (nothing changed during
    the reads but a start time that is Slurm's now), with their JSON records."""
    clock = [time.time()]
    first = {j.job_id: j for j in ctl.jobs_text()}
    clock.append(time.time())
    json_read = {j.job_id: j for j in ctl.jobs(gpu_indices=True)}
    clock.append(time.time())
    second = {j.job_id: j for j in ctl.jobs_text()}
    clock.append(time.time())
    stable = {
        i: j
        for i, j in first.items()
        if i in json_read and _timeless(second.get(i)) == _timeless(j)
    }
    seconds = tuple(round(b - a, 1) for a, b in pairwise(clock))
    return _Reads(stable, json_read, (clock[0], clock[-1]), seconds)


def _assert_same(text_job: SlurmJob, json_job: SlurmJob, window: tuple[float, float]) -> None:
    """The text read's record of a job is the JSON read's; a start time that is Slurm's now
    lies within the reads."""
    if _now_started(text_job) and _now_started(json_job):
        for job in (text_job, json_job):
            assert window[0] - 1 <= job.start_time <= window[1] + 1, (job, window)
        text_job, json_job = replace(text_job, start_time=0), replace(json_job, start_time=0)
    assert _comparable(text_job, from_json=False) == _comparable(json_job, from_json=True)
    assert text_job.gpu_indices_read is True and json_job.gpu_indices_read is True


def test_text_read_parses_what_the_json_read_did_for_the_same_real_jobs(slurm: Any) -> None:
    held = [
        _submit(slurm, "--hold", "--gres=gpu:1", "--mem-per-cpu=1536M", "-c3"),
        _submit(slurm, "--hold", "--gres=gpu:1", "--mem=3G", "-c2"),
        _submit(slurm, "--hold", "--gres=gpu:1", "-N1", "--mem=1G"),  # 1 CPU: same either way
        _submit(slurm, "--hold", "--gres=gpu:1", "-N1", "--mem-per-cpu=1G"),
        _submit(slurm, "--hold", "--gres=gpu:1", "--mem=0"),
        _submit(slurm, "--hold", "--gres=gpu:rtx4090:1", "--nice=10"),
        _submit(slurm, "--hold", "--gres=gpu:1", "--constraint=gpumem40|rtx4090"),
        _submit(slurm, "--hold", "--gpus=2"),
        _submit(slurm, "--hold", "-n2", "--gpus-per-task=1"),
        _submit(slurm, "--hold", "-N1-2", "--gres=gpu:1"),
        _submit(slurm, "--hold", "--gres=gpu:1", "--begin=now+3600"),
        _submit(slurm, "--hold", "--gres=gpu:1", "--array=1-3"),
        *(_submit(slurm, "--hold", "--gres=gpu:1", f"--comment={c}") for c in ODD_COMMENTS),
    ]
    held.append(_submit(slurm, "--hold", "-p", "gpu,a100", "--gres=gpu:1"))
    running = _submit(slurm, "-N2", "--gres=gpu:a100:2", "--mem=2G")
    held.append(_submit(slurm, "--hold", "--gres=gpu:1", f"--dependency=afterok:{running}"))
    held.append(_submit(slurm, "--hold", "--gres=gpu:1", f"--dependency=after:{running}+1"))
    array = _submit(slurm, "--gres=gpu:rtx4090:1", "--array=0-9:2%2", "--comment=a b=c")
    limited = _submit(slurm, "--gres=gpu:rtx4090:1", "-t", "30")
    failed = _submit(slurm, "--gres=gpu:rtx4090:1", wrap="false")
    cancelled = _submit(slurm, "--gres=gpu:rtx4090:1")
    ignores_term = "trap '' TERM; while true; do sleep 1; done"
    slow = _submit(slurm, "--gres=gpu:rtx4090:1", wrap=ignores_term)
    # Requeued while it ignores SIGTERM: COMPLETING with its restart count raised (the row
    # `_requeue_completing` judges), for KillWait and more.
    slow_requeued = _submit(slurm, "-N2", "--gres=gpu:rtx4090:1", wrap=ignores_term)
    # Each must run before it is cancelled or requeued: a job still pending is not requeued
    # (COMPLETING never seen). Under load, slurmd may take a while to launch them all.
    must_run = (running, limited, cancelled, slow, slow_requeued)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        states = {j.job_id: j.state for j in SlurmCtl().jobs(gpu_indices=True)}
        if all(states.get(i) == "RUNNING" for i in must_run):
            break
        time.sleep(0.3)
    assert all(states.get(i) == "RUNNING" for i in must_run), {i: states.get(i) for i in must_run}
    slurm.run("scancel", str(cancelled))
    slurm.run("scontrol", "requeue", str(limited))
    slurm.run("scontrol", "hold", str(held[0]))  # an operator's hold: JobHeldAdmin
    slurm.run("scancel", str(slow))  # ignores SIGTERM: COMPLETING for KillWait
    ctl = SlurmCtl()
    # The requeued job is COMPLETING only until both its nodes report its end (KillWait=2, a
    # few seconds), and its node list shrinks as each does: on a loaded machine no three reads
    # of `_stable_reads` may fall inside one state. So one node's slurmd is stopped across the
    # requeue (a few seconds, well inside SlurmdTimeout): the job stays COMPLETING on that node
    # until it is let go, and the reads see it stable. Its start time there is Slurm's now
    # (`_now_started`): the reads check it lies within them, and compare the rest.
    held_node = slurm.pids["slurmd-rtx-1"]
    os.kill(held_node, signal.SIGSTOP)
    try:
        slurm.run("scontrol", "requeue", str(slow_requeued))
        requeued_completing = False
        trail: list[tuple[float, tuple[float, ...], str, str]] = []  # for a failure's message
        started = time.monotonic()
        while not requeued_completing and time.monotonic() < started + 30:
            reads = _stable_reads(ctl)
            text_job = reads.stable.get(slow_requeued)
            json_job = reads.json[slow_requeued]
            trail.append(
                (round(time.monotonic() - started, 1), reads.seconds, f"{text_job}", f"{json_job}")
            )
            if text_job is None or not _now_started(text_job):
                continue
            _assert_same(text_job, json_job, reads.window)
            requeued_completing = True
    finally:
        os.kill(held_node, signal.SIGCONT)
    assert requeued_completing, trail
    # An odd Comment written by `scontrol update`, as the bridge writes its own.
    slurm.run("scontrol", "update", f"JobId={held[1]}", "Comment=x = y \x1f z\nw")

    wanted = {*held, running, array, limited, failed, cancelled, slow, slow_requeued}
    seen_states: set[str] = {"COMPLETING"}  # the requeued job's, compared above
    compared: set[int] = set()
    # Until each job was compared, reads as slow as a loaded machine makes them (8 s each seen).
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        reads = _stable_reads(ctl)
        for job_id, text_job in reads.stable.items():
            if job_id not in wanted:
                # An earlier test's job on the session's cluster, ended by its cleanup: one the
                # bridge requeued held shows its description as its reason (records.py).
                continue
            json_job = reads.json[job_id]
            _assert_same(text_job, json_job, reads.window)
            if text_job.partition == "gpu" and not text_job.finished:
                assert map_job(CONFIG_GPU, text_job) == map_job(CONFIG_GPU, json_job)
            seen_states.add(text_job.state)
            compared.add(job_id)
        if wanted <= compared:
            break
        time.sleep(0.2)
    assert wanted <= compared, sorted(wanted - compared)
    assert {"PENDING", "RUNNING", "FAILED", "CANCELLED"} <= seen_states
    by_id = {j.job_id: j for j in ctl.jobs_text()}
    # The memory kinds and the odd Comments, read as written.
    assert (by_id[held[0]].memory_per_cpu_mib, by_id[held[0]].memory_per_node_mib) == (1536, 0)
    assert (by_id[held[1]].memory_per_cpu_mib, by_id[held[1]].memory_per_node_mib) == (0, 3072)
    assert by_id[held[1]].comment == "x = y \x1f z\nw"
    comments = [by_id[i].comment for i in held[12 : 12 + len(ODD_COMMENTS)]]
    assert comments == ODD_COMMENTS
    assert by_id[limited].restart_count == 1
    assert by_id[held[0]].state_reason == "JobHeldAdmin"
    tasks = [j for j in by_id.values() if j.array_job_id == array]
    assert {j.array_task_id for j in tasks if j.array_task_id is not None} >= {0, 2}
    assert any(j.array_tasks for j in tasks)  # the pending tasks' record: '4-8:2%2' or the like


CONFIG_GPU = replace(CONFIG, partitions={"gpu": "main"}, accounts={"acct-a": "vision-train"})


def test_a_name_that_forges_scontrol_fields_is_never_read_as_memory(slurm: Any) -> None:
    """A JobName holding `scontrol`'s memory fields, and a forged line of another job: the
    forger's memory is its own, and the job whose line was forged is not clear (two records
    of its name), so `jobs()` reads `squeue --json` for that cycle. Without the forged line,
    the text read is used again."""
    victim = _submit(slurm, "--hold", "--gres=gpu:1", "--mem-per-cpu=1G", "-J", "victim")
    fields = "MinCPUsNode=1 MinMemoryNode=99G MinTmpDiskNode=0"
    name = f"x {fields} UserId=root(0) Account=acct-a QOS=(null) JobState=PENDING {fields} y"
    forger = _submit(slurm, "--hold", "--gres=gpu:1", "--mem=2G", "-J", name)
    jobs = {j.job_id: j for j in SlurmCtl().jobs_text()}
    assert (jobs[forger].memory_per_node_mib, jobs[forger].memory_per_cpu_mib) == (2048, 0)
    assert (jobs[victim].memory_per_node_mib, jobs[victim].memory_per_cpu_mib) == (0, 1024)
    line = f"\nJobId={victim} JobName=victim UserId=root(0) Account=acct-a QOS=(null) JobState="
    comment = f"{line}PENDING {fields}"
    liar = _submit(slurm, "--hold", "--gres=gpu:1", "-J", "victim", f"--comment={comment}")
    with pytest.raises(TextReadError, match=f"job {victim}: no clear"):
        SlurmCtl().jobs_text()
    jobs = {j.job_id: j for j in SlurmCtl().jobs()}
    assert jobs[victim].gpu_indices_read and jobs[liar].gpu_indices_read  # the JSON read
    assert (jobs[victim].memory_per_node_mib, jobs[victim].memory_per_cpu_mib) == (0, 1024)
    slurm.run("scontrol", "update", f"JobId={liar}", "Comment=")
    again = CountingSlurmCtl()
    assert {j.job_id for j in again.jobs()} >= {victim, forger, liar}
    assert again.json_reads() == 0  # the text read, used again


def test_a_pending_job_whose_reason_is_a_description_makes_the_read_json(slurm: Any) -> None:
    """After `requeuehold` squeue prints the job's description (`job requeued in held state`)
    as its reason, and still after an operator's hold, which JSON shows as `JobHeldAdmin`: the
    text read refuses the job, and `jobs()` reads `squeue --json`, with the hold as it is."""
    job = _submit(slurm, "--gres=gpu:1")
    deadline = time.monotonic() + 30

    def state() -> str:
        return {j.job_id: j.state for j in SlurmCtl().jobs(gpu_indices=True)}[job]

    while state() != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    slurm.run("scontrol", "requeuehold", str(job))
    while state() != "PENDING":  # COMPLETING first
        assert time.monotonic() < deadline
        time.sleep(0.3)
    slurm.run("scontrol", "hold", str(job))
    with pytest.raises(TextReadError, match="job requeued in held state"):
        SlurmCtl().jobs_text()
    [read] = [j for j in SlurmCtl().jobs() if j.job_id == job]
    assert (read.state, read.state_reason, read.gpu_indices_read) == (
        "PENDING",
        "JobHeldAdmin",
        True,
    )


def _running(ids: set[int], deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        states = {j.job_id: j.state for j in SlurmCtl().jobs(gpu_indices=True)}
        if all(states.get(i) == "RUNNING" for i in ids):
            return
        assert time.monotonic() < deadline, {i: states.get(i) for i in ids}
        time.sleep(0.3)


def test_gpu_indices_of_the_text_read_are_the_json_reads(slurm: Any) -> None:
    """Running jobs' GPU indices from `scontrol -d` equal `squeue --json`'s `gres_detail`, node
    by node: two whole A100 nodes (one `Nodes=a100-[0-1]` run, the same CPUs, memory and
    GPUs on both), several nodes apart (typed and untyped requests), one node (typed,
    untyped), array tasks and `--gpus`, beside a job of another partition holding GPUs."""
    whole = _submit(slurm, "-N2", "--exclusive", "--gres=gpu:a100:8", "-w", "a100-[0-1]")
    _running({whole})
    others = {
        _submit(slurm, "-N2", "--gres=gpu:rtx4090:2"),
        _submit(slurm, "-N2", "--gres=gpu:1"),
        _submit(slurm, "--gres=gpu:rtx4090:1"),
        _submit(slurm, "--gres=gpu:2"),
        _submit(slurm, "--gres=gpu:1", "--array=0-1"),
        _submit(slurm, "--gpus=1"),
        _submit(slurm, "-p", "rtx", "--gres=gpu:rtx4090:1"),
    }
    deadline = time.monotonic() + 120  # reads as slow as a loaded machine makes them
    while True:
        reads = _stable_reads(SlurmCtl())
        running = {i: j for i, j in reads.stable.items() if j.state == "RUNNING"}
        mine = {i for i, j in running.items() if i in others or j.array_job_id in others}
        if whole in running and len(mine) >= len(others) + 1:  # the array: two tasks
            break
        assert time.monotonic() < deadline, sorted(running)
        time.sleep(0.3)
    detail = slurm.run("scontrol", "-d", "show", "job", "-o", str(whole)).stdout
    assert " Nodes=a100-[0-1] CPU_IDs=0-63 Mem=" in detail  # one run of two nodes
    for job_id in (whole, *mine):
        text_job, json_job = running[job_id], reads.json[job_id]
        assert text_job.gpu_indices_read, job_id
        assert text_job.gpu_indices == json_job.gpu_indices, job_id
        assert len(text_job.gpu_indices) == len(text_job.nodes) and all(text_job.gpu_indices)
    assert running[whole].gpu_indices == (tuple(range(8)), tuple(range(8)))
    assert {len(running[i].nodes) for i in mine} == {1, 2}


def test_a_bridge_reports_starts_with_slurms_gpu_indices_and_reads_no_squeue_json(
    slurm: Any, client: GpufairClient
) -> None:
    """Jobs placed and started, on one node and on two, beside a job of an unmapped partition
    holding GPUs gpufair does not see: every cycle reads the jobs as text (no `squeue --json`),
    and the starts carry the GPU indices Slurm gave (`gres_detail`), which may differ from
    gpufair's binding. Then an operator requeues the two-node job, which ignores SIGTERM: the
    cycles that judge it COMPLETING (restart count raised) and end its run read no
    `squeue --json` either."""
    client.apply_config(cluster_config("gpu"))
    foreign = _submit(slurm, "-p", "a100", "-w", "a100-0", "--gres=gpu:a100:3")
    _running({foreign})
    config = bridge_config()
    ctl = CountingSlurmCtl(config.slurm_bin)
    bridge = Bridge(config, client, ctl)
    one = sbatch(slurm, account="acct-a", gres="gpu:a100:2", seconds=120)
    ignores_term = "trap '' TERM; while true; do sleep 1; done"
    two = _submit(slurm, "--hold", "-N2", "--gres=gpu:3", wrap=ignores_term)
    uids = {f"slurm-{one}", f"slurm-{two}"}
    reports: list[CycleReport] = []

    def started() -> bool:
        return uids <= {w.workload.uid for w in client.list_workloads(states=["running"])}

    cycle_until(bridge, started, max_cycles=8, reports=reports)
    assert ctl.json_reads() == 0, [c for c in ctl.commands if c[0] == "squeue"]
    assert any(r.placed for r in reports) and reports[-1].events.get("STORED")
    jobs = squeue(slurm)
    running = {w.workload.uid: w for w in client.list_workloads(states=["running"])}
    for job_id in (one, two):
        nodes = expand_hostlist(jobs[job_id]["nodes"])
        slurms = [
            (n, gpu_indices(d)) for n, d in zip(nodes, jobs[job_id]["gres_detail"], strict=True)
        ]
        pods = running[f"slurm-{job_id}"].pods
        assert sorted((p.node, list(p.gpu_indices)) for p in pods) == sorted(slurms)

    slurm.run("scontrol", "requeue", str(two))
    seen: list[tuple[str, int]] = []

    def run_ended() -> bool:
        seen.append((squeue(slurm)[two]["job_state"], squeue(slurm)[two]["restart_cnt"]))
        return client.explain(f"slurm-{two}").state != "running"

    cycle_until(bridge, run_ended, max_cycles=8)
    assert ("COMPLETING", 1) in seen  # the run ended while Slurm showed the job so
    assert ctl.json_reads() == 0, [c for c in ctl.commands if c[0] == "squeue"]


# ---- the parsers, without Slurm -----------------------------------------------------------------


def _record(job_id: int, comment: bytes, name: bytes = b"wrap", **fields: bytes) -> bytes:
    values = {
        "JobID": str(job_id).encode(), "State": b"PENDING", "Reason": b"JobHeldUser",
        "Partition": b"gpu", "Account": b"vision", "QOS": b"(null)", "PriorityLong": b"0",
        "Nice": b"0", "NumNodes": b"2", "MaxNodes": b"2", "NumCPUs": b"8", "MinCpus": b"4",
        "tres-per-node": b"gres:gpu:4", "tres-per-job": b"N/A", "tres-per-task": b"N/A",
        "Feature": b"(null)", "NodeList": b"", "RestartCnt": b"0", "SubmitTime": b"1796136508",
        "StartTime": b"N/A", "EndTime": b"N/A", "EligibleTime": b"N/A", "ArrayJobID": b"42",
        "ArrayTaskID": b"N/A", "Dependency": b"(null)", **fields,
    }  # fmt: skip
    head = b"".join(v + b"\x1f" for v in values.values())
    return head + name.ljust(NAME_BYTES) + comment.ljust(COMMENT_BYTES) + b"\x1e\n"


def _scontrol(
    job_id: int, memory: str, name: str = "wrap", comment: str = "", detail: str = ""
) -> str:
    return (
        f"JobId={job_id} JobName={name} UserId=root(0) GroupId=root(0) Account=vision "
        f"QOS=(null) JobState=PENDING Reason=JobHeldUser NumNodes=2 CoreSpec=*{detail} "
        f"MinCPUsNode=4 {memory} MinTmpDiskNode=0 Features=(null) Comment={comment} "
        "StdOut=/dev/null\n"
    )


def test_parse_squeue_text_reads_comments_by_position() -> None:
    forged = b"a\x1e\n" + _record(7, b"forged")[:-2]
    out = _record(42, forged[: COMMENT_BYTES - 1]) + _record(43, b"(null)") + _record(44, b"x=y ")
    memory = ["MinMemoryCPU=1G", "MinMemoryNode=2G", "MinMemoryNode=0"]
    scontrol = "".join(_scontrol(i, m) for i, m in zip((42, 43, 44), memory, strict=True))
    jobs = parse_squeue_text(out, scontrol.encode())
    assert [j.job_id for j in jobs] == [42, 43, 44]
    assert jobs[0].comment == forged[: COMMENT_BYTES - 1].rstrip(b" ").decode()
    assert (jobs[1].comment, jobs[2].comment) == ("", "x=y")
    assert (jobs[0].memory_per_cpu_mib, jobs[1].memory_per_node_mib) == (1024, 2048)
    expected = replace(
        parse_job(RAW_JOB),
        comment=jobs[0].comment,
        memory_per_node_mib=0,
        memory_per_cpu_mib=1024,
        max_nodes=0,
        gpu_indices_read=True,  # pending: no nodes, no detail, no GPU indices, as in JSON
    )
    assert jobs[0] == expected


def test_the_array_id_is_scontrols() -> None:
    """An array's record with neither task id nor pending tasks: squeue prints its own id as
    `ArrayJobID`, as of a job outside an array; scontrol's `ArrayJobId=` tells them apart."""
    scontrol = _scontrol(42, "MinMemoryNode=0")
    array = scontrol.replace("JobId=42 ", "JobId=42 ArrayJobId=42 ArrayTaskId=4294967294 ")
    [alone] = parse_squeue_text(_record(42, b""), scontrol.encode())
    [done] = parse_squeue_text(_record(42, b""), array.encode())
    assert (alone.array_job_id, done.array_job_id) == (0, 42)
    task = array.replace("ArrayTaskId=4294967294", "ArrayTaskId=3")
    [three] = parse_squeue_text(_record(42, b"", ArrayTaskID=b"3"), task.encode())
    assert (three.array_job_id, three.array_task_id, three.is_array) == (42, 3, True)
    with pytest.raises(TextReadError, match="not scontrol's"):
        parse_squeue_text(_record(42, b"", ArrayTaskID=b"3", ArrayJobID=b"41"), task.encode())


def test_parse_squeue_text_marks_a_cut_comment_and_refuses_what_it_cannot_read() -> None:
    scontrol = _scontrol(42, "MinMemoryNode=0").encode()
    [cut] = parse_squeue_text(_record(42, b"y" * COMMENT_BYTES), scontrol)
    assert cut.comment == "y" * COMMENT_BYTES + COMMENT_CUT
    with pytest.raises(TextReadError, match="no clear"):
        parse_squeue_text(_record(42, b""), b"")
    with pytest.raises(TextReadError, match="no clear"):  # a name that fills its width
        parse_squeue_text(_record(42, b"", name=b"n" * NAME_BYTES), scontrol)
    with pytest.raises(TextReadError, match="does not parse"):
        parse_squeue_text(_record(42, b"", Reason=b"a\x1fb"), scontrol)
    with pytest.raises(TextReadError):
        parse_squeue_text(_record(42, b"", NumNodes=b"many"), scontrol)
    with pytest.raises(TextReadError, match="does not parse"):
        parse_squeue_text(_record(42, b"")[:-1], scontrol)
    with pytest.raises(TextReadError, match="not Slurm's name"):
        parse_squeue_text(_record(42, b"", Reason=b"job requeued in held state"), scontrol)
    [ran] = parse_squeue_text(
        _record(42, b"", State=b"FAILED", Reason=b"launch failed requeued held"), scontrol
    )
    assert ran.state_reason == "launch failed requeued held"


_FORGED = "x MinCPUsNode=1 MinMemoryNode=9G MinTmpDiskNode=0"


@pytest.mark.parametrize(
    ("scontrol", "name", "expected"),
    [
        (_scontrol(42, "MinMemoryCPU=1536M"), "wrap", (0, 1536)),
        (_scontrol(42, "MinMemoryNode=3G"), "wrap", (3072, 0)),
        (_scontrol(42, "MinMemoryNode=2T"), "wrap", (2 * 1024**2, 0)),
        (_scontrol(42, "MinMemoryNode=1.50G"), "wrap", (1536, 0)),
        (_scontrol(42, "MinMemoryNode=1.33G"), "wrap", None),  # not a whole MiB: not guessed
        # A name or Comment that forges the memory fields: skipped by the name's length, after.
        (_scontrol(42, "MinMemoryCPU=1G", name=_FORGED), _FORGED, (0, 1024)),
        (_scontrol(42, "MinMemoryCPU=1G", comment=_FORGED), "wrap", (0, 1024)),
        (_scontrol(42, "MinMemoryCPU=1G", name="wrap   "), "wrap", (0, 1024)),  # padding
        # Another job's Comment forges a line of job 42: two records, not clear.
        (_scontrol(41, "MinMemoryCPU=1G", comment="a\n" + _scontrol(42, "MinMemoryNode=9G")) + _scontrol(42, "MinMemoryCPU=1G"), "wrap", None),
        # ... a line that is not the name squeue gave: not the job's record.
        (_scontrol(41, "MinMemoryCPU=1G", comment="a\nJobId=42 JobName=other x") + _scontrol(42, "MinMemoryCPU=1G"), "wrap", (0, 1024)),
        (_scontrol(42, "MinMemoryCPU=1G"), "other", None),
        (_scontrol(42, "MinMemoryCPU=1G").replace("Account=vision", "Account=other"), "wrap", None),
        (_scontrol(42, "MinMemoryCPU=1G").replace("MinMemoryCPU", "MinMemoryGPU"), "wrap", None),
    ],
)  # fmt: skip
def test_memory_is_read_from_the_record_squeue_names(
    scontrol: str, name: str, expected: tuple[int, int] | None
) -> None:
    """The record of job 42 with the name squeue gave, account `vision`: its memory, or None
    when not clear (`_Scontrol.record`)."""
    got = _Scontrol(scontrol.encode()).record(42, name, "vision", "(null)")
    assert (got and (got.memory_per_node_mib, got.memory_per_cpu_mib)) == expected


# `scontrol -d show job -o`'s detail of a job, between `CoreSpec=*` and `MinCPUsNode=`, as Slurm
# 22.05 printed it on the test cluster (typed node GRES) and on one whose nodes' GRES have no type.
_A100_2 = " JOB_GRES=gpu:a100:2   Nodes=a100-0 CPU_IDs=0 Mem=1024 GRES=gpu:a100:2(IDX:0-1)"
_RTX_TWO_NODES = (
    " JOB_GRES=gpu:rtx4090:4   Nodes=rtx-0 CPU_IDs=1 Mem=1024 GRES=gpu:rtx4090:2(IDX:3-4)"
    "   Nodes=rtx-1 CPU_IDs=0 Mem=1024 GRES=gpu:rtx4090:2(IDX:0-1)"
)
_A100_WHOLE = (
    " JOB_GRES=gpu:a100:16   Nodes=a100-[0-1] CPU_IDs=0-63 Mem=65536 GRES=gpu:a100:8(IDX:0-7)"
)
_UNTYPED_RUN = " JOB_GRES=gpu:6   Nodes=a100-[0-1] CPU_IDs=0 Mem=1024 GRES=gpu:3(IDX:0-2)"
_UNTYPED_ONE = " JOB_GRES=gpu:2   Nodes=rtx-0 CPU_IDs=0 Mem=1024 GRES=gpu:2(IDX:0-1)"
_COMPLETING = " JOB_GRES=gpu:a100:2   Nodes=a100-0 CPU_IDs=0 Mem=1024 GRES="
_COMPLETING_TWO = (
    " JOB_GRES=gpu:rtx4090:4   Nodes=rtx-0 CPU_IDs=1 Mem=1024 GRES="
    "   Nodes=rtx-1 CPU_IDs=0 Mem=1024 GRES="
)
# Requeued on two nodes, rtx-1 done completing: squeue's (and JSON's) node list is rtx-0.
_COMPLETING_RUN = " JOB_GRES=gpu:rtx4090:2   Nodes=rtx-[0-1] CPU_IDs=0 Mem=1024 GRES="
_NO_GPUS = " JOB_GRES=(null)   Nodes=rtx-0 CPU_IDs=0 Mem=1024 GRES="


def _one(node: str, gres: str) -> str:
    return f" JOB_GRES=gpu:2   Nodes={node} CPU_IDs=0 Mem=1024 GRES={gres}"


@pytest.mark.parametrize(
    ("state", "nodes", "detail", "expected"),
    [
        ("RUNNING", b"a100-0", _A100_2, ((0, 1),)),
        ("RUNNING", b"rtx-[0-1]", _RTX_TWO_NODES, ((3, 4), (0, 1))),
        ("RUNNING", b"a100-[0-1]", _A100_WHOLE, (tuple(range(8)),) * 2),
        ("RUNNING", b"a100-[0-1]", _UNTYPED_RUN, ((0, 1, 2), (0, 1, 2))),
        ("RUNNING", b"rtx-0", _UNTYPED_ONE, ((0, 1),)),
        ("RUNNING", b"a100-0", _one("a100-0", "gpu:a100:3(IDX:0,2-3)"), ((0, 2, 3),)),
        # Completing, ended, or without GPUs: no node shows one, as `gres_detail` is empty.
        ("COMPLETING", b"a100-0", _COMPLETING, ()),
        ("CANCELLED", b"rtx-[0-1]", _COMPLETING_TWO, ()),
        ("COMPLETING", b"rtx-0", _COMPLETING_RUN, ()),  # rtx-1 done: squeue lists rtx-0 alone
        ("RUNNING", b"rtx-0", _NO_GPUS, ()),
        ("PENDING", b"", "", ()),
        ("CANCELLED", b"", "", ()),  # cancelled before it ran
        # Not clear: no indices read (`squeue --json` gives them in a cycle that needs them).
        ("RUNNING", b"a100-0", "", None),  # nodes but no detail
        ("PENDING", b"", _A100_2, None),  # a detail of nodes squeue does not list
        ("RUNNING", b"a100-[0-1]", _A100_2, None),  # a node missing
        ("RUNNING", b"rtx-[0-1]", _RTX_TWO_NODES.replace("rtx-0", "rtx-9"), None),
        ("RUNNING", b"rtx-1,rtx-0", _RTX_TWO_NODES, None),  # another order
        ("RUNNING", b"rtx-[0-1]", _RTX_TWO_NODES.replace("GRES=gpu:rtx4090:2(IDX:0-1)", "GRES="), None),
        ("RUNNING", b"a100-0", _one("a100-0", "gpu:a100:2(IDX:0)"), None),  # 2 GPUs, 1 index
        ("RUNNING", b"a100-0", _one("a100-0", "gpu:a100:2(IDX:1,1)"), None),
        ("RUNNING", b"a100-0", _one("a100-0", "gpu:a100(CNT:2)"), None),
        ("RUNNING", b"a100-0", _one("a100-0", "gpu:a100:1(IDX:0),gpu:l40s:1(IDX:1)"), None),
        ("RUNNING", b"a100-0", _one("a100-0", "mps:100(IDX:0)"), None),
        ("RUNNING", b"a100-0", _one("a100-0", "gpu:a100:0(IDX:N/A)"), None),
        ("RUNNING", b"a100-0", _one("a100-0", "gpu:a100:2(IDX:0-1"), None),
        ("RUNNING", b"a100-0", _one("a100-[0-x]", "gpu:a100:2(IDX:0-1)"), None),
        ("RUNNING", b"a100-0", _A100_2.replace(" Mem=1024", ""), None),
        ("RUNNING", b"a100-0", _A100_2.replace("   Nodes", "  Nodes"), None),
        ("RUNNING", b"a100-0", _A100_2 + " x=y", None),
    ],
)  # fmt: skip
def test_gpu_indices_are_read_from_scontrols_detail_exactly_or_not_at_all(
    state: str, nodes: bytes, detail: str, expected: tuple[tuple[int, ...], ...] | None
) -> None:
    """The detail of `scontrol -d` gives each node's GPU indices as `squeue --json`'s
    `gres_detail` does; anything else leaves the record without them (`gpu_indices_read`
    false), and the rest of the read goes on."""
    scontrol = _scontrol(42, "MinMemoryCPU=1G", detail=detail).replace("PENDING", state)
    record = _record(42, b"", State=state.encode(), NodeList=nodes, Reason=b"None")
    [job] = parse_squeue_text(record, scontrol.encode())
    assert (job.gpu_indices_read, job.gpu_indices) == (expected is not None, expected or ())
    assert job.memory_per_cpu_mib == 1024


def test_the_detail_is_the_one_right_before_the_memory_fields() -> None:
    """A `JOB_GRES=` the JobName or Comment holds is not the job's detail: the name lies
    before the fields searched, the Comment after them."""
    forged = _one("a100-0", "gpu:a100:2(IDX:6-7)")
    scontrol = _scontrol(42, "MinMemoryCPU=1G", name=f"n{forged}", comment=forged, detail=_A100_2)
    record = _record(42, b"", name=f"n{forged}".encode(), State=b"RUNNING", NodeList=b"a100-0")
    [job] = parse_squeue_text(record, scontrol.replace("PENDING", "RUNNING").encode())
    assert (job.gpu_indices_read, job.gpu_indices) == (True, ((0, 1),))


# ---- which cycles read squeue --json -----------------------------------------------------------


class _NoCommands(SlurmCtl):
    def _run(self, program: str, *args: str) -> str:
        return ""

    def now(self) -> float:
        return 1796136520.0


class _Client:
    def cancel_workload(self, uid: str) -> scheduler_pb2.CancelWorkloadResponse:
        return scheduler_pb2.CancelWorkloadResponse()


def _status(state: str) -> scheduler_pb2.WorkloadStatus:
    status = scheduler_pb2.WorkloadStatus(state=state)
    status.workload.uid = "slurm-42"
    status.pods.add(pod_index=0, node="a100-0", gpu_indices=[0, 1])
    return status


@pytest.mark.parametrize("gpufair_state", [None, "pending", "bound", "running"])
@pytest.mark.parametrize(
    "slurm_state",
    ["PENDING", "RUNNING", "CONFIGURING", "SUSPENDED", "COMPLETING", "COMPLETED", "FAILED"],
)
@pytest.mark.parametrize("restarts", [0, 1])
@pytest.mark.parametrize("ran", [True, False])
def test_a_cycle_reads_squeue_json_exactly_when_a_row_reads_gpu_indices(
    gpufair_state: str | None, slurm_state: str, restarts: int, ran: bool
) -> None:
    """`_needs_gpu_indices` against the rows of `_reconcile`: a record of the text read makes
    a row that reads GPU indices fail (`_check_gpu_indices_read`), and only those rows."""
    job = replace(
        parse_job(RAW_JOB),
        state=slurm_state,
        restart_count=restarts,
        nodes=("a100-0",) if ran else (),
        start_time=1796136500 if ran else 0,
        end_time=1796136510 if ran else 0,
        gpu_indices_read=False,
    )
    live = Bridge(CONFIG, cast(GpufairClient, _Client()), _NoCommands(), clock=lambda: 1.8e9)
    status = None if gpufair_state is None else _status(gpufair_state)
    try:
        live._reconciler.reconcile(job, status, [], [], bridge_module.CycleReport())
        read_indices = False
    except SlurmCommandError as exc:
        assert "without its GPU indices" in str(exc)
        read_indices = True
    assert job_states.needs_gpu_indices(job, gpufair_state) == read_indices


def test_the_cycle_after_one_that_needed_json_reads_it_first() -> None:
    """`_text_short`: a pending job with a description (JSON's `state_description`) that the
    cycle did not release makes the next cycle read `squeue --json` first; a start to report
    does not any more (the text read gives GPU indices), nor does a running job with a
    description, nor a described job the cycle placed (its release clears the description),
    nor a job the bridge evicted this cycle (`uhold`, then `requeue`: no description)."""
    from gpufair.integrations.slurm import dependencies

    live = Bridge(CONFIG, cast(GpufairClient, _Client()), _NoCommands())
    quiet = replace(parse_job(RAW_JOB), gpu_indices_read=False)
    described = replace(parse_job(RAW_JOB), state_description="job requeued in held state")
    started = replace(parse_job(RAW_JOB), state="RUNNING", nodes=("a100-0",), start_time=1)
    placed = bridge_module.CycleReport(placed={"slurm-42": ["a100-0"]})
    placed_other = bridge_module.CycleReport(placed={"slurm-41": ["a100-0"]})
    requeued = bridge_module.CycleReport(requeued=["slurm-41"])
    for jobs, report, expected in [
        ([quiet], bridge_module.CycleReport(), False),
        ([quiet], requeued, False),
        ([described], bridge_module.CycleReport(), True),
        ([described], placed_other, True),
        ([described], placed, False),
        ([replace(described, state="RUNNING")], bridge_module.CycleReport(), False),
        ([started], placed, False),
    ]:
        assert parse_job(RAW_JOB).job_id == 42
        live._reconciler.all_jobs = dependencies.Jobs.of(jobs)
        assert live._text_short(report) is expected
