"""`gpufair token create|list|revoke` against the test database: the token is printed once, on
stdout alone; listings show name, role and prefix but never the secret; revoke ends it."""

from __future__ import annotations

import argparse

import pytest
from sqlalchemy import Engine

from gpufair.cli.auth import AuthSetupError, add_token_commands
from gpufair.cli.database_commands import add_database_options
from gpufair.store import token_repo
from gpufair.tokens import Role


def token_cli(
    capsys: pytest.CaptureFixture[str], database_url: str, *argv: str
) -> tuple[int, str, str]:
    """Run `gpufair token ...` as cli.py registers it, on the test database."""
    parser = argparse.ArgumentParser(prog="gpufair")
    add_token_commands(parser.add_subparsers(dest="command", required=True), add_database_options)
    args = parser.parse_args(["token", *argv, "--database-url", database_url])
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_create_list_revoke(
    capsys: pytest.CaptureFixture[str], database_url: str, db: Engine
) -> None:
    code, out, err = token_cli(capsys, database_url, "create", "ci-runner", "--role", "scheduler")
    assert code == 0
    token = out.strip()
    assert out == f"{token}\n" and token.startswith("gpf_")
    assert "shown only now" in err and token not in err
    record = token_repo.find_active(db, token)
    assert record is not None and record.name == "ci-runner" and record.role is Role.SCHEDULER
    secret = token.split("_", 2)[2]

    token_cli(capsys, database_url, "create", "grafana", "--role", "reporter")
    code, out, _ = token_cli(capsys, database_url, "list")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "ROLE", "PREFIX", "CREATED", "LAST", "USED"]
    ci = next(line for line in lines if line.startswith("ci-runner "))
    assert ci.split()[:3] == ["ci-runner", "scheduler", f"gpf_{record.prefix}_…"]
    assert any(line.startswith("grafana ") for line in lines)
    assert secret not in out and token not in out

    code, out, _ = token_cli(capsys, database_url, "revoke", "ci-runner")
    assert code == 0 and "revoked token 'ci-runner'" in out and "within 5 s" in out
    assert token_repo.find_active(db, token) is None
    _, out, _ = token_cli(capsys, database_url, "list")
    assert "ci-runner" not in out and "grafana" in out
    _, out, _ = token_cli(capsys, database_url, "list", "--all")
    assert "REVOKED" in out.splitlines()[0]
    revoked = next(line for line in out.splitlines() if line.startswith("ci-runner "))
    assert revoked.rstrip().endswith("UTC") and secret not in out

    # The name is free again once its token is revoked.
    code, out, _ = token_cli(capsys, database_url, "create", "ci-runner", "--role", "admin")
    assert code == 0 and out.strip() != token


def test_mistakes_are_one_clear_error(
    capsys: pytest.CaptureFixture[str], database_url: str, db: Engine
) -> None:
    token_cli(capsys, database_url, "create", "ci", "--role", "scheduler")
    with pytest.raises(AuthSetupError, match="a token named 'ci' exists; revoke it first"):
        token_cli(capsys, database_url, "create", "ci", "--role", "admin")
    with pytest.raises(AuthSetupError, match="no active token named 'nope'"):
        token_cli(capsys, database_url, "revoke", "nope")
    with pytest.raises(AuthSetupError, match="bad token name"):
        token_cli(capsys, database_url, "create", "two words", "--role", "admin")
    with pytest.raises(SystemExit):
        token_cli(capsys, database_url, "create", "x", "--role", "root")
    assert "invalid choice: 'root'" in capsys.readouterr().err


def test_list_with_no_tokens(
    capsys: pytest.CaptureFixture[str], database_url: str, db: Engine
) -> None:
    assert token_cli(capsys, database_url, "list")[1] == "no active tokens\n"


def test_list_as_json_and_yaml(
    capsys: pytest.CaptureFixture[str], database_url: str, db: Engine
) -> None:
    import json

    import yaml

    code, out, _ = token_cli(capsys, database_url, "create", "ci-runner", "--role", "scheduler")
    secret = out.strip().split("_", 2)[2]
    code, out, _ = token_cli(capsys, database_url, "list", "-o", "json")
    (listed,) = json.loads(out)
    assert code == 0 and (listed["name"], listed["role"]) == ("ci-runner", "scheduler")
    assert listed["last_used_at"] is None and listed["revoked_at"] is None
    assert listed["created_at"].endswith("+00:00") and secret not in out
    code, out, _ = token_cli(capsys, database_url, "list", "-o", "yaml")
    assert yaml.safe_load(out)[0]["prefix"] == listed["prefix"]
