"""`gpufair simulate` through its argparse wiring: the files, the plots, the table, the errors."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from sim_support import REPOSITORY, unit_cluster

from gpufair.sim.command import add_simulate_command

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PLOTS = ("allocation.png", "fair_share.png", "wait_cdf.png", "queues.png", "usage_share.png")
RUN_FILES = ("timeline.csv", "jobs.csv", "events.csv", "summary.json")


def write_scenario(directory: Path) -> Path:
    """Two queues on 16 GPUs for a day: one of many small jobs, one of 8-GPU gangs."""
    data = {
        "name": "command-test",
        "seed": 4,
        "duration_s": "1d",
        "cycle_s": "2m",
        "timeline_s": "30m",
        "cluster": unit_cluster(
            [("n1", 8), ("n2", 8)], [{"name": "small"}, {"name": "large"}], window_s="12h"
        ),
        "generators": [
            {
                "queue": "small",
                "backlog": 6,
                "gpus_per_pod": {"choice": [1, 2]},
                "duration_s": {"exponential": "1h", "max": "6h"},
            },
            {"queue": "large", "backlog": 1, "pods": 1, "gpus_per_pod": 8, "duration_s": "3h"},
        ],
    }
    path = directory / "scenario.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def simulate(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="gpufair")
    commands = parser.add_subparsers(dest="command", required=True)
    add_simulate_command(commands)
    args = parser.parse_args(["simulate", *argv])
    code: int = args.func(args)
    return code


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE), path
    assert len(data) > 10_000, path  # axes, lines and labels, not an empty canvas


def test_simulate_writes_csv_json_plots_and_prints_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert simulate(str(write_scenario(tmp_path)), "--out", str(out)) == 0
    for name in (*RUN_FILES, *PLOTS, "summary.txt"):
        assert (out / name).is_file(), name
    for name in PLOTS:
        assert_png(out / name)
    header = (out / "timeline.csv").read_text().splitlines()[0]
    assert header == (
        "time_s,pool,queue,allocated_cu,pending_cu,fair_share_cu,effective_weight,usage_share,"
        "decayed_usage_cu_s,weight_share"
    )
    events = (out / "events.csv").read_text().splitlines()
    assert events[0] == (
        "time_s,pool,event,uid,queue,gpus,cu,reason,beneficiary,beneficiary_queue,"
        "started_as,ran_s,evicted_before"
    )
    assert len(events) > 1 and all(",bind," in e or ",evict," in e for e in events[1:])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scenario"] == "command-test" and summary["seed"] == 4
    assert [q["queue"] for q in summary["queues"]] == ["large", "small"]
    printed = capsys.readouterr().out
    assert "OVER-QUOTA %" in printed and "JAIN" in printed
    assert printed.startswith((out / "summary.txt").read_text())


def test_compare_writes_both_runs_overlaid_plots_and_one_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert simulate(str(write_scenario(tmp_path)), "--out", str(out), "--compare") == 0
    for policy in ("classic", "time-based"):
        for name in (*RUN_FILES, *PLOTS, "summary.txt"):
            assert (out / policy / name).is_file(), f"{policy}/{name}"
        own = (out / policy / "summary.txt").read_text()
        assert own.startswith("scenario command-test") and "OVER-QUOTA %" in own
        assert len(own.split("\n\n")[1].splitlines()) == 3  # header and the two queues
    for name in PLOTS:
        assert_png(out / name)
    both = json.loads((out / "summary.json").read_text())["compare"]
    assert both["classic"]["policies"]["default"]["k"] == 0
    assert both["time-based"]["policies"]["default"]["k"] == 1
    table = (out / "summary.txt").read_text()
    queue_table = table.split("\n\n")[1].splitlines()
    assert queue_table[0].startswith("POLICY")
    policies = [line.split()[0] for line in queue_table[1:]]
    assert policies == ["classic", "time-based", "classic", "time-based"]
    assert table in capsys.readouterr().out


def test_a_broken_scenario_exits_2_naming_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\nduration_s: 1d\ncycle_s: soon\ncluster: {}\n")
    assert simulate(str(path), "--out", str(tmp_path / "out")) == 2
    assert f"{path}:3: cycle_s: 'soon' is not a duration" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_outputs_do_not_depend_on_the_process(tmp_path: Path) -> None:
    """Two fresh interpreters with different hash seeds write the same CSV bytes."""
    scenario = write_scenario(tmp_path)
    code = (
        "import sys; from pathlib import Path; from gpufair.sim.run import run_and_write;"
        "from gpufair.sim.scenario import load_scenario;"
        "run_and_write(load_scenario(Path(sys.argv[1])), Path(sys.argv[2]), plots=False)"
    )
    outputs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"out-{hash_seed}"
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPOSITORY / "service"), env.get("PYTHONPATH", "")]
        )
        subprocess.run([sys.executable, "-c", code, str(scenario), str(out)], check=True, env=env)
        outputs.append(
            [(out / name).read_bytes() for name in ("timeline.csv", "jobs.csv", "events.csv")]
        )
    assert outputs[0] == outputs[1]
