"""`gpufair drain` and `gpufair undrain` against a real server: the diff with `--dry-run`, version
conflicts, unknown nodes, the next Schedule leaving a drained node alone, and shell completion."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from gpufair.api.server import RunningServer
from gpufair.cli import build_parser, main
from gpufair.cli.options import completion_script
from gpufair.client import GpufairClient, started
from tests.api.ledger_support import cluster, submit


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def ready(client: GpufairClient) -> dict[str, bool]:
    return {n.name: n.ready for n in client.get_config().config.nodes}


def test_drain_and_undrain(
    client: GpufairClient, server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{server.port}"
    version = client.apply_config(cluster()).config_version

    code, out, err = run(capsys, "drain", "a1", "--dry-run", "--address", address)
    assert (code, err) == (0, "")
    assert out == (
        "update node a1\n"
        "         ready: true -> false\n"
        f"dry run: nothing written (config version stays {version})\n"
    )
    assert ready(client) == {"a1": True, "a2": True, "r1": True}

    code, out, err = run(capsys, "drain", "a1", "--address", address)
    assert (code, err) == (0, "")
    assert out == (
        f"update node a1\n         ready: true -> false\napplied: config version {version + 1}\n"
    )
    assert ready(client) == {"a1": False, "a2": True, "r1": True}

    # Someone changed the config since version was read: one line, exit 1, nothing written.
    code, out, err = run(
        capsys, "drain", "r1", "--expected-version", str(version), "--address", address
    )
    assert (code, out) == (1, "")
    assert err == (
        f"error: conflict: config version is {version + 1}, not the expected {version}: the "
        "config changed since it was read. Nothing was changed: read it again and retry.\n"
    )
    assert ready(client)["r1"]

    code, out, err = run(
        capsys, "drain", "a1", "r1", "--expected-version", str(version + 1), "--address", address
    )
    assert (code, err) == (0, "")
    assert out == (
        "update node r1\n"
        "         ready: true -> false\n"
        "a1: already drained\n"
        f"applied: config version {version + 2}\n"
    )

    code, out, err = run(capsys, "undrain", "r1", "a2", "-o", "json", "--address", address)
    assert (code, err) == (0, "")
    assert json.loads(out) == {
        "changes": [
            {
                "action": "CHANGE_ACTION_UPDATE",
                "kind": "node",
                "name": "r1",
                "fields": [{"field": "ready", "before": "false", "after": "true"}],
            }
        ],
        "applied": True,
        "config_version": str(version + 3),
    }
    assert ready(client) == {"a1": False, "a2": True, "r1": True}

    code, out, err = run(capsys, "drain", "a2", "--dry-run", "-o", "yaml", "--address", address)
    assert (code, err) == (0, "")
    assert yaml.safe_load(out) == {  # the short forms, every field as in JSON
        "changes": [
            {
                "action": "update",
                "kind": "node",
                "name": "a2",
                "fields": [{"field": "ready", "before": "true", "after": "false"}],
            }
        ],
        "config_version": version + 3,
        "applied": False,
    }


def test_unknown_nodes_are_named_and_nothing_changes(
    client: GpufairClient, server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{server.port}"
    version = client.apply_config(cluster()).config_version
    for argv in (["drain"], ["drain", "--dry-run"], ["undrain"]):
        code, out, err = run(capsys, *argv, "a1", "zz-9", "r1", "zz-10", "--address", address)
        assert (code, out) == (1, "")
        assert err == (
            "error: no node named zz-9, zz-10: nothing was changed "
            "(gpufair get config lists the nodes)\n"
        )
    assert ready(client) == {"a1": True, "a2": True, "r1": True}
    assert client.get_config().config_version == version

    with pytest.raises(SystemExit) as exited:
        main(["drain", "--address", address])
    assert exited.value.code == 2
    assert "the following arguments are required: NODE" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["undrain", "a1", "--expected-version", "latest"])
    assert exited.value.code == 2
    assert "--expected-version: invalid int value: 'latest'" in capsys.readouterr().err


def test_a_drained_node_takes_no_new_binds(
    client: GpufairClient, server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{server.port}"
    client.apply_config(cluster())
    assert run(capsys, "drain", "a1", "--address", address)[0] == 0
    submit(client, "first", "llm", pods=1, gpus=8)
    submit(client, "second", "llm", pods=1, gpus=8)
    reply = client.schedule("main")
    assert [(b.uid, [p.node for p in b.pods]) for b in reply.binds] == [("first", ["a2"])]
    assert [p.uid for p in reply.pending] == ["second"]

    assert run(capsys, "undrain", "a1", "--address", address)[0] == 0
    reply = client.schedule("main")
    assert [(b.uid, [p.node for p in b.pods]) for b in reply.binds] == [("second", ["a1"])]


def test_a_drain_names_the_work_still_on_the_node(
    client: GpufairClient, server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{server.port}"
    client.apply_config(cluster())  # a1, a2: 8 A100 each; r1: 4 RTX 4090
    submit(client, "train", "llm", pods=1, gpus=4)
    (bind,) = client.schedule("main").binds
    client.report_events([started("train", bind.pods)])
    submit(client, "eval", "llm", pods=1, gpus=4)
    (second,) = client.schedule("main").binds
    placed = {"train": bind.pods[0].node, "eval": second.pods[0].node}
    assert placed == {"train": "r1", "eval": "a1"}  # the cheapest type first, then the A100s

    code, out, err = run(capsys, "drain", "r1", "a2", "a1", "--dry-run", "--address", address)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    keep = "(they keep their GPUs until the batch system stops them)"
    # In the order the nodes were named; a2, where nothing is, goes unnamed.
    assert lines[-3:] == [
        f"r1: still there: running train {keep}",
        f"a1: still there: bound eval {keep}",
        "dry run: nothing written (config version stays 1)",
    ]
    # -o json keeps the reply alone, and undrain names nothing.
    code, out, _ = run(capsys, "drain", "r1", "-o", "json", "--address", address)
    assert code == 0 and "still there" not in out and json.loads(out)["applied"] is True
    code, out, _ = run(capsys, "undrain", "r1", "--address", address)
    assert code == 0 and "still there" not in out


def test_completion_knows_drain_and_undrain() -> None:
    script = completion_script(build_parser(), "bash")

    def complete(line: str) -> list[str]:
        words = line.split(" ")
        probe = (
            f"{script}\nCOMP_WORDS=({line})\nCOMP_CWORD={len(words) - 1}\n"
            "_gpufair_complete\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n"
        )
        done = subprocess.run(["bash"], input=probe, text=True, capture_output=True, check=True)
        return done.stdout.split()

    assert complete("gpufair dr") == ["drain"]
    assert complete("gpufair un") == ["undrain"]
    assert complete("gpufair drain --ex") == ["--expected-version"]
    assert complete("gpufair undrain a1 --dr") == ["--dry-run"]
    assert "drain" in completion_script(build_parser(), "zsh")
