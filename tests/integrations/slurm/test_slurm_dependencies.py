"""The bridge's verdict on a job's `--dependency` (dependencies.py), against Slurm's rules: the
sbatch man page's `--dependency` and what Slurm 22.05 was seen doing (docs/slurm.md). No Slurm
needed.

The dependency text is as `squeue --json` prints it: one part per job id (`afterok:20:21` is
printed `afterok:20(unfulfilled),afterok:21(unfulfilled)`), each with Slurm's mark, and `?`
between every part once any `?` was given.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpufair.integrations.slurm.dependencies import Blocked, unmet
from gpufair.integrations.slurm.records import SlurmJob, parse_job

NOW = 1_800_000_000.0


def job(job_id: int, state: str = "PENDING", **fields: Any) -> SlurmJob:
    raw: dict[str, Any] = {"job_id": job_id, "job_state": state, "partition": "gpu"}
    return parse_job({**raw, **fields})


def verdict(dependency: str, *others: SlurmJob, now_s: float = NOW) -> Blocked | None:
    waiting = job(100, dependency=dependency)
    return unmet(waiting, {j.job_id: j for j in (waiting, *others)}, now_s)


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
        ("afterok:7_3(unfulfilled)", "afterok:7_3"),
        ("afterok:7_*(unfulfilled)", "afterok:7_*"),
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
