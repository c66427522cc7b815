"""`gpufair serve`'s retention options: every age `Retention` has, each as a flag and as its
GPUFAIR_* variable, reaching the periodic jobs' settings."""

from __future__ import annotations

import pytest

from gpufair.cli import build_parser
from gpufair.cli.serve import retention_settings
from gpufair.store.retention_repo import Retention

DEFAULTS = Retention(
    events_days=180.0,
    heartbeats_days=7.0,
    rollups_days=400.0,
    history_days=90.0,
    replies_days=7.0,
    cycles_days=7.0,
)


def settings(*argv: str) -> Retention:
    return retention_settings(build_parser().parse_args(["serve", *argv]))


def test_defaults_are_retentions_own() -> None:
    assert settings() == DEFAULTS == Retention()


def test_each_age_from_its_flag() -> None:
    got = settings(
        "--event-retention-days=30",
        "--heartbeat-retention-days=2",
        "--rollup-retention-days=60",
        "--history-retention-days=14",
        "--reply-retention-days=1.5",
        "--cycle-retention-days=3",
    )
    assert got == Retention(30.0, 2.0, 60.0, 14.0, 1.5, 3.0)


def test_each_age_from_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in [
        ("EVENT", "31"),
        ("HEARTBEAT", "3"),
        ("ROLLUP", "61"),
        ("HISTORY", "15"),
        ("REPLY", "2"),
        ("CYCLE", "4"),
    ]:
        monkeypatch.setenv(f"GPUFAIR_{name}_RETENTION_DAYS", value)
    assert settings() == Retention(31.0, 3.0, 61.0, 15.0, 2.0, 4.0)
    # The flag wins over the variable.
    assert settings("--cycle-retention-days", "9").cycles_days == 9.0


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan", "week"])
def test_an_age_that_is_not_a_number_of_days_is_refused(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    with pytest.raises(SystemExit) as stopped:
        settings(f"--history-retention-days={value}")
    assert stopped.value.code == 2
    assert capsys.readouterr().err.endswith(
        "error: argument --history-retention-days: must be a number of days above 0\n"
    )
