"""The Slurm bridge at a production-like size: a real local Slurm, a gpufair server, bridge cycles.

    sudo .venv/bin/python bench/bench_slurm_bridge.py --baseline BASE [--nodes 16]
        [--jobs 500,2000] [--cycles 4] [--unheld]
    sudo .venv/bin/python bench/bench_slurm_bridge.py --reads [--jobs 2000]

BASE: a checkout (e.g. `git worktree add --detach BASE <commit>`) whose `service/` holds the
bridge to compare with; without it only this tree's bridge runs. About 8 minutes with both arms
and `--unheld` on 2 cores (a fresh cluster for each run).

Needs root and Slurm's daemons (examples/slurm/local_cluster.py starts slurmctld and one slurmd
per node: 16 nodes, 8 A100 and 8 RTX 4090 of 8 fake GPUs each, 128 GPUs). gpufair runs as a
process of its own (`gpufair serve`, a scratch database per run). For each size, the jobs are
submitted in four shapes (1, 2 and 8 GPUs on one node, 2 nodes x 8 GPUs) by two accounts (two
gpufair queues), each a `sleep 900`:

- held (`sbatch --hold`, as the example job_submit.lua holds them at a site);
- with `--unheld`, also without a hold, while a whole-node job of an unmapped partition runs on
  every node (so Slurm starts none of them itself): the bridge holds each. Those node jobs are
  cancelled after the first cycle, so the jobs placed there start.

Then a bridge runs `--cycles` cycles, one a second, in a child process whose `PYTHONPATH` picks
the bridge (base, then this tree's, for each size and kind). Per cycle:

- wall time, and the CPU time of the bridge (its process; `commands_cpu_s`: the Slurm commands
  it ran, its children), of slurmctld and of the gpufair server (from /proc);
- the Slurm commands run (`squeue -O`, `squeue --json`, `scontrol show job`, `sinfo --json`,
  `sdiag`, other `scontrol` by verb), how many, and each kind's wall and CPU seconds in the cycle
  (`commands_wall_by_kind_s`, `commands_cpu_by_kind_s`: the reads one by one);
- what the cycle did (submitted, placed).

And `first_running_after_submit_s`: from the last `sbatch` to the first job Slurm shows running
(polled after the first cycle that placed a job). `--reads` runs no bridge: the CPU of the ways
Slurm could be read (`READS`), one cluster per size. The 1-minute load average goes with each run:
on a shared machine wall time is far above CPU time.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

SHAPES = (  # (nodes, GPUs per node), in turn
    (1, 1),
    (1, 2),
    (1, 8),
    (2, 8),
)
BRIDGE = {
    "partitions": {"gpu": "gpu"},
    "accounts": {"acct-a": "team-a", "acct-b": "team-b"},
    "gpu_types": {"a100": "a100-80gb", "rtx4090": "rtx4090-24gb"},
    "cycle_s": 1,
    "heartbeat_s": 30,
}


def _cpu_s(pid: int) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks


# ---- the child: bridge cycles --------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    """Run the bridge's cycles, counting the Slurm commands it runs; JSON lines to stdout."""
    from server_process import tree_cpu_s

    from gpufair.client import GpufairClient
    from gpufair.integrations.slurm import slurmctl
    from gpufair.integrations.slurm.bridge import Bridge
    from gpufair.integrations.slurm.config import parse_config

    commands: dict[str, list[float]] = {}
    commands_cpu: dict[str, float] = {}
    real_run = subprocess.run

    def counted_run(argv: Any, *a: Any, **kw: Any) -> Any:
        started = time.perf_counter()
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            return real_run(argv, *a, **kw)
        finally:
            wall = time.perf_counter() - started
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            name = _command_kind(argv)
            commands.setdefault(name, []).append(wall)
            commands_cpu[name] = commands_cpu.get(name, 0.0) + (
                after.ru_utime + after.ru_stime - kids.ru_utime - kids.ru_stime
            )

    slurmctl.subprocess.run = counted_run  # type: ignore[attr-defined]
    # Why a cycle's text read was not used (`SlurmCtl.jobs` logs it), for the rows below.
    fallbacks: list[str] = []

    class Fallbacks(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "text read not used" in record.getMessage():
                fallbacks.append(record.getMessage()[:300])

    bridge_log = logging.getLogger("gpufair.slurm_bridge")
    bridge_log.addHandler(Fallbacks())
    bridge_log.setLevel(logging.INFO)
    bridge_log.propagate = False
    config = parse_config(BRIDGE)
    with GpufairClient(args.address, timeout_s=120) as client:
        bridge = Bridge(config, client, slurmctl.SlurmCtl())
        first_running: float | None = None
        for index in range(args.cycles):
            commands.clear()
            commands_cpu.clear()
            fallbacks.clear()
            self0 = resource.getrusage(resource.RUSAGE_SELF)
            kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            ctld0, server0 = _cpu_s(args.slurmctld_pid), tree_cpu_s(args.server_pid)
            started = time.perf_counter()
            report = bridge.cycle()
            wall = time.perf_counter() - started
            self1 = resource.getrusage(resource.RUSAGE_SELF)
            kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            row = {
                "cycle": index,
                "wall_s": round(wall, 3),
                "bridge_cpu_s": round(
                    self1.ru_utime + self1.ru_stime - self0.ru_utime - self0.ru_stime, 3
                ),
                "commands_cpu_s": round(
                    kids1.ru_utime + kids1.ru_stime - kids0.ru_utime - kids0.ru_stime, 3
                ),
                "slurmctld_cpu_s": round(_cpu_s(args.slurmctld_pid) - ctld0, 3),
                "server_cpu_s": round(tree_cpu_s(args.server_pid) - server0, 3),
                "commands": {k: len(v) for k, v in sorted(commands.items())},
                "commands_wall_s": round(sum(sum(v) for v in commands.values()), 3),
                "commands_wall_by_kind_s": {
                    k: round(sum(v), 3) for k, v in sorted(commands.items())
                },
                "commands_cpu_by_kind_s": {k: round(v, 3) for k, v in sorted(commands_cpu.items())},
                "submitted": len(report.submitted),
                "placed": len(report.placed),
                "requeued": len(report.requeued),
                "text_read_not_used": fallbacks[:2],
                "errors": report.errors[:3],
            }
            if index == 0 and args.fillers:
                subprocess.run(["scancel", *args.fillers.split(",")], check=True)
            if first_running is None and report.placed:
                first_running = _wait_running(args.submitted_at)
                row["first_running_after_submit_s"] = round(first_running, 3)
            print(json.dumps(row), flush=True)
            time.sleep(max(0.0, 1.0 - (time.perf_counter() - started)))


def _command_kind(argv: Any) -> str:
    """A Slurm command as the rows name it: `squeue -O` (the text read), `squeue --json`,
    `scontrol show job` (the text read's `--all -d show job -o`), `scontrol show node`,
    `scontrol uhold` (by verb), `sinfo --json`, `sdiag`."""
    name = Path(argv[0]).name
    words = [a for a in argv[1:] if not a.startswith("-")]
    if name == "scontrol" and words:
        name += " " + " ".join(words[:2] if words[0] == "show" else words[:1])
    elif name == "squeue":
        name += " --json" if "--json" in argv else " -O"
    elif name == "sinfo" and "--json" in argv:
        name += " --json"
    return str(name)


def _wait_running(submitted_at: float) -> float:
    """Seconds from the last sbatch to the first job Slurm shows running."""
    while True:
        out = subprocess.run(
            ["squeue", "-h", "-t", "RUNNING", "-o", "%i"],
            check=False,
            capture_output=True,
            text=True,
        ).stdout
        if out.strip():
            return time.time() - submitted_at
        time.sleep(0.05)


# ---- the parent: cluster, server, jobs -----------------------------------------------------


def fill_nodes(cluster: Any) -> list[str]:
    """A whole-node job on every node, in the partitions the bridge does not map (`a100`,
    `rtx`), running: the jobs submitted next stay pending without a hold."""
    ids = []
    for name, *_ in cluster.nodes:
        partition = "a100" if name.startswith("a100") else "rtx"
        out = cluster.run(
            "sbatch", "--parsable", "-p", partition, "-w", name, "--gres=gpu:8", "-o",
            "/dev/null", "--wrap", "sleep 900",
        ).stdout  # fmt: skip
        ids.append(out.strip().split(";")[0])
    for _ in range(300):
        states = cluster.run("squeue", "-h", "-j", ",".join(ids), "-o", "%T").stdout.split()
        if states.count("RUNNING") == len(ids):
            return ids
        time.sleep(0.2)
    raise RuntimeError(f"filler jobs not running: {states}")


def submit(cluster: Any, count: int, *, held: bool = True) -> float:
    """`count` jobs (held, or not) of the shapes and accounts in turn, a few sbatch at a time;
    the time the last was accepted."""
    argvs = []
    for i in range(count):
        nodes, gpus = SHAPES[i % len(SHAPES)]
        account = ("acct-a", "acct-b")[(i // len(SHAPES)) % 2]
        hold = ["--hold"] if held else []
        argvs.append(
            ["sbatch", "--parsable", *hold, "-p", "gpu", "-A", account, f"-N{nodes}",
             f"--gres=gpu:{gpus}", "-o", "/dev/null", "--wrap", "sleep 900"]
        )  # fmt: skip
    running: list[subprocess.Popen[bytes]] = []
    for argv in argvs:
        running.append(subprocess.Popen(argv, env=cluster.env, stdout=subprocess.DEVNULL))
        if len(running) >= 8:
            assert running.pop(0).wait() == 0
    for proc in running:
        assert proc.wait() == 0
    return time.time()


def run_arm(
    cluster: Any, server_url: str, jobs: int, service: Path, cycles: int, *, held: bool
) -> dict[str, Any]:
    from server_process import free_port, wait_serving

    from gpufair.client import GpufairClient
    from gpufair.store.scratch import scratch_database

    sys.path.insert(0, str(ROOT / "tests" / "integrations" / "slurm"))
    cluster_config = importlib.import_module("slurm_support").cluster_config  # the tests' pool

    cluster.cancel_all()
    with (
        scratch_database(server_url, prefix="gpufair_bench") as url,
        tempfile.TemporaryFile() as log,
    ):
        subprocess.run(
            [sys.executable, "-m", "gpufair.cli", "migrate", "--database-url", url],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        port = free_port()
        server = subprocess.Popen(
            [
                *(sys.executable, "-m", "gpufair.cli", "serve", "--address", f"127.0.0.1:{port}"),
                *("--database-url", url, "--metrics-address", "", "--grace-s", "2"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_serving(f"127.0.0.1:{port}", server)
            with GpufairClient(f"127.0.0.1:{port}", timeout_s=60) as client:
                client.apply_config(cluster_config("gpu"))
            fillers = [] if held else fill_nodes(cluster)
            submitted_at = submit(cluster, jobs, held=held)
            load = os.getloadavg()[0]
            env = {**cluster.env, "PYTHONPATH": str(service)}
            done = subprocess.run(
                [
                    *(sys.executable, __file__, "--worker", "--address", f"127.0.0.1:{port}"),
                    *("--cycles", str(cycles), "--submitted-at", repr(submitted_at)),
                    *("--slurmctld-pid", str(cluster.pids["slurmctld"])),
                    *("--server-pid", str(server.pid), "--fillers", ",".join(fillers)),
                ],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(done.stderr[-3000:])
            rows = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
            return {
                "jobs": jobs,
                "held_at_submit": held,
                "load_average_1m_before": round(load, 2),
                "cycles": rows,
            }
        finally:
            server.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(10)


READS = {  # what one bridge read could be, as Slurm 22.05 answers it
    "squeue --json --all": ["squeue", "--json", "--all"],
    "squeue --json --all -t RUNNING": ["squeue", "--json", "--all", "-t", "RUNNING"],
    "squeue --json --all -p gpu": ["squeue", "--json", "--all", "-p", "gpu"],
    "squeue --json --all --format %i": ["squeue", "--json", "--all", "--format", "%i"],
    "squeue --all -h -O (26 fields)": ["squeue", "--all", "-h", "-O", ",".join(
        f"{f}:\x1f" for f in ("JobID", "State", "Reason", "Partition", "Account", "QOS",
        "PriorityLong", "Nice", "NumNodes", "NumCPUs", "MinCpus", "MinMemory", "tres-per-node",
        "tres-per-job", "tres-per-task", "Feature", "NodeList", "RestartCnt", "SubmitTime",
        "StartTime", "EndTime", "Comment", "ArrayJobID", "ArrayTaskID", "Dependency",
        "EligibleTime"))],
    "scontrol -d show job -o": ["scontrol", "-d", "show", "job", "-o"],
    "scontrol --all show job -o (round 30's memory read)": [
        "scontrol", "--all", "show", "job", "-o"
    ],
    "scontrol --all -d show job -o (the bridge's read: memory and GPU indices)": [
        "scontrol", "--all", "-d", "show", "job", "-o"
    ],
}  # fmt: skip


def _text_read() -> list[str]:
    """The bridge's text read (records.SQUEUE_FORMAT: 25 fields, then the fixed-width Name and
    Comment), as this tree runs it."""
    from gpufair.integrations.slurm.records import SQUEUE_FORMAT

    return ["squeue", "--all", "--states=all", "-h", "-O", SQUEUE_FORMAT]


def reads(cluster: Any, jobs: int, running: int = 20, repeat: int = 7) -> dict[str, Any]:
    """`--reads`: `jobs` held jobs, `running` of them released (Slurm starts them), then each
    of `READS` run `repeat` times: its CPU (the least; the command as a child) and its output's
    size; and this process's `json.loads` and `parse_job` of the `--json` output (the least of
    3, CPU)."""
    from gpufair.integrations.slurm.records import parse_job, parse_squeue_text

    submit(cluster, jobs, held=True)
    ids = cluster.run("squeue", "-h", "-o", "%i").stdout.split()[:running]
    cluster.run("scontrol", "release", ",".join(ids))
    time.sleep(3)
    out: dict[str, Any] = {"jobs": jobs, "running": running, "commands": {}}
    env = {**cluster.env, "SLURM_TIME_FORMAT": "%s"}
    for name, argv in {**READS, "squeue -O (the bridge's text read)": _text_read()}.items():
        cpu, size = [], 0
        for _ in range(repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            done = subprocess.run(argv, env=env, capture_output=True, check=True)
            size = len(done.stdout)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        out["commands"][name] = {"cpu_s": round(min(cpu), 3), "bytes": size}
    argv = READS["squeue --json --all"]
    text = subprocess.run(argv, env=cluster.env, capture_output=True, check=True)
    loads, parse = [], []
    for _ in range(3):
        started = time.process_time()
        data = json.loads(text.stdout.decode())
        loaded = time.process_time()
        [parse_job(raw) for raw in data["jobs"]]
        loads.append(loaded - started)
        parse.append(time.process_time() - loaded)
    out["json_loads_cpu_s"], out["parse_job_cpu_s"] = round(min(loads), 3), round(min(parse), 3)
    squeue_out = subprocess.run(_text_read(), env=env, capture_output=True, check=True).stdout
    scontrol_argv = ["scontrol", "--all", "-d", "show", "job", "-o"]
    scontrol_out = subprocess.run(scontrol_argv, env=env, capture_output=True, check=True).stdout
    texts = []
    for _ in range(3):
        started = time.process_time()
        parse_squeue_text(squeue_out, scontrol_out)
        texts.append(time.process_time() - started)
    out["parse_squeue_text_cpu_s"] = round(min(texts), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--jobs", default="500,2000")
    parser.add_argument("--cycles", type=int, default=4)
    parser.add_argument("--baseline", type=Path, default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--submitted-at", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--slurmctld-pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--server-pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--fillers", default="", help=argparse.SUPPRESS)
    parser.add_argument(
        "--unheld", action="store_true", help="also: jobs submitted without a hold, every node busy"
    )
    parser.add_argument(
        "--reads", action="store_true", help="only: the CPU of squeue's reads (`reads`)"
    )
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    from gpufair.store.scratch import test_server

    spec = importlib.util.spec_from_file_location(
        "local_cluster", ROOT / "examples" / "slurm" / "local_cluster.py"
    )
    assert spec is not None and spec.loader is not None
    local = importlib.util.module_from_spec(spec)
    sys.modules["local_cluster"] = local
    spec.loader.exec_module(local)

    if args.reads:
        for jobs in (int(j) for j in args.jobs.split(",")):
            with tempfile.TemporaryDirectory(prefix="gpufair-slurm-bench-") as tmp:
                cluster = local.LocalSlurm(Path(tmp), nodes=local.sized_nodes(args.nodes))
                try:
                    cluster.start(timeout_s=180)
                    print(json.dumps(reads(cluster, jobs)), flush=True)
                finally:
                    cluster.stop()
        return

    arms = [("new", ROOT / "service")]
    if args.baseline is not None:
        arms.insert(0, ("base", args.baseline.resolve() / "service"))
    results: dict[str, Any] = {
        "nodes": args.nodes,
        "gpus": args.nodes * 8,
        "cores": os.cpu_count(),
        "load_average_1m_start": round(os.getloadavg()[0], 2),
        "runs": [],
    }
    with test_server() as db:
        kinds = [True, False] if args.unheld else [True]
        for jobs in (int(j) for j in args.jobs.split(",")):
            for held in kinds:
                for name, service in arms:
                    # A fresh cluster per run: Slurm keeps ended jobs an hour (MinJobAge), and
                    # a run's squeue would read the runs' before it too.
                    with tempfile.TemporaryDirectory(prefix="gpufair-slurm-bench-") as tmp:
                        cluster = local.LocalSlurm(Path(tmp), nodes=local.sized_nodes(args.nodes))
                        started = time.perf_counter()
                        try:
                            cluster.start(timeout_s=180)
                            start_s = round(time.perf_counter() - started, 1)
                            run = run_arm(cluster, db.url, jobs, service, args.cycles, held=held)
                        finally:
                            cluster.stop()
                    run["arm"], run["cluster_start_s"] = name, start_s
                    results["runs"].append(run)
                    print(json.dumps(run), file=sys.stderr, flush=True)
    results["load_average_1m_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
