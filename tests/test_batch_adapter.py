"""The example batch adapter against a real server: jobs flow submit -> bind -> start -> stop, and
the explain CLI reads what it left behind."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from gpufair.api.server import RunningServer
from gpufair.cli import main
from gpufair.client import GpufairClient
from gpufair.config_file import load_config_file

ROOT = Path(__file__).resolve().parents[1]


def load_adapter() -> object:
    spec = importlib.util.spec_from_file_location(
        "batch_adapter", ROOT / "examples" / "batch_adapter.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["batch_adapter"] = module
    spec.loader.exec_module(module)
    return module


def test_adapter_runs_jobs_through_gpufair(
    client: GpufairClient, server: RunningServer, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    adapter = load_adapter()
    client.apply_config(load_config_file(ROOT / "examples" / "clusters" / "llm-vs-vision.yaml"))
    job = adapter.Job  # type: ignore[attr-defined]
    jobs = [job(f"j{i}", "llm" if i % 2 else "vision", 8, duration_s=1.5) for i in range(16)]
    jobs.append(job("too-late", "vision", 100, duration_s=1.0))
    start = time.time() - 600  # a pretend clock the adapter advances by its sleeps
    t = [0.0]
    counts = adapter.run(  # type: ignore[attr-defined]
        client,
        "default",
        jobs,
        seconds=6,
        clock=lambda: start + t[0],
        sleep=lambda s: t.__setitem__(0, t[0] + s),
    )
    # 128 GPUs of jobs on 100 GPUs: 12 fit at once, all 16 small ones finish within 6 cycles.
    assert counts["started"] >= 16 and counts["finished"] == 16
    with db.connect() as conn:
        states = dict(
            conn.execute(text("SELECT state, count(*) FROM workloads GROUP BY state")).all()
        )
        ran = conn.execute(
            text("SELECT count(*) FROM allocation_intervals WHERE ended_at IS NOT NULL")
        ).scalar_one()
    assert states.get("finished") == 16 and ran == 16

    code = main(["explain", "j0", "--address", f"127.0.0.1:{server.port}"])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("j0: finished")
