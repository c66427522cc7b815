"""`gpufair serve`'s bind timeout and periodic-job options: each as a flag and as its GPUFAIR_*
variable, its default the code's own, out-of-range values refused with one clear line."""

from __future__ import annotations

import argparse

import pytest

from gpufair.cli import build_parser
from gpufair.cli.serve import job_settings
from gpufair.jobs.runner import JobSettings
from gpufair.store.schedule_repo import DEFAULT_BIND_TIMEOUT_S


def serve(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def settings(*argv: str) -> JobSettings:
    return job_settings(serve(*argv), JobSettings)


def test_defaults_are_the_codes_own() -> None:
    assert serve().bind_timeout_s == DEFAULT_BIND_TIMEOUT_S == 300.0
    assert settings() == JobSettings(tick_s=10.0, stale_after_s=600.0)
    assert (settings().attempts, settings().retry_backoff_s, settings().recompute_workers) == (
        3,
        15.0,
        2,
    )


def test_each_from_its_flag() -> None:
    args = ["--bind-timeout", "45", "--job-attempts", "5", "--job-retry-backoff-s", "2m"]
    got = settings(*args, "--recompute-threads", "4")
    assert (got.attempts, got.retry_backoff_s, got.recompute_workers) == (5, 120.0, 4)
    assert serve(*args).bind_timeout_s == 45.0
    assert serve("--bind-timeout-s=1m30s").bind_timeout_s == 90.0
    assert settings("--job-retry-backoff-s", "0").retry_backoff_s == 0.0  # the next tick


def test_each_from_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFAIR_BIND_TIMEOUT_S", "10m")
    monkeypatch.setenv("GPUFAIR_JOB_ATTEMPTS", "1")
    monkeypatch.setenv("GPUFAIR_JOB_RETRY_BACKOFF_S", "30")
    monkeypatch.setenv("GPUFAIR_RECOMPUTE_THREADS", "6")
    got = settings()
    assert (got.attempts, got.retry_backoff_s, got.recompute_workers) == (1, 30.0, 6)
    assert serve().bind_timeout_s == 600.0
    # The flag wins over the variable.
    assert serve("--bind-timeout", "20").bind_timeout_s == 20.0


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (
            ["--bind-timeout", "0"],
            "argument --bind-timeout-s/--bind-timeout: '0': give seconds in (0, 86400]",
        ),
        (["--bind-timeout", "-5"], "'-5': give seconds in (0, 86400]"),
        (["--bind-timeout", "2d"], "'2d': give seconds in (0, 86400]"),
        (["--bind-timeout", "nan"], "'nan' is not seconds (e.g. 300, 90s, 5m, 1h)"),
        (["--bind-timeout", "soon"], "'soon' is not seconds (e.g. 300, 90s, 5m, 1h)"),
        (["--job-attempts", "0"], "argument --job-attempts: '0': give a whole number in [1, 10]"),
        (["--job-attempts", "11"], "'11': give a whole number in [1, 10]"),
        (["--job-attempts", "2.5"], "'2.5' is not a whole number"),
        (
            ["--job-retry-backoff-s", "-1"],
            "argument --job-retry-backoff-s: '-1': give seconds in [0, 86400]",
        ),
        (["--job-retry-backoff-s", "inf"], "'inf' is not seconds"),
        (
            ["--recompute-threads", "0"],
            "argument --recompute-threads: '0': give a whole number in [1, 8]",
        ),
        (["--recompute-threads", "9"], "'9': give a whole number in [1, 8]"),
    ],
)
def test_out_of_range_is_refused(
    capsys: pytest.CaptureFixture[str], argv: list[str], error: str
) -> None:
    with pytest.raises(SystemExit) as stopped:
        serve(*argv)
    assert stopped.value.code == 2
    (last,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert error in last


def test_a_bad_variable_names_itself(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFAIR_JOB_ATTEMPTS", "0")
    with pytest.raises(SystemExit) as stopped:
        serve()
    assert stopped.value.code == 2
    assert capsys.readouterr().err.endswith(
        "error: $GPUFAIR_JOB_ATTEMPTS: '0' is not valid for --job-attempts: "
        "'0': give a whole number in [1, 10]\n"
    )


def test_help_says_what_each_does(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        serve("--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "--bind-timeout-s SECONDS, --bind-timeout SECONDS a placement Schedule" in text
    assert "at most 1d [$GPUFAIR_BIND_TIMEOUT_S] (default: 300.0)" in text
    assert "1 to 10 (1: no retry) [$GPUFAIR_JOB_ATTEMPTS] (default: 3)" in text
    assert "each later retry waits 4 times longer (15 s, then 60 s by default)" in text
    assert "while it runs [$GPUFAIR_RECOMPUTE_THREADS] (default: 2)" in text
