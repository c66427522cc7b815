"""`gpufair serve` as a real process: restarts keep the config, SIGTERM stops it cleanly, and
without a database URL it runs on the embedded PostgreSQL."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from embedded_support import embedded_data_dir
from serve_support import ServeProcess

from gpufair.client import GpufairClient
from gpufair.config_file import load_config_file
from gpufair.store.database import Database, setup_log_path
from gpufair.store.scratch import scratch_database

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "clusters" / "llm-vs-vision.yaml"


@pytest.fixture
def serve_env() -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if k != "GPUFAIR_DATABASE_URL"}
    yield env


def apply_and_restart(args: list[str], env: dict[str, str], log: Path) -> None:
    first = ServeProcess(args, env, log)
    try:
        first.wait_serving()
        with GpufairClient(first.address, attempts=1) as client:
            reply = client.apply_config(load_config_file(EXAMPLE))
            assert reply.config_version == 1
    finally:
        assert first.terminate() == 0
    text = log.read_text()
    assert "received SIGTERM" in text and "stopped" in text

    second = ServeProcess(args, env, log)
    try:
        second.wait_serving()
        with GpufairClient(second.address, attempts=1) as client:
            stored = client.get_config()
            assert stored.config_version == 1
            assert sum(n.gpu_count for n in stored.config.nodes) == 100
            assert {q.name for q in stored.config.queues} == {"llm", "vision"}
            assert list(client.apply_config(load_config_file(EXAMPLE)).changes) == []
    finally:
        assert second.terminate() == 0


def test_restart_keeps_config_on_given_database(
    pg_server: Database, serve_env: dict[str, str], tmp_path: Path
) -> None:
    with scratch_database(pg_server.url) as url:
        log = tmp_path / "serve.log"
        apply_and_restart(["--database-url", url, "--grace-s", "1"], serve_env, log)
        assert "database: PostgreSQL at postgresql+psycopg://" in log.read_text()


@pytest.fixture
def data_dir() -> Iterator[Path]:
    with embedded_data_dir() as path:  # not under tmp_path: embedded_support.py says why
        yield path


def test_embedded_database_keeps_data_across_restarts(
    serve_env: dict[str, str], tmp_path: Path, data_dir: Path
) -> None:
    log = tmp_path / "serve.log"
    apply_and_restart(["--data-dir", str(data_dir), "--grace-s", "1"], serve_env, log)
    console = log.read_text()
    assert f"database: embedded PostgreSQL in {data_dir}" in console
    assert (data_dir / "PG_VERSION").exists()
    # The embedded server's set-up output has its own file; the console has gpufair's lines only.
    setup = setup_log_path(data_dir).read_text()
    assert "initdb" in setup and "pg_ctl" in setup
    assert "initdb" not in console and "pg_ctl" not in console
    warned = [line for line in console.splitlines() if " WARNING " in line or "Warning" in line]
    assert warned == []
