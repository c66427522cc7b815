"""The README's quick start, run as written against a real server: every command of its second
block, in order (`.venv/bin/gpufair` is the command line in this process, `.venv/bin/python` this
interpreter), with the numbers a new user would look at checked in what each prints."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine

from gpufair.api.server import RunningServer
from gpufair.cli import main

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Quick start"


def quick_start_commands() -> list[list[str]]:
    """The commands of the section's block that starts with `apply`, comments dropped."""
    text = (ROOT / "README.md").read_text()
    start = text.index(SECTION)
    section = text[start : text.index("\n## ", start + len(SECTION))]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    (block,) = [b for b in blocks if "gpufair apply" in b]
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def run_line(argv: list[str], address: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    if argv[0] == ".venv/bin/gpufair":
        code = main(argv[1:])
        captured = capsys.readouterr()
        return code, captured.out + captured.err
    assert argv[0] == ".venv/bin/python", argv
    done = subprocess.run(
        [sys.executable, *argv[1:]],
        cwd=ROOT,
        env={**os.environ, "GPUFAIR_ADDRESS": address},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def rows(out: str, first: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.startswith(first)]


def test_the_block_is_the_tour() -> None:
    verbs = [" ".join(c[1:3]) for c in quick_start_commands()]
    assert verbs == [
        "apply -f",
        "apply -f",
        "get config",
        "examples/batch_adapter.py --jobs",
        "submit demo-1",
        "get workloads",
        "explain demo-1",
        "report fairshare",
        "report usage",
    ]


def test_quick_start_as_written(
    server: RunningServer,
    db: Engine,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    address = f"127.0.0.1:{server.port}"
    monkeypatch.setenv("GPUFAIR_ADDRESS", address)
    monkeypatch.chdir(ROOT)
    outputs = []
    hour_at_start = int(time.time() // 3600)
    for argv in quick_start_commands():
        code, out = run_line(argv, address, capsys)
        assert code == 0, f"{shlex.join(argv)} failed:\n{out}"
        outputs.append(out)
    an_hour_closed = int(time.time() // 3600) != hour_at_start
    dry, applied, config, adapter, submit, workloads, explain, fairshare, usage = outputs

    assert "dry run: nothing written (config version stays 0)" in dry
    assert "create queue llm" in " ".join(dry.split())
    assert applied.splitlines()[-1] == "applied: config version 1"
    # The pool with its policy in the short forms the file uses.
    assert rows(config, "default") == [
        ["default", "sliding", "7d", "-", "1", "over_quota", "continuous", "gpufair", "binpack"]
    ]

    # The adapter printed its decisions and its totals: all 20 jobs started (75 GPUs in all fit
    # the 100), the short ones finished within the 10 s.
    binds = rows(adapter, "bind")
    assert len(binds) == 20
    totals = adapter.splitlines()[-1]
    started, finished, preempted = (int(n) for n in re.findall(r"\d+", totals))
    assert (started, preempted) == (20, 0) and 0 < finished < 20

    assert submit.strip() == "submitted demo-1: 32 GPUs in queue vision, pool default"
    (demo,) = rows(workloads, "demo-1")
    assert demo[:4] == ["demo-1", "vision", "default", "pending"]
    assert demo[5:7] == ["1", "32"]  # first in its queue; 8 pods x 4 GPUs
    assert len(rows(workloads, "adapter-")) == 20 - finished  # the ones still running

    assert explain.startswith("demo-1: pending")
    assert "needs 32 CU; its queue may take" in explain
    # Whether it fits the GPUs the adapter's jobs left free depends on which still run: either
    # the next cycle binds it, or it waits with the reason; never "not pending".
    assert "fits now: the next cycle of pool default would bind it" in explain or (
        "It needs 32 CU, 32 of it over-quota" in explain
    )
    assert not re.search(r"\d\.0\b", explain)  # one precision throughout: 32, not 32.0

    assert fairshare.startswith("pool default: 100 CU, computed ")
    llm, vision = rows(fairshare, "llm")[0], rows(fairshare, "vision")[0]
    assert llm[3] == "30" and vision[3] == "20"  # deserved CU
    # As of the last recompute (the adapter's last cycle): no queue is allocated beyond its
    # fair share, and the shares never add up to more than the pool's 100 CU.
    for queue in (llm, vision):
        assert float(queue[6]) <= float(queue[-1])
    assert 0 < float(llm[-1]) + float(vision[-1]) <= 100

    # No hour has closed yet: the open hour carries the usage, marked partial. When the tour ran
    # across the turn of an hour, that hour's usage may already be rolled up and listed first,
    # in the closed hours' table (the rows below are read from both tables).
    if an_hour_closed:
        assert usage.startswith("DAY ") or "no usage recorded in closed hours" in usage
    else:
        assert "no usage recorded in closed hours" in usage
    assert "open hour" in usage and "(partial" in usage
    open_rows = {r[1]: r for r in rows(usage, "20") if len(r) == 6}
    assert set(open_rows) == {"llm", "vision"}
    for r in open_rows.values():
        gpu_hours, cu_hours = float(r[3]), float(r[4])
        assert gpu_hours == cu_hours > 0  # one GPU type of 1 CU
