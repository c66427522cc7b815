"""The Slurm commands the bridge runs, each with its exit code checked.

Reads:

- `jobs()`, every job, each cycle: `squeue --all --states=all -h -O ...` (text, times as
  epoch seconds) for states, requests, times and Comments, then `scontrol --all -d show job -o`
  for each job's memory per CPU or per node, which the text does not tell apart, and, in its
  detail (`-d`), the GPU indices of a job that holds resources (records.py,
  `parse_squeue_text`). A job whose detail does not read clearly has no indices in its record
  (`gpu_indices_read` false). When the text does not parse as asked, or a job's memory is not
  clear in `scontrol` (a JobName or Comment that forges its fields, a job gone between the two
  reads), it reads `squeue --json` instead: nothing is guessed.
- `jobs(gpu_indices=True)`: `squeue --json --all` (every job, with GPU indices), which the
  bridge reads only in a cycle whose rows need the GPU indices of a job the text read gave
  none for (a start to report, a requeued job COMPLETING to judge). Slurm 22.05's `squeue
  --json` ignores squeue's filters (`-t`, `-p`, `-j`, `--format`: the same document, about
  3.1 KB a job) and is the costly read (0.19 s of CPU at 2,000 jobs, against 0.013 s for
  `squeue -O` and 0.024 s for `scontrol -d show job -o`; bench/results/slurm_bridge.md, round
  29).
- `sinfo --json` (nodes with GRES and state) and `sdiag` (the controller's time now, in a cycle
  that compares a time Slurm reports with it).

Writes, one `scontrol` each:

- `pin(job, nodes, start_now=...)`: `scontrol update JobId=N NodeList=...`, with `StartTime=now`
  when told. A combined update with one bad field is rejected whole; `StartTime=now` clears the
  eligible time Slurm sets on a requeue (about two minutes ahead), so a requeued job placed again
  starts at once (the bridge pins it no sooner than 2 s after the requeue: `RELAUNCH_AFTER_S`). The bridge asks for it only for a job whose begin time needs clearing: any
  `StartTime=` overwrites a begin time set since the bridge read the job, a user's hold included.
- `release(job)`, `hold(job)`, `requeue(job)`, `set_comment(job, text)`. The bridge's hold
  is a user hold (`scontrol uhold`, reason `JobHeldUser`), as `sbatch --hold` and a job_submit
  plugin's priority 0 give: an operator's hold (`scontrol hold`, reason `JobHeldAdmin`) then
  stays visible as such, and the bridge leaves that job alone. An eviction is `hold` of the
  running job, then `requeue` (not `requeuehold`, whose description hides an operator's later
  hold from the text read; bridge.py, `_requeue`).

`hold_many(jobs)` and `release_many(jobs)` do what `hold` and `release` do, for many jobs in one
`scontrol uhold|release 1,2,3` (at most `MANY` ids a command): one process and one config read
instead of one per job, which is what a cycle holding a backlog or placing dozens of jobs spent
most of its time on. Slurm acts on every job of the list and says which failed, one line each
(`Job has already finished for job 3`, `Invalid job id specified for job 9`; seen on 22.05),
exiting 1: those jobs come back as failed with their line, the others done. A failure that names
no job (the controller unreachable) fails every job of the list. One job goes through `hold`
or `release`, exactly as before.

A command that fails raises `SlurmCommandError` with its output, and nothing after it runs: the
bridge's "pin then release" never releases a job whose pin failed (Slurm would place it itself).
A read that Slurm could not answer fails too: with the controller unreachable, `squeue --json` and
`sinfo --json` exit 0 with an empty list and the failure under `errors`, and an empty list taken
at its word would mean "every job and node is gone". The text reads exit non-zero then
(`slurm_load_jobs error: Unable to contact slurm controller`; seen on 22.05).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from gpufair.integrations.slurm.records import (
    SQUEUE_FORMAT,
    SlurmJob,
    SlurmNode,
    TextReadError,
    parse_job,
    parse_node,
    parse_squeue_text,
)

log = logging.getLogger("gpufair.slurm_bridge")

_SDIAG_AT_RE = re.compile(r"^sdiag output at .*\((\d+)\)\s*$", re.MULTILINE)
_FOR_JOB_RE = re.compile(r"^(.*\S) for job (\d+)\s*$", re.MULTILINE)
MANY = 500  # job ids in one scontrol hold/release


class SlurmCommandError(RuntimeError):
    """A Slurm command exited non-zero (or could not run)."""


class SlurmCtl:
    def __init__(self, bin_dir: str = "", *, timeout_s: float = 30.0) -> None:
        self.bin_dir = bin_dir
        self.timeout_s = timeout_s

    def _run(self, program: str, *args: str) -> str:
        return self._run_full(program, *args).stdout

    def _run_full(
        self, program: str, *args: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a command; exiting non-zero raises unless `check` is false (its whole output is
        the caller's to read then)."""
        argv = [str(Path(self.bin_dir) / program) if self.bin_dir else program, *args]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmCommandError(f"{' '.join(argv)[:200]}: {exc}") from exc
        if check and done.returncode != 0:
            output = (done.stderr.strip() or done.stdout.strip())[:500]
            raise SlurmCommandError(f"{' '.join(argv)} exited {done.returncode}: {output}")
        return done

    def _run_bytes(self, program: str, *args: str, env: dict[str, str] | None = None) -> bytes:
        """Run a command, its output as bytes (a Comment need not be UTF-8); exiting non-zero
        raises."""
        argv = [str(Path(self.bin_dir) / program) if self.bin_dir else program, *args]
        try:
            done = subprocess.run(
                argv, capture_output=True, timeout=self.timeout_s, check=False, env=env
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmCommandError(f"{' '.join(argv)[:200]}: {exc}") from exc
        if done.returncode != 0:
            said = (done.stderr.strip() or done.stdout.strip())[:500].decode("utf-8", "replace")
            raise SlurmCommandError(f"{' '.join(argv)[:200]} exited {done.returncode}: {said}")
        return done.stdout

    def _read(self, program: str, *args: str) -> dict[str, Any]:
        """A `--json` read; its `errors` (Slurm's answer when it has none) raise."""
        data = json.loads(self._run(program, *args))
        errors = data.get("errors") or []
        if errors:
            said = "; ".join(
                " ".join(str(e.get(k, "")) for k in ("source", "description", "error")).strip()
                for e in errors
            )
            raise SlurmCommandError(f"{program} {' '.join(args)} reported errors: {said}"[:500])
        return cast(dict[str, Any], data)

    def jobs(self, *, gpu_indices: bool = False) -> list[SlurmJob]:
        """Every job Slurm lists: from the text reads (GPU indices where `scontrol -d` gives
        them clearly), or from `squeue --json` when `gpu_indices` is asked or the text reads
        are not clear (see the module's docstring)."""
        if not gpu_indices:
            try:
                return self.jobs_text()
            except TextReadError as exc:
                log.info("squeue text read not used, squeue --json instead: %s", exc)
        data = self._read("squeue", "--json", "--all")
        return [parse_job(raw) for raw in data.get("jobs", [])]

    def jobs_text(self) -> list[SlurmJob]:
        """`squeue -O` and `scontrol -d show job -o`, parsed (records.py); `TextReadError` when
        they are not clear."""
        env = {**os.environ, "SLURM_TIME_FORMAT": "%s"}
        out = self._run_bytes("squeue", "--all", "--states=all", "-h", "-O", SQUEUE_FORMAT, env=env)
        if not out:
            return []
        # `--all` as squeue's: the jobs of hidden partitions too.
        detail = self._run_bytes("scontrol", "--all", "-d", "show", "job", "-o")
        return parse_squeue_text(out, detail)

    def nodes(self) -> list[SlurmNode]:
        data = self._read("sinfo", "--json")
        return [parse_node(raw) for raw in data.get("nodes", [])]

    def now(self) -> float:
        """Slurm's time now, from the controller: `sdiag`'s first line, `sdiag output at ...
        (EPOCH)`. The times squeue reports (start, begin) are the controller's, so the bridge
        compares them with this, never with its own clock."""
        out = self._run("sdiag")
        match = _SDIAG_AT_RE.search(out)
        if match is None:
            raise SlurmCommandError(f"sdiag: no time in its output: {out[:200]!r}")
        return float(match.group(1))

    def pin(self, job_id: int, nodes: Sequence[str], *, start_now: bool) -> None:
        start = ["StartTime=now"] if start_now else []
        self._run("scontrol", "update", f"JobId={job_id}", f"NodeList={','.join(nodes)}", *start)

    def release(self, job_id: int) -> None:
        self._run("scontrol", "release", str(job_id))

    def hold(self, job_id: int) -> None:
        self._run("scontrol", "uhold", str(job_id))

    def hold_many(self, job_ids: Sequence[int]) -> dict[int, SlurmCommandError]:
        """`hold` of each job, in as few commands as `MANY` allows: the jobs that failed, with
        why."""
        return self._many("uhold", self.hold, job_ids)

    def release_many(self, job_ids: Sequence[int]) -> dict[int, SlurmCommandError]:
        """`release` of each job, as `hold_many`."""
        return self._many("release", self.release, job_ids)

    def _many(
        self, verb: str, one: Callable[[int], None], job_ids: Sequence[int]
    ) -> dict[int, SlurmCommandError]:
        failed: dict[int, SlurmCommandError] = {}
        if len(job_ids) == 1:
            try:
                one(job_ids[0])
            except SlurmCommandError as exc:
                failed[job_ids[0]] = exc
            return failed
        for start in range(0, len(job_ids), MANY):
            chunk = job_ids[start : start + MANY]
            try:
                done = self._run_full("scontrol", verb, ",".join(map(str, chunk)), check=False)
            except SlurmCommandError as exc:
                failed.update(dict.fromkeys(chunk, exc))
                continue
            if done.returncode != 0:
                failed.update(_failed_jobs(verb, chunk, done))
        return failed

    def requeue(self, job_id: int) -> None:
        """`scontrol requeue N`: the bridge's eviction, after `hold` of the running job (the
        bridge's `_requeue` says why not `requeuehold`)."""
        self._run("scontrol", "requeue", str(job_id))

    def set_comment(self, job_id: int, text: str) -> None:
        self._run("scontrol", "update", f"JobId={job_id}", f"Comment={text}")


def _failed_jobs(
    verb: str, job_ids: Sequence[int], done: subprocess.CompletedProcess[str]
) -> dict[int, SlurmCommandError]:
    """The jobs of a failed `scontrol uhold|release 1,2,3` that Slurm names, each with its line
    (`scontrol release 3 exited 1: Job has already finished for job 3`, as the command of that
    job alone says it); every job of the list when it names none of them."""
    output = f"{done.stderr}\n{done.stdout}"
    asked = set(job_ids)
    named = {int(m.group(2)): m.group(0).strip() for m in _FOR_JOB_RE.finditer(output)}
    failed = {
        job: SlurmCommandError(f"scontrol {verb} {job} exited {done.returncode}: {line}")
        for job, line in named.items()
        if job in asked
    }
    if failed:
        return failed
    said = (done.stderr.strip() or done.stdout.strip())[:500]
    error = SlurmCommandError(
        f"scontrol {verb} (list of {len(job_ids)}) exited {done.returncode}: {said}"
    )
    return dict.fromkeys(job_ids, error)
