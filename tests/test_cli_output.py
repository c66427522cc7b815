"""Daily use of the command line: `-o table|json|yaml` on every read, YAML in the short forms a
cluster file uses (and `apply` takes back), durations in the usual forms, plural kinds, the only
pool as the default, one number format, defaults in help, shell completion."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpufair.api.server import RunningServer
from gpufair.cli import build_parser, main
from gpufair.cli.options import completion_script, message_yaml
from gpufair.client import GpufairClient
from gpufair.config_file import (
    duration_seconds,
    format_duration_s,
    load_config_file,
    message_to_yaml,
    parse_config,
)
from gpufair.render import fmt_number
from gpufair.v1 import ledger_pb2, scheduler_pb2

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "clusters"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_durations_in_the_usual_forms() -> None:
    assert duration_seconds("90s") == 90
    assert duration_seconds("1h30m") == 5400
    assert duration_seconds("1d12h") == 129600
    assert duration_seconds("1.5h") == 5400
    assert duration_seconds("500ms") == 0.5
    assert duration_seconds("3600") == 3600
    for bad in ("30m1h", "1h1h", "h", "1y", "1 hour"):
        assert duration_seconds(bad) is None, bad
    # Written back in the largest unit that divides exactly, which reads back the same.
    for seconds, text in ((604800, "7d"), (129600, "36h"), (5400, "90m"), (45, "45s")):
        assert format_duration_s(seconds) == text
        assert duration_seconds(text) == seconds
    assert format_duration_s(0.5) == 0.5 and format_duration_s(0) == 0


def test_yaml_output_is_a_file_apply_takes_back() -> None:
    config = load_config_file(EXAMPLES / "heterogeneous.yaml")
    text = message_to_yaml(config)
    assert "window_kind: sliding" in text and "WINDOW_KIND" not in text
    assert "gang_reservation_after_s: 15m" in text
    assert "placement: binpack" in text and "compute_weight: 10\n" in text
    assert "cpu_millicores: 128000\n" in text and "'" not in text  # int64s unquoted
    assert parse_config(yaml.safe_load(text)) == config


def test_yaml_of_a_reply_writes_every_field_and_a_config_its_set_fields() -> None:
    """Replies in YAML hold the zeros JSON holds (a 0 written as 0, a duration of 0 too); a
    config keeps to what is set, as a person writes the file."""
    reply = ledger_pb2.GetUsageResponse()
    reply.rows.add(queue="idle", pool="main", gpu_type="a100")
    reply.budgets.add(queue="idle", budget_cu_hours=10)
    data = yaml.safe_load(message_yaml(reply))
    assert data["rows"] == [
        {
            "pool": "main",
            "queue": "idle",
            "gpu_type": "a100",
            "gpu_hours": 0,
            "cu_hours": 0,
            "over_quota_cu_hours": 0,
            "partial": False,
        }
    ]
    assert (data["budgets"][0]["consumed_cu_hours"], data["budgets"][0]["pool"]) == (0, "")
    workload = yaml.safe_load(message_yaml(scheduler_pb2.Workload(uid="w", pods=1)))
    assert (workload["min_runtime_s"], workload["priority_class"]) == (0, 0)
    assert type(workload["min_runtime_s"]) is int
    assert "submit_time" not in workload and "min_pods" not in workload  # unset, with presence
    assert yaml.safe_load(message_to_yaml(scheduler_pb2.Workload(uid="w", pods=1))) == {
        "uid": "w",
        "pods": 1,
    }


def test_every_read_takes_json_and_yaml(
    client: GpufairClient, server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{server.port}"
    client.apply_config(load_config_file(EXAMPLES / "llm-vs-vision.yaml"))

    code, out, _ = run(capsys, "get", "config", "-o", "json", "--address", address)
    data = json.loads(out)
    assert code == 0 and data["config_version"] == "1"  # the proto's JSON: int64 as a string
    assert data["config"]["pools"][0]["policy"]["window_kind"] == "WINDOW_KIND_SLIDING"
    code, out, _ = run(capsys, "get", "config", "-o", "yaml", "--address", address)
    assert "window_s: 7d" in out and "usage_basis: over_quota" in out
    # A file apply takes back, as a person writes it: the defaults stay out.
    config_yaml = yaml.safe_load(out)
    assert config_yaml["queues"][0] == {
        "name": "llm",
        "quotas": [{"pool": "default", "deserved_cu": 30, "over_quota_weight": 1}],
    }
    assert "max_moved_share_per_hour" not in out and "topology_levels" not in out

    code, out, _ = run(capsys, "report", "fairshare", "-o", "yaml", "--address", address)
    share = yaml.safe_load(out)
    assert share["pool"] == "default" and share["capacity_cu"] == 100
    assert [q["deserved_cu"] for q in share["queues"]] == [30, 20]
    # Every field, zeros included, as in JSON: nothing runs, nothing was used.
    assert [(q["allocated_cu"], q["demand_cu"]) for q in share["queues"]] == [(0, 0), (0, 0)]
    assert share["warnings"] == []

    code, out, _ = run(
        capsys, "report", "usage", "-o", "yaml", "--period", "week", "--address", address
    )
    usage_yaml = yaml.safe_load(out)
    assert [
        (b["budget_cu_hours"], b["consumed_cu_hours"], b["burn_cu_hours_per_day"])
        for b in usage_yaml["budgets"]
    ] == [(8400, 0, 0), (5040, 0, 0)]
    assert usage_yaml["rows"] == []

    code, out, _ = run(
        capsys, "report", "usage", "-o", "json", "--period", "week", "--address", address
    )
    usage = json.loads(out)
    assert [b["budget_cu_hours"] for b in usage["budgets"]] == [8400, 5040]
    assert "as_of" in usage
    # Every field, zeros included: nothing is used yet, and a script reads 0, not a missing key.
    assert [(b["consumed_cu_hours"], b["burn_cu_hours_per_day"]) for b in usage["budgets"]] == [
        (0, 0),
        (0, 0),
    ]
    assert usage["rows"] == []
    assert "projected_exhaustion" not in usage["budgets"][0]  # unset: it will not run out

    code, out, err = run(
        capsys, "submit", "w-1", "--queue", "llm", "--pods", "2", "--gpus-per-pod", "4",
        "--min-runtime", "1h30m", "--address", address,
    )  # fmt: skip
    assert code == 0, err
    assert out.strip() == "submitted w-1: 8 GPUs in queue llm, pool default"
    code, out, _ = run(capsys, "explain", "w-1", "-o", "json", "--address", address)
    explained = json.loads(out)
    assert explained["uid"] == "w-1" and explained["state"] == "pending"
    assert explained["needs_cu"] == 8
    code, out, _ = run(capsys, "get", "workloads", "-o", "yaml", "--address", address)
    (listed,) = yaml.safe_load(out)["workloads"]
    assert listed["workload"]["min_runtime_s"] == "90m"
    assert listed["workload"]["pods"] == 2
    assert (listed["evicting"], listed["workload"]["priority_class"]) == (False, 0)
    assert (listed["workload"]["compute_units"], listed["queue_position"]) == (0, 1)


def test_submit_says_why_a_workload_is_refused(
    client: GpufairClient, server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{server.port}"
    client.apply_config(load_config_file(EXAMPLES / "llm-vs-vision.yaml"))
    code, out, err = run(
        capsys, "submit", "wide", "--queue", "llm", "--gpus-per-pod", "8", "--address", address
    )
    assert code == 1 and out == ""
    assert err.strip() == (
        "error: wide not accepted: never fits pool 'default': a pod needs 8 GPUs; "
        "the largest adequate node has 4"
    )
    with pytest.raises(SystemExit):
        build_parser().parse_args(["submit", "x", "--queue", "q", "--min-runtime", "soon"])


def test_fairshare_defaults_to_the_only_pool(
    client: GpufairClient, server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{server.port}"
    code, _, err = run(capsys, "report", "fairshare", "--address", address)
    assert code == 2 and "no pool is configured" in err
    config = load_config_file(EXAMPLES / "llm-vs-vision.yaml")
    client.apply_config(config)
    code, out, err = run(capsys, "report", "fairshare", "--address", address)
    assert code == 0, err
    assert out.startswith("pool default: 100 CU, computed ")
    spare = config.pools.add()
    spare.CopyFrom(config.pools[0])
    spare.name = "spare"
    client.apply_config(config)
    code, _, err = run(capsys, "report", "fairshare", "--address", address)
    assert code == 2
    assert err.strip() == "error: there are 2 pools; name one with --pool: default, spare"
    code, out, _ = run(capsys, "report", "fairshare", "--pool", "spare", "--address", address)
    assert code == 0 and out.startswith("pool spare: 0 CU")


def test_delete_takes_plural_kinds(
    client: GpufairClient, server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{server.port}"
    client.apply_config(load_config_file(EXAMPLES / "llm-vs-vision.yaml"))
    code, out, err = run(
        capsys, "delete", "budgets", "llm/week/*", "vision/week/*", "--address", address
    )
    assert code == 0, err
    assert out.splitlines() == [
        "delete budget llm/week/*",
        "delete budget vision/week/*",
        "applied: config version 2",
    ]
    code, out, _ = run(
        capsys, "delete", "gpu-types", "h100-80gb", "--dry-run", "--address", address
    )
    assert code == 1  # still used by the nodes: refused, but the kind was understood
    with pytest.raises(SystemExit):
        build_parser().parse_args(["delete", "racks", "r1"])
    assert build_parser().parse_args(["delete", "Queues", "a"]).kind == "queue"
    assert build_parser().parse_args(["delete", "gpu_type", "a"]).kind == "gpu_type"


def test_apply_kinds_and_delete_take_the_same_spellings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`apply --kinds` took gpu-type and gpu_type only, `delete` plurals and any case too: both
    now take all of them (the old spellings still work), and say so in their help."""
    parser = build_parser()
    for spelling in ("gpu_type", "gpu-type", "gpu-types", "GPU_Types", "gpu_types"):
        assert parser.parse_args(["delete", spelling, "a"]).kind == "gpu_type"
        kinds = parser.parse_args(["apply", "-f", "c.yaml", "--kinds", f"{spelling},Queues"]).kinds
        assert kinds == ["gpu_type", "queue"]
    # A kind named twice in two spellings is sent once.
    kinds = parser.parse_args(["apply", "-f", "c.yaml", "--kinds", "queue,queues, budgets"]).kinds
    assert kinds == ["queue", "budget"]
    with pytest.raises(SystemExit):
        parser.parse_args(["apply", "-f", "c.yaml", "--kinds", "queues,racks"])
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "argument --kinds: racks: name kinds among gpu-types, pools, nodes, queues, budgets "
            "(singular too, - or _ alike)"
        )
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["delete", "racks", "r1"])
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "argument KIND: 'racks' is not a kind; name one of gpu-types, pools, nodes, queues, "
            "budgets (singular too, - or _ alike)"
        )
    )
    for command, said in (("apply", "as `delete` takes them"), ("delete", "as `apply --kinds`")):
        with pytest.raises(SystemExit):
            parser.parse_args([command, "--help"])
        helped = " ".join(capsys.readouterr().out.split())
        assert "gpu-types, pools, nodes, queues, budgets (singular too, - or _ alike)" in helped
        assert said in helped


def test_delete_sends_a_name_given_twice_once(
    client: GpufairClient, server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The server refuses a name listed twice; `delete nodes X X` deletes X, as `drain X X`
    drains it."""
    address = f"127.0.0.1:{server.port}"
    client.apply_config(load_config_file(EXAMPLES / "llm-vs-vision.yaml"))
    code, out, err = run(
        capsys, "delete", "budgets", "llm/week/*", "llm/week/*", "--address", address
    )
    assert code == 0, err
    assert out.splitlines() == ["delete budget llm/week/*", "applied: config version 2"]


def test_one_number_format() -> None:
    assert [fmt_number(v) for v in (32.0, 1 / 3, 0.08549, 1234.5678, 0.0004, -2.5)] == [
        "32",
        "0.333",
        "0.085",
        "1234.568",
        "0.0004",
        "-2.5",
    ]


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["report", "usage", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: day)" in text and "(default: 30.0)" in text
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "[$GPUFAIR_WORKERS] (default: 32)" in text


def test_completion_script_completes_commands_and_options() -> None:
    script = completion_script(build_parser(), "bash")
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0

    def complete(line: str) -> list[str]:
        words = line.split(" ")
        probe = (
            f"{script}\nCOMP_WORDS=({line})\nCOMP_CWORD={len(words) - 1}\n"
            "_gpufair_complete\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n"
        )
        done = subprocess.run(["bash"], input=probe, text=True, capture_output=True, check=True)
        return done.stdout.split()

    assert "submit" in complete("gpufair su") and "report" in complete("gpufair re")
    assert complete("gpufair report f") == ["fairshare"]
    assert "--open-hour" in complete("gpufair report usage --op")
    assert complete("gpufair serve --work") == ["--workers"]


def test_output_into_a_closed_pipe_is_no_traceback() -> None:
    """`gpufair ... | head` ends the reader first: the command stops quietly with 141 (128 +
    SIGPIPE, as a shell reports a program a closed pipe stopped), no traceback and no
    'Exception ignored' at exit."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads: the first write fails with EPIPE
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gpufair.cli", "completion", "bash"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert done.stderr == ""


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e30", "soon"])
def test_a_timeout_that_is_no_deadline_is_refused_before_any_call(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """gRPC takes 0, a negative or an overflowing deadline as one already past: the call used to
    fail with DEADLINE_EXCEEDED, as if the server were slow. Now the option is refused (exit 2)."""
    with pytest.raises(SystemExit) as stopped:
        main(["report", "fairshare", "--timeout-s", value, "--address", "127.0.0.1:1"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "argument --timeout-s" in err and "seconds in (0, 86400]" in err
    assert "DEADLINE_EXCEEDED" not in err


def test_a_timeout_in_range_is_taken() -> None:
    args = build_parser().parse_args(["report", "fairshare", "--timeout-s", "2.5"])
    assert args.timeout_s == 2.5
