"""The bridge's verdict on a job's `--dependency` (dependencies.py), against Slurm's rules: the
sbatch man page's `--dependency` and what Slurm 22.05 was seen doing (docs/slurm.md). No Slurm
needed.

The dependency text is as `squeue --json` prints it: one part per job id (`afterok:20:21` is
printed `afterok:20(unfulfilled),afterok:21(unfulfilled)`), each with Slurm's mark, and `?`
between every part once any `?` was given. Last, the reason the bridge gives for a held job
whose dependency can never be met, whatever hold reason Slurm shows then.
"""

from __future__ import annotations

from typing import Any, cast

import pytest
from slurm_support import bridge_config

from gpufair.client import GpufairClient
from gpufair.integrations.slurm.bridge import Bridge, CycleReport
from gpufair.integrations.slurm.dependencies import Blocked, Jobs, pending_tasks, unmet
from gpufair.integrations.slurm.records import SlurmJob, parse_job
from gpufair.integrations.slurm.slurmctl import SlurmCtl

NOW = 1_800_000_000.0


def job(job_id: int, state: str = "PENDING", **fields: Any) -> SlurmJob:
    raw: dict[str, Any] = {"job_id": job_id, "job_state": state, "partition": "gpu"}
    return parse_job({**raw, **fields})


def verdict(dependency: str, *others: SlurmJob, now_s: float = NOW) -> Blocked | None:
    waiting = job(100, dependency=dependency)
    return unmet(waiting, Jobs.of([waiting, *others]), lambda: now_s)


def waits(reason: str) -> Blocked:
    return Blocked(reason)


def never(reason: str) -> Blocked:
    return Blocked(reason, never=True)


RUNNING_7 = job(7, "RUNNING", start_time=int(NOW) - 120)


def test_no_dependency_never_blocks() -> None:
    assert verdict("") is None


# ---- after: "after the specified jobs start or are cancelled, and 'time' minutes from job start
# or cancellation" ------------------------------------------------------------------------------


def test_after_waits_while_the_other_job_is_pending() -> None:
    assert verdict("after:7(unfulfilled)", job(7)) == waits(
        "waits for dependency after:7 (job 7 PENDING)"
    )


@pytest.mark.parametrize("state", ["RUNNING", "SUSPENDED", "COMPLETED", "FAILED"])
def test_after_is_met_once_the_other_job_started(state: str) -> None:
    assert verdict("after:7(unfulfilled)", job(7, state, start_time=int(NOW) - 5)) is None


def test_after_is_met_by_a_job_cancelled_before_it_started() -> None:
    # Slurm gives a job cancelled while pending a start time equal to its end time.
    cancelled = job(7, "CANCELLED", start_time=int(NOW) - 5, end_time=int(NOW) - 5)
    assert verdict("after:7(unfulfilled)", cancelled) is None


def test_after_plus_minutes_waits_that_long_from_the_start() -> None:
    started = int(NOW) - 4 * 60
    other = job(7, "RUNNING", start_time=started)
    assert verdict("after:7+5(unfulfilled)", other) == waits(
        f"waits for dependency after:7+5 (job 7 started at {started})"
    )
    assert verdict("after:7+5(unfulfilled)", other, now_s=started + 5 * 60 - 1) is not None
    assert verdict("after:7+5(unfulfilled)", other, now_s=started + 5 * 60) is None


def test_after_plus_minutes_waits_while_the_other_job_is_pending() -> None:
    assert verdict("after:7+5(unfulfilled)", job(7)) == waits(
        "waits for dependency after:7+5 (job 7 PENDING)"
    )


def test_after_plus_minutes_counts_from_a_cancellation_before_start() -> None:
    cancelled_at = int(NOW) - 60
    cancelled = job(7, "CANCELLED", start_time=cancelled_at, end_time=cancelled_at)
    assert verdict("after:7+2(unfulfilled)", cancelled) == waits(
        f"waits for dependency after:7+2 (job 7 started at {cancelled_at})"
    )
    assert verdict("after:7+2(unfulfilled)", cancelled, now_s=cancelled_at + 120) is None


# ---- afterany: "after the specified jobs have terminated" ---------------------------------------


@pytest.mark.parametrize("state", ["PENDING", "RUNNING", "SUSPENDED", "COMPLETING"])
def test_afterany_waits_until_the_other_job_ended(state: str) -> None:
    assert verdict("afterany:7(unfulfilled)", job(7, state)) == waits(
        f"waits for dependency afterany:7 (job 7 {state})"
    )


@pytest.mark.parametrize(
    "state", ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"]
)
def test_afterany_is_met_by_any_end(state: str) -> None:
    assert verdict("afterany:7(unfulfilled)", job(7, state)) is None


def test_afterany_ignores_minutes() -> None:
    """Slurm 22.05 accepts `afterany:N+m` and starts the job as soon as N ended: the minutes
    count for `after` only."""
    assert verdict("afterany:7+3(unfulfilled)", job(7, "COMPLETED", end_time=int(NOW))) is None


# ---- afterok: "after the specified jobs have successfully executed (exit code zero)" ------------


def test_afterok_waits_while_the_other_job_runs() -> None:
    assert verdict("afterok:7(unfulfilled)", RUNNING_7) == waits(
        "waits for dependency afterok:7 (job 7 RUNNING)"
    )


def test_afterok_is_met_by_completed() -> None:
    assert verdict("afterok:7(unfulfilled)", job(7, "COMPLETED")) is None


@pytest.mark.parametrize("state", ["FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED"])
def test_afterok_can_never_be_met_after_any_other_end(state: str) -> None:
    assert verdict("afterok:7(unfulfilled)", job(7, state)) == never(
        f"dependency afterok:7 can never be met (job 7 {state})"
    )


# ---- afternotok: "after the specified jobs have terminated in some failed state" ---------------


def test_afternotok_waits_while_the_other_job_runs() -> None:
    assert verdict("afternotok:7(unfulfilled)", RUNNING_7) == waits(
        "waits for dependency afternotok:7 (job 7 RUNNING)"
    )


@pytest.mark.parametrize("state", ["FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"])
def test_afternotok_is_met_by_any_failed_end(state: str) -> None:
    assert verdict("afternotok:7(unfulfilled)", job(7, state)) is None


def test_afternotok_can_never_be_met_after_completed() -> None:
    assert verdict("afternotok:7(unfulfilled)", job(7, "COMPLETED")) == never(
        "dependency afternotok:7 can never be met (job 7 COMPLETED)"
    )


# ---- Slurm's own marks --------------------------------------------------------------------------


def test_a_part_slurm_marked_failed_can_never_be_met_whatever_the_job_shows() -> None:
    """Slurm judges the dependencies of held jobs too, in its periodic pass, and marks a part
    that failed `(failed)` (reason DependencyNeverSatisfied), even once the job is gone."""
    assert verdict("afterok:7(failed)") == never("dependency afterok:7 can never be met")
    assert verdict("afterok:7(failed)", job(7, "COMPLETED")) == never(
        "dependency afterok:7 can never be met"
    )


def test_a_part_slurm_marked_failed_names_the_end_that_decided_it() -> None:
    """The same words before and after Slurm's pass marks the part: the bridge judges at once,
    Slurm up to a minute later."""
    assert verdict("afternotok:7(failed)", job(7, "COMPLETED")) == never(
        "dependency afternotok:7 can never be met (job 7 COMPLETED)"
    )
    assert verdict("afterok:7(failed)", job(7, "TIMEOUT")) == never(
        "dependency afterok:7 can never be met (job 7 TIMEOUT)"
    )
    ended = (task(25, 19, 0, "COMPLETED"), task(19, 19, 1, "FAILED"))
    assert verdict("afterok:19_*(failed)", *ended) == never(
        "dependency afterok:19_* can never be met (array 19 tasks COMPLETED, FAILED)"
    )
    # An end that would not decide it: Slurm's mark alone.
    assert verdict("afterany:7(failed)", job(7, "FAILED")) == never(
        "dependency afterany:7 can never be met"
    )


def test_a_part_slurm_marked_fulfilled_is_met() -> None:
    assert verdict("afterok:7(fulfilled)", job(7, "FAILED")) is None


# ---- a job Slurm does not list ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["after", "afterany", "afterok", "afternotok"])
def test_a_job_slurm_does_not_list_counts_as_met(kind: str) -> None:
    """Slurm 22.05 lifts a dependency on a job it does not know: `sbatch
    --dependency=afterok:999999` is accepted and, not held, runs at once; held, its dependency
    is cleared by Slurm's next pass. The same for a job purged after MinJobAge, whatever its
    end: `afterok` on a job that failed an hour ago runs."""
    assert verdict(f"{kind}:999999(unfulfilled)") is None


def test_a_job_slurm_does_not_list_meets_its_part_only() -> None:
    assert verdict("afterok:999999(unfulfilled),afterok:7(unfulfilled)", RUNNING_7) == waits(
        "waits for dependency afterok:7 (job 7 RUNNING)"
    )


# ---- `,`: every part; `?`: any part ------------------------------------------------------------


def test_all_of_waits_for_every_part() -> None:
    ended = job(8, "COMPLETED")
    assert verdict("afterok:8(unfulfilled),afterany:7(unfulfilled)", ended, RUNNING_7) == waits(
        "waits for dependency afterany:7 (job 7 RUNNING)"
    )
    assert verdict("afterok:8(unfulfilled),afterany:7(unfulfilled)", ended, job(7, "FAILED")) is (
        None
    )


def test_all_of_lists_every_part_that_waits() -> None:
    assert verdict("afterok:7(unfulfilled),afterany:8(unfulfilled)", RUNNING_7, job(8)) == waits(
        "waits for dependency afterok:7 (job 7 RUNNING); "
        "waits for dependency afterany:8 (job 8 PENDING)"
    )


def test_all_of_can_never_be_met_once_one_part_cannot() -> None:
    """Slurm: `afterok:30(failed),afterany:31(unfulfilled)` is DependencyNeverSatisfied."""
    assert verdict(
        "afterok:8(unfulfilled),afterany:7(unfulfilled)", job(8, "FAILED"), RUNNING_7
    ) == never(
        "dependency afterok:8 can never be met (job 8 FAILED); "
        "waits for dependency afterany:7 (job 7 RUNNING)"
    )


def test_any_of_is_met_by_one_part() -> None:
    assert verdict(
        "afterok:7(unfulfilled)?afterany:8(unfulfilled)", RUNNING_7, job(8, "FAILED")
    ) is (None)


def test_any_of_waits_while_one_part_still_may_be_met() -> None:
    """Slurm: `afterok:30(failed)?afterok:31(unfulfilled)` waits (reason Dependency)."""
    assert verdict(
        "afterok:8(unfulfilled)?afterok:7(unfulfilled)", job(8, "FAILED"), RUNNING_7
    ) == (
        waits(
            "dependency afterok:8 can never be met (job 8 FAILED); "
            "waits for dependency afterok:7 (job 7 RUNNING)"
        )
    )


def test_any_of_can_never_be_met_once_no_part_can() -> None:
    assert verdict("afterok:8(failed)?afternotok:9(unfulfilled)", job(9, "COMPLETED")) == never(
        "dependency afterok:8 can never be met; "
        "dependency afternotok:9 can never be met (job 9 COMPLETED)"
    )


def test_any_of_is_met_by_a_job_slurm_does_not_list() -> None:
    assert verdict("afterok:7(unfulfilled)?afterok:999999(unfulfilled)", RUNNING_7) is None


def test_any_question_mark_makes_the_whole_list_any_of() -> None:
    """Slurm accepts both separators in one list (`afterok:1,afterok:2?afterok:3`) and then
    prints `?` between every part: any part is enough."""
    assert verdict("afterok:7,afterok:8?afterany:9", RUNNING_7, job(8), job(9)) == waits(
        "waits for dependency afterok:7 (job 7 RUNNING); "
        "waits for dependency afterok:8 (job 8 PENDING); "
        "waits for dependency afterany:9 (job 9 PENDING)"
    )
    assert verdict("afterok:7,afterok:8?afterany:9", RUNNING_7, job(8), job(9, "FAILED")) is None


# ---- not judged, malformed ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dependency", "shown"),
    [
        ("singleton(unfulfilled)", "singleton"),
        ("aftercorr:7(unfulfilled)", "aftercorr:7"),
        ("afterburstbuffer:7(unfulfilled)", "afterburstbuffer:7"),
        ("afterok:7_x(unfulfilled)", "afterok:7_x"),
    ],
)
def test_kinds_the_bridge_does_not_judge_keep_the_job_held_with_why(
    dependency: str, shown: str
) -> None:
    assert verdict(dependency, job(7, "COMPLETED")) == waits(
        f"dependency {shown} is not supported by the gpufair bridge"
    )


@pytest.mark.parametrize(
    "dependency",
    ["afterok", "afterok:", "afterok:x", "afterok:7+", "afterok:7(unfulfilled", ":7", "7"],
)
def test_malformed_parts_keep_the_job_held_with_why(dependency: str) -> None:
    assert verdict(dependency, job(7, "COMPLETED")) == waits(
        f"dependency {dependency} is not supported by the gpufair bridge"
    )


def test_a_part_not_judged_does_not_block_an_any_of_met_otherwise() -> None:
    assert verdict("singleton(unfulfilled)?afterok:7(unfulfilled)", job(7, "COMPLETED")) is None


def test_empty_parts_are_skipped() -> None:
    assert verdict("afterok:7(unfulfilled),,", job(7, "COMPLETED")) is None


# ---- the minutes of `after:N+m`, on Slurm's clock ------------------------------------------------


def test_slurms_time_is_asked_only_when_a_part_waits_on_its_minutes() -> None:
    """`now` is Slurm's time (`sdiag`, one call per cycle at most): asked for `after:N+m` once N
    started, never otherwise."""
    asked: list[str] = []

    def now() -> float:
        asked.append("now")
        return NOW

    def judge(dependency: str, *others: SlurmJob) -> Blocked | None:
        waiting = job(100, dependency=dependency)
        return unmet(waiting, Jobs.of([waiting, *others]), now)

    assert judge("afterok:7(unfulfilled)", RUNNING_7) is not None
    assert judge("after:7(unfulfilled)", RUNNING_7) is None
    assert judge("after:7+5(unfulfilled)", job(7)) is not None
    assert asked == []
    assert judge("after:7+5(unfulfilled)", RUNNING_7) is not None
    assert asked == ["now"]


# ---- job arrays: `N_*` (what Slurm makes of a master id) is every task; `N_k` is task k ----------
# squeue lists a running or ended task as a record of its own (its own job id, `array_job_id` N,
# `array_task_id` k; the last task split off keeps job id N), and the tasks still pending as one
# record (job id N, `array_task_string` '2-3').


def task(job_id: int, array: int, k: int, state: str, **fields: Any) -> SlurmJob:
    return job(job_id, state, array_job_id=array, array_task_id=k, **fields)


def rest(array: int, tasks: str, state: str = "PENDING") -> SlurmJob:
    """The array's record of the tasks still pending."""
    return job(array, state, array_job_id=array, array_task_string=tasks)


def test_pending_tasks_reads_slurms_task_lists() -> None:
    assert pending_tasks("2-3") == {2, 3}
    assert pending_tasks("1,4-5") == {1, 4, 5}
    assert pending_tasks("0-8:4%2") == {0, 4, 8}
    assert pending_tasks("[1-2%1]") == {1, 2}
    assert pending_tasks("x") is None


def test_afterok_on_an_array_waits_for_every_task_though_one_failed() -> None:
    """Seen on 22.05: `afterok:19_*` stayed unfulfilled for 36 s after task 1 failed, while the
    other tasks ran, and was marked failed once they ended."""
    tasks = (task(25, 19, 0, "RUNNING"), task(26, 19, 1, "FAILED"), task(19, 19, 2, "RUNNING"))
    assert verdict("afterok:19_*(unfulfilled)", *tasks) == waits(
        "waits for dependency afterok:19_* (array 19 tasks FAILED, RUNNING)"
    )
    ended = (task(25, 19, 0, "COMPLETED"), task(26, 19, 1, "FAILED"), task(19, 19, 2, "COMPLETED"))
    assert verdict("afterok:19_*(unfulfilled)", *ended) == never(
        "dependency afterok:19_* can never be met (array 19 tasks COMPLETED, FAILED)"
    )


def test_afterok_on_an_array_is_met_when_every_task_completed() -> None:
    ended = (task(25, 19, 0, "COMPLETED"), task(19, 19, 1, "COMPLETED"))
    assert verdict("afterok:19_*(unfulfilled)", *ended) is None
    # The last task split off keeps the master's id: one record alone is not the array.
    assert verdict("afterok:19_*(unfulfilled)", task(25, 19, 0, "RUNNING"), ended[1]) == waits(
        "waits for dependency afterok:19_* (array 19 tasks COMPLETED, RUNNING)"
    )


def test_afternotok_on_an_array_waits_for_every_task_then_needs_one_failure() -> None:
    running = (task(25, 19, 0, "RUNNING"), task(26, 19, 1, "FAILED"), task(19, 19, 2, "RUNNING"))
    assert verdict("afternotok:19_*(unfulfilled)", *running) == waits(
        "waits for dependency afternotok:19_* (array 19 tasks FAILED, RUNNING)"
    )
    ended = (task(25, 19, 0, "COMPLETED"), task(26, 19, 1, "FAILED"), task(19, 19, 2, "COMPLETED"))
    assert verdict("afternotok:19_*(unfulfilled)", *ended) is None
    passed = (task(25, 19, 0, "COMPLETED"), task(19, 19, 1, "COMPLETED"))
    assert verdict("afternotok:19_*(unfulfilled)", *passed) == never(
        "dependency afternotok:19_* can never be met (array 19 tasks COMPLETED)"
    )


def test_afterany_on_an_array_waits_for_tasks_still_pending() -> None:
    started = (task(27, 20, 0, "COMPLETED"), rest(20, "1-2%1"))
    assert verdict("afterany:20_*(unfulfilled)", *started) == waits(
        "waits for dependency afterany:20_* (array 20 tasks COMPLETED, PENDING)"
    )
    ended = (task(27, 20, 0, "COMPLETED"), task(28, 20, 1, "FAILED"), task(20, 20, 2, "COMPLETED"))
    assert verdict("afterany:20_*(unfulfilled)", *ended) is None


def test_after_on_an_array_waits_until_every_task_started() -> None:
    """Seen on 22.05 with `--array=0-2%1` (one task at a time): `after:20_*` was cleared once the
    last task started, not when the first did."""
    first = (task(27, 20, 0, "RUNNING", start_time=int(NOW) - 10), rest(20, "1-2%1"))
    assert verdict("after:20_*(unfulfilled)", *first) == waits(
        "waits for dependency after:20_* (array 20 tasks PENDING, RUNNING)"
    )
    every = (
        task(27, 20, 0, "COMPLETED", start_time=int(NOW) - 30),
        task(28, 20, 1, "COMPLETED", start_time=int(NOW) - 20),
        task(20, 20, 2, "RUNNING", start_time=int(NOW) - 10),
    )
    assert verdict("after:20_*(unfulfilled)", *every) is None


def test_one_task_of_an_array_is_judged_alone() -> None:
    tasks = (task(25, 19, 0, "COMPLETED"), task(26, 19, 1, "FAILED"), rest(19, "2-3"))
    assert verdict("afterok:19_0(unfulfilled)", *tasks) is None
    assert verdict("afterok:19_1(unfulfilled)", *tasks) == never(
        "dependency afterok:19_1 can never be met (job 19_1 FAILED)"
    )
    assert verdict("afterok:19_3(unfulfilled)", *tasks) == waits(
        "waits for dependency afterok:19_3 (job 19_3 PENDING)"
    )
    # A task's own job id is a job like any other (Slurm keeps `afterok:26` as given).
    assert verdict("afternotok:26(unfulfilled)", *tasks) is None


def test_an_array_slurm_does_not_list_counts_as_met() -> None:
    assert verdict("afterok:19_*(unfulfilled)") is None
    assert verdict("afterok:19_4(unfulfilled)", task(25, 19, 0, "RUNNING")) is None


def test_after_plus_minutes_on_an_array_counts_from_the_last_task_start() -> None:
    """Seen on 22.05: `after:29_*+1` with tasks started at t and t + 40 s ran at t + 113 s
    (Slurm's pass a few seconds late), not a minute after the first start."""
    first_start, last_start = int(NOW) - 100, int(NOW) - 40
    tasks = (
        task(31, 29, 0, "COMPLETED", start_time=first_start),
        task(29, 29, 1, "RUNNING", start_time=last_start),
    )
    assert verdict("after:29_*+1(unfulfilled)", *tasks) == waits(
        f"waits for dependency after:29_*+1 (array 29 started at {last_start})"
    )
    assert verdict("after:29_*+1(unfulfilled)", *tasks, now_s=last_start + 60) is None


# ---- the bridge's reason for a held job: Slurm's pass makes its hold look like an operator's ----


class CommentsOnly(SlurmCtl):
    """Records the commands the bridge issues; Slurm's time is never asked for here."""

    def __init__(self) -> None:
        super().__init__()
        self.commands: list[list[str]] = []

    def _run(self, program: str, *args: str) -> str:
        self.commands.append([program, *args])
        if program == "sdiag":
            raise AssertionError("Slurm's time is not needed")
        return ""


def comment_for(held: SlurmJob, *others: SlurmJob) -> list[list[str]]:
    """The commands a cycle issues for `held`, a job gpufair does not have, with `others` the
    other jobs squeue lists."""
    slurm = CommentsOnly()
    bridge = Bridge(bridge_config(), cast(GpufairClient, None), slurm)
    bridge._reconciler.all_jobs = Jobs.of([held, *others])
    to_submit: list[Any] = []
    bridge._reconciler._reconcile_waiting(
        held, f"slurm-{held.job_id}", None, to_submit, CycleReport()
    )
    assert to_submit == []
    return slurm.commands


def test_a_dependency_slurm_failed_is_the_reason_though_slurm_then_shows_an_operators_hold() -> (
    None
):
    """Seen on 22.05: a job held with `sbatch --hold` (the bridge's user hold, JobHeldUser) whose
    `afternotok:N` can never be met, N having COMPLETED, reads `JobHeldAdmin` and
    `afternotok:N(failed)` after Slurm's next dependency pass (about a minute on), and again
    after an `scontrol uhold`: Slurm turns the reason of any job with priority 0 whose
    dependency failed into JobHeldAdmin. No operator held it, and no `uhold` would let it run."""
    passing = job(7, "COMPLETED")
    before = job(100, state_reason="JobHeldUser", dependency="afternotok:7(unfulfilled)")
    after = job(100, state_reason="JobHeldAdmin", dependency="afternotok:7(failed)")
    expected = [
        [
            "scontrol", "update", "JobId=100",
            "Comment=gpufair: not scheduled: dependency afternotok:7 can never be met "
            "(job 7 COMPLETED)",
        ]
    ]  # fmt: skip
    assert comment_for(before, passing) == expected
    assert comment_for(after, passing) == expected


def test_an_operators_hold_is_the_reason_while_the_dependency_may_still_be_met() -> None:
    running = job(7, "RUNNING", start_time=int(NOW) - 5)
    held = job(100, state_reason="JobHeldAdmin", dependency="afternotok:7(unfulfilled)")
    assert comment_for(held, running) == [
        [
            "scontrol", "update", "JobId=100",
            "Comment=gpufair: not scheduled: held by an operator (scontrol hold); scontrol uhold "
            "100 hands it back to gpufair",
        ]
    ]  # fmt: skip
