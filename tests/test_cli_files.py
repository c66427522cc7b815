"""`gpufair apply -f` with files that cannot be a config, or a config with very many problems:
one clear line and exit 2 for the file, the capped violation list and exit 1 for the server's
refusal, never a traceback or a transport error."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufair.api.server import RunningServer
from gpufair.cli import main
from gpufair.client import GpufairClient
from gpufair.domain.limits import MAX_QUEUE_DEPTH, MAX_VIOLATIONS_SHOWN


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            b"pools:\n  - name: caf\xe9\n",  # Latin-1, not UTF-8
            "not UTF-8 text (byte 0xe9 at offset 20, line 2); save the file as UTF-8",
        ),
        (b"\xff\xfe" + "pools: []\n".encode("utf-16-le"), "not UTF-8 text (byte 0xff at offset 0"),
        (b"[" * 200_000, "not valid YAML: nested too deeply"),
        (
            b"pools: [{name: p, policy: {k: [1, 2]}}]\n",
            "pools[0].policy.k: expected a number, got a list",
        ),
    ],
)
def test_a_file_that_cannot_be_a_config_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_bytes(content)
    code, out, err = run(capsys, "apply", "-f", str(path), "--address", "127.0.0.1:1")
    assert code == 2
    assert out == ""
    assert err.startswith(f"error: {path}: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_folder_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "apply", "-f", str(tmp_path), "--address", "127.0.0.1:1")
    assert (code, err) == (2, f"error: {tmp_path}: Is a directory\n")


def test_the_violations_of_a_large_bad_file_are_shown_capped(
    client: GpufairClient,
    server: RunningServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = ["pools: [{name: main}]", "queues:"]
    lines += [
        f"  - {{name: q{i}, parent: q{i - 1}}}" if i else "  - {name: q0}" for i in range(1000)
    ]
    path = tmp_path / "deep.yaml"
    path.write_text("\n".join(lines) + "\n")
    code, _, err = run(capsys, "apply", "-f", str(path), "--address", f"127.0.0.1:{server.port}")
    assert code == 1
    assert err.startswith("error: INVALID_ARGUMENT: ")
    listed = [line for line in err.splitlines() if line.startswith("  - ")]
    assert len(listed) == MAX_VIOLATIONS_SHOWN + 1
    first = MAX_QUEUE_DEPTH  # q16, below 16 ancestors: the 17th level
    assert listed[0] == (
        f"  - config.queues[{first}].parent: queue tree deeper than {MAX_QUEUE_DEPTH} levels "
        f"({first + 1})"
    )
    more = 1000 - MAX_QUEUE_DEPTH - MAX_VIOLATIONS_SHOWN
    assert listed[-1].endswith(f"and {more} more violations like the above")
    assert "RESOURCE_EXHAUSTED" not in err and "Traceback" not in err
    assert client.get_config().config_version == 0
