"""CPU over time of chosen processes, and of the machine, sampled every few milliseconds.

    python bench/cpu_timeline.py OUT --pids 123,456 [--parent 789] [--interval-ms 2]

Runs until its standard input closes, then writes OUT: JSON of the samples, each the monotonic
clock (seconds; `time.perf_counter` of another process reads the same clock on Linux), the
nanoseconds on a CPU so far of each watched process (`/proc/<pid>/task/*/schedstat`), and the machine's
busy and idle time so far (`/proc/stat`, clock ticks). With `--parent`, the children of that
process (PostgreSQL's postmaster: its backends) are watched too, found again at each sample, so
that a backend started meanwhile is seen. A process of its own, so that the sampling takes no
turn of the measured client's interpreter lock; `bench_ingest.py --timeline` runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from pathlib import Path


def children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += map(int, (task / "children").read_text().split())
    return found


def machine() -> tuple[int, int]:
    """(busy, idle) clock ticks of all CPUs so far."""
    fields = list(map(int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]))
    idle = fields[3] + fields[4]
    return sum(fields[:8]) - idle, idle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--pids", default="")
    parser.add_argument("--parent", type=int, default=0)
    parser.add_argument("--interval-ms", type=float, default=2.0)
    args = parser.parse_args()
    fixed = [int(p) for p in args.pids.split(",") if p]
    done = threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    samples: list[dict[str, object]] = []
    while not done.is_set():
        pids = fixed + (children(args.parent) if args.parent else [])
        cpu: dict[int, int] = {}
        for pid in fixed:  # every thread of it
            total = 0
            with contextlib.suppress(OSError):
                for task in Path(f"/proc/{pid}/task").iterdir():
                    with contextlib.suppress(OSError):
                        total += int((task / "schedstat").read_text().split()[0])
            cpu[pid] = total
        for pid in pids[len(fixed) :]:  # backends: one thread each
            with contextlib.suppress(OSError):
                cpu[pid] = int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
        busy, idle = machine()
        samples.append({"t": time.monotonic(), "cpu": cpu, "busy": busy, "idle": idle})
        time.sleep(args.interval_ms / 1e3)
    Path(args.out).write_text(json.dumps(samples))


if __name__ == "__main__":
    main()
