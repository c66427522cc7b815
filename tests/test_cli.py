"""The command line against a real server: readable output, clear errors, exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufair.api.server import RunningServer
from gpufair.cli import main
from gpufair.client import GpufairClient

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "clusters"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_apply_then_get_config(
    client: GpufairClient, server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{server.port}"
    example = str(EXAMPLES / "heterogeneous.yaml")
    code, out, _ = run(capsys, "apply", "-f", example, "--dry-run", "--address", address)
    assert code == 0
    assert "create node a100-1" in out
    assert "dry run: nothing written (config version stays 0)" in out

    code, out, _ = run(capsys, "apply", "-f", example, "--address", address)
    assert code == 0 and out.strip().endswith("applied: config version 1")
    code, out, _ = run(capsys, "apply", "-f", example, "--address", address)
    assert out.splitlines()[0] == "no changes"

    code, out, _ = run(capsys, "get", "config", "--address", address)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "config version 1"
    a100 = next(line for line in lines if line.startswith("a100-1 "))
    assert a100.split()[:5] == ["a100-1", "main", "a100-80gb", "8", "80"]
    pre = next(line for line in lines if line.startswith("preprocessing "))
    assert pre.split()[:7] == ["preprocessing", "research", "main", "64", "1", "192", "0"]

    code, out, _ = run(capsys, "get", "config", "-o", "yaml", "--address", address)
    assert (
        "name: online-inference" in out
        and "deserved_cu: 160\n" in out
        and "window_kind: sliding" in out
    )


def test_broken_file_prints_every_violation(
    client: GpufairClient, server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        "gpu_types: [{name: a100, memory_gib: 80, compute_weight: 0}]\n"
        "pools: [{name: main}]\n"
        "nodes: [{name: n1, pool: other, gpu_type: a100, gpu_count: 8}]\n"
    )
    code, _, err = run(capsys, "apply", "-f", str(broken), "--address", f"127.0.0.1:{server.port}")
    assert code == 1
    assert "INVALID_ARGUMENT" in err
    assert "  - config.gpu_types[0].compute_weight: must be in [0.001, 10000], got 0" in err
    assert "  - config.nodes[0].pool: unknown pool 'other'" in err
    assert "Traceback" not in err


def test_user_mistakes_exit_2_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "apply", "-f", str(tmp_path / "nope.yaml"))
    assert code == 2
    assert err.startswith("error: ") and "No such file" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: [{name: p, policy: {window_kind: hourly}}]\n")
    code, _, err = run(capsys, "apply", "-f", str(bad))
    assert code == 2 and "choose one of sliding, tumbling, none" in err


def test_unreachable_server_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "get", "config", "--address", "127.0.0.1:1", "--timeout-s", "2")
    assert code == 1
    assert err.startswith("error: cannot reach gpufair")
