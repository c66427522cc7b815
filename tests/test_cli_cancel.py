"""`gpufair cancel` against a real server: what it says per uid in every state, its exit codes,
JSON and YAML, tokens, and shell completion."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
import yaml
from sqlalchemy import Engine

from gpufair.api.auth import auth_interceptor
from gpufair.api.server import RunningServer, build_server
from gpufair.cli import build_parser, main
from gpufair.cli.options import completion_script
from gpufair.client import GpufairClient, started, stopped
from tests.api.ledger_support import cluster, submit


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_of_each_state(client: GpufairClient) -> None:
    """wait-1 pending, bound-1 bound, run-1 running, done-1 finished, gone-1 cancelled."""
    client.apply_config(cluster())
    submit(client, "run-1", "llm", pods=1, gpus=8)
    submit(client, "done-1", "llm", pods=1, gpus=8)
    binds = {b.uid: b for b in client.schedule("main").binds}
    assert sorted(binds) == ["done-1", "run-1"]
    client.report_events([started(uid, binds[uid].pods) for uid in binds])
    submit(client, "bound-1", "vision", pods=1, gpus=4)
    assert [b.uid for b in client.schedule("main").binds] == ["bound-1"]
    client.report_events([stopped("done-1")])
    submit(client, "wait-1", "vision", pods=1, gpus=8)
    submit(client, "gone-1", "vision")
    client.cancel_workload("gone-1")


def test_cancel_says_what_it_found_per_uid(
    client: GpufairClient, server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{server.port}"
    one_of_each_state(client)
    uids = ["wait-1", "bound-1", "run-1", "done-1", "gone-1", "nope-1"]
    code, out, err = run(capsys, "cancel", *uids, "--address", address)
    assert (code, err) == (1, "")
    assert out.splitlines() == [
        "wait-1: cancelled (was pending)",
        "bound-1: cancelled (was bound)",
        "run-1: running: it keeps its GPUs until the batch system stops it",
        "done-1: already finished",
        "gone-1: already cancelled",
        "nope-1: not found",
    ]
    states = {w.workload.uid: w.state for w in client.list_workloads(states=["cancelled"])}
    assert sorted(states) == ["bound-1", "gone-1", "wait-1"]
    assert [w.workload.uid for w in client.list_workloads(states=["running"])] == ["run-1"]

    # Every uid known: exit 0, even though nothing changed; a uid given twice is one call.
    code, out, err = run(capsys, "cancel", "wait-1", "run-1", "wait-1", "--address", address)
    assert (code, err) == (0, "")
    assert out == (
        "wait-1: already cancelled\n"
        "run-1: running: it keeps its GPUs until the batch system stops it\n"
    )


def test_cancel_as_json_and_yaml(
    client: GpufairClient, server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{server.port}"
    client.apply_config(cluster())
    submit(client, "w-1")
    code, out, err = run(capsys, "cancel", "w-1", "w-2", "-o", "json", "--address", address)
    assert (code, err) == (1, "")
    assert json.loads(out) == [
        {
            "uid": "w-1",
            "found": True,
            "was_pending": True,
            "previous_state": "pending",
            "result": "cancelled (was pending)",
        },
        {
            "uid": "w-2",
            "found": False,
            "was_pending": False,
            "previous_state": "",
            "result": "not found",
        },
    ]
    code, out, _ = run(capsys, "cancel", "w-1", "-o", "yaml", "--address", address)
    assert code == 0
    assert yaml.safe_load(out) == [
        {
            "uid": "w-1",
            "found": True,
            "was_pending": False,
            "previous_state": "cancelled",
            "result": "already cancelled",
        }
    ]


def test_usage_errors_and_refusals(
    client: GpufairClient, server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{server.port}"
    with pytest.raises(SystemExit) as exited:
        main(["cancel", "--address", address])
    assert exited.value.code == 2
    assert "the following arguments are required: UID" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["cancel", "w-1", "-o", "xml"])
    assert exited.value.code == 2
    assert "argument -o/--output: invalid choice: 'xml'" in capsys.readouterr().err

    # A uid the server refuses to read is that uid's line; the others still go.
    client.apply_config(cluster())
    submit(client, "ok-1")
    code, out, err = run(capsys, "cancel", "bad\nuid", "ok-1", "--address", address)
    assert (code, err) == (1, "")
    assert out.splitlines() == [
        "'bad\\nuid': refused: uid: contains a control character (U+000A)",
        "ok-1: cancelled (was pending)",
    ]


@pytest.fixture(scope="module")
def auth_address(engine: Engine) -> Iterator[str]:
    auth = auth_interceptor(engine, True)
    running = build_server(engine, "127.0.0.1:0", max_workers=4, interceptors_extra=[auth])
    yield f"127.0.0.1:{running.port}"
    running.stop(0.5)


def test_tokens_decide_who_may_cancel_and_drain(
    client: GpufairClient, db: Engine, auth_address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpufair.store import token_repo
    from gpufair.tokens import Role

    client.apply_config(cluster())
    submit(client, "t-1")
    reporter = token_repo.create(db, "cli-reporter", Role.REPORTER).token
    scheduler = token_repo.create(db, "cli-scheduler", Role.SCHEDULER).token
    for argv in (["cancel", "t-1"], ["drain", "a1"]):
        code, out, err = run(capsys, *argv, "--address", auth_address)
        assert (code, out) == (1, "")
        assert err.startswith("error: UNAUTHENTICATED: ") and err.count("\n") == 1
        code, out, err = run(capsys, *argv, "--address", auth_address, "--token", reporter)
        assert (code, out) == (1, "")
        assert err.startswith("error: PERMISSION_DENIED: ") and err.count("\n") == 1
    code, out, err = run(capsys, "cancel", "t-1", "--address", auth_address, "--token", scheduler)
    assert (code, out, err) == (0, "t-1: cancelled (was pending)\n", "")


def test_completion_knows_cancel() -> None:
    script = completion_script(build_parser(), "bash")
    probe = (
        f"{script}\nCOMP_WORDS=(gpufair ca)\nCOMP_CWORD=1\n"
        "_gpufair_complete\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n"
    )
    done = subprocess.run(["bash"], input=probe, text=True, capture_output=True, check=True)
    assert done.stdout.split() == ["cancel"]
    assert '"cancel") words="--help --output --address' in script
