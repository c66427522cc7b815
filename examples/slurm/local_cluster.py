"""A real Slurm cluster on one machine, with fake GPUs: for trying the bridge and for its tests.

    python examples/slurm/local_cluster.py --dir ./slurm-local   # start; Ctrl-C or SIGTERM stops it

It writes `slurm.conf` and `gres.conf` into a folder, makes fake GPU character devices there
(`mknod`, major 195 as NVIDIA's), and starts `slurmctld` and one `slurmd` per node, each under
`setsid` in the foreground (`-D`), so it needs root and Slurm's daemons (Debian: `slurmctld slurmd
slurm-client`). The nodes: two with 8 A100 80GB (`a100-0`, `a100-1`) and two with 8 RTX 4090 24GB
(`rtx-0`, `rtx-1`); node features name the type and the GPU memory
(`gpumem40`: at least 40 GiB); in partitions `a100`, `rtx` and `gpu` (all four). Authentication is off
(`auth/none`): loopback only, for tests.

Settings the bridge relies on: `batch_sched_delay=0` (a released job starts within a second),
`MinJobAge=3600` (finished jobs stay visible to `squeue`), `SlurmdParameters=config_overrides`
(nodes may declare more CPUs and memory than the host has), and `JobSubmitPlugins=lua` with
`job_submit.lua` of this folder, which records a hold by a job's owner for the bridge; here it
does not hold jobs at submission (`sbatch --hold` does, or not, as a test needs). Client
commands need `SLURM_CONF`: `LocalSlurm.env` holds it.

The daemons are stopped by the pids recorded at start, never by name.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

# (node name, GPU type as Slurm spells it, GPUs, CPUs, memory MiB, features)
NODES: tuple[tuple[str, str, int, int, int, str], ...] = (
    ("a100-0", "a100", 8, 64, 512000, "a100,gpumem40,gpumem80"),
    ("a100-1", "a100", 8, 64, 512000, "a100,gpumem40,gpumem80"),
    ("rtx-0", "rtx4090", 8, 32, 128000, "rtx4090"),
    ("rtx-1", "rtx4090", 8, 32, 128000, "rtx4090"),
)
PARTITIONS = {"a100": "a100-0,a100-1", "rtx": "rtx-0,rtx-1", "gpu": "a100-0,a100-1,rtx-0,rtx-1"}


def sized_nodes(count: int) -> tuple[tuple[str, str, int, int, int, str], ...]:
    """`count` nodes (even), half like `a100-*` and half like `rtx-*` of `NODES`: for measuring
    the bridge at a larger size (every node is one more slurmd on this machine)."""
    half = count // 2
    a100, rtx = NODES[0], NODES[2]
    return tuple((f"a100-{i}", *a100[1:]) for i in range(half)) + tuple(
        (f"rtx-{i}", *rtx[1:]) for i in range(half)
    )


def partitions_of(nodes: tuple[tuple[str, str, int, int, int, str], ...]) -> dict[str, str]:
    """`a100`, `rtx` and `gpu` (all) over these nodes."""
    names = [n[0] for n in nodes]
    return {
        "a100": ",".join(n for n in names if n.startswith("a100-")),
        "rtx": ",".join(n for n in names if n.startswith("rtx-")),
        "gpu": ",".join(names),
    }


DAEMONS = ("slurmctld", "slurmd", "sinfo", "squeue", "scontrol", "sbatch")


def program(name: str) -> str | None:
    """A Slurm program's path: on PATH, or in /usr/sbin where Debian puts the daemons."""
    return shutil.which(name, path=os.environ.get("PATH", "") + os.pathsep + "/usr/sbin")


def missing_commands() -> list[str]:
    """The Slurm programs this harness needs that are not installed."""
    return [name for name in DAEMONS if program(name) is None]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _slurm_conf(
    root: Path,
    ctld_port: int,
    node_ports: dict[str, int],
    nodes: tuple[tuple[str, str, int, int, int, str], ...] = NODES,
    slurmd_timeout_s: int = 60,
) -> str:
    lines = [
        "ClusterName=gpufairtest",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        "AuthType=auth/none",
        "CredType=cred/none",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/run/slurmctld.pid",
        f"SlurmdPidFile={root}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "GresTypes=gpu",
        "SchedulerType=sched/builtin",
        "SchedulerParameters=batch_sched_delay=0",
        "SlurmdParameters=config_overrides",
        "MinJobAge=3600",
        "DefMemPerCPU=1024",
        "ReturnToService=2",
        "JobCompType=jobcomp/none",
        "SlurmctldTimeout=30",
        f"SlurmdTimeout={slurmd_timeout_s}",
        "InactiveLimit=0",
        "KillWait=2",
        "Waittime=0",
        "JobSubmitPlugins=lua",
    ]
    for name, gpu_type, gpus, cpus, memory_mib, features in nodes:
        lines.append(
            f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={node_ports[name]} "
            f"CPUs={cpus} RealMemory={memory_mib} Gres=gpu:{gpu_type}:{gpus} "
            f"Features={features} State=UNKNOWN"
        )
    for partition, members in partitions_of(nodes).items():
        lines.append(
            f"PartitionName={partition} Nodes={members} MaxTime=INFINITE State=UP"
            + (" Default=YES" if partition == "gpu" else "")
        )
    return "\n".join(lines) + "\n"


def _job_submit_lua() -> str:
    """The example `job_submit.lua` for every partition here, holding no job at submission."""
    text = (Path(__file__).parent / "job_submit.lua").read_text()
    mapped = ", ".join(f"{name} = true" for name in PARTITIONS)
    for line, ours in (
        ("local GPUFAIR_PARTITIONS = {gpu = true}", f"local GPUFAIR_PARTITIONS = {{{mapped}}}"),
        ("local HOLD_AT_SUBMIT = true", "local HOLD_AT_SUBMIT = false"),
    ):
        assert line in text, line
        text = text.replace(line, ours)
    return text


@dataclass
class LocalSlurm:
    """slurmctld and one slurmd per node, in `root`; `start()` then `stop()`."""

    root: Path
    pids: dict[str, int] = field(default_factory=dict)
    nodes: tuple[tuple[str, str, int, int, int, str], ...] = NODES
    # SlurmdTimeout: seconds without a node's answer before slurmctld sets it DOWN. It pings a
    # node a third of this after its last answer; a dead slurmd's ping fails after about 11 s
    # (MessageTimeout 10 s), and the node shows not responding (`idle*`) from then.
    slurmd_timeout_s: int = 60

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), env=self.env, capture_output=True, text=True, check=check, timeout=30
        )

    def write_files(self) -> None:
        for sub in ("state", "run", "log", "dev", "jobs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        ports = {name: free_port() for name, *_ in self.nodes}
        self.conf.write_text(
            _slurm_conf(self.root, free_port(), ports, self.nodes, self.slurmd_timeout_s)
        )
        gres = ["AutoDetect=off"]
        for name, gpu_type, gpus, *_ in self.nodes:
            for index in range(gpus):
                device = self.root / "dev" / f"{name}-nvidia{index}"
                if not device.exists():
                    # A character device of NVIDIA's major number: slurmd refuses regular files.
                    os.mknod(device, 0o600 | 0o020000, os.makedev(195, index))
            gres.append(
                f"NodeName={name} Name=gpu Type={gpu_type} "
                f"File={self.root}/dev/{name}-nvidia[0-{gpus - 1}]"
            )
        (self.root / "gres.conf").write_text("\n".join(gres) + "\n")
        (self.root / "job_submit.lua").write_text(_job_submit_lua())
        for name, *_ in self.nodes:
            (self.root / "spool" / name).mkdir(parents=True, exist_ok=True)

    def _spawn(self, key: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{key}.out", "ab")  # noqa: SIM115 - the child owns it
        proc = subprocess.Popen(
            argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.pids[key] = proc.pid

    def start(self, timeout_s: float = 60.0) -> None:
        """Write the files, start the daemons, and wait until a first job can be placed."""
        self.write_files()
        slurmctld, slurmd = program("slurmctld") or "slurmctld", program("slurmd") or "slurmd"
        self._spawn("slurmctld", [slurmctld, "-D", "-i", "-f", str(self.conf)])
        for name, *_ in self.nodes:
            self._spawn(f"slurmd-{name}", [slurmd, "-D", "-N", name, "-f", str(self.conf)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            probe = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
            states = dict(line.split() for line in probe.stdout.splitlines() if line.strip())
            if len(states) == len(self.nodes) and all(s == "idle" for s in states.values()):
                break
            time.sleep(0.3)
        else:
            raise RuntimeError(f"Slurm nodes not idle after {timeout_s} s: {self.logs_tail()}")
        # Idle nodes do not yet mean slurmctld places jobs (its first pass comes a few s later).
        self.wait_for_first_job(deadline)

    def wait_for_first_job(self, deadline: float) -> None:
        out = self.run(
            "sbatch", "--parsable", "-p", "gpu", "-N1", "-J", "probe", "-o", "/dev/null",
            "--wrap", "true",
        ).stdout  # fmt: skip
        job_id = out.strip().split(";")[0]
        while time.monotonic() < deadline:
            state = self.run("squeue", "-h", "-j", job_id, "-t", "all", "-o", "%T").stdout.strip()
            if state in ("RUNNING", "COMPLETED", "COMPLETING"):
                return
            time.sleep(0.3)
        raise RuntimeError(f"first Slurm job {job_id} did not start: {self.logs_tail()}")

    def kill_node(self, name: str) -> None:
        """Kill one node's slurmd (SIGKILL, by the pid recorded at its start), as a node failure
        does; the job steps it started run on until it is started again."""
        pid = self.pids.pop(f"slurmd-{name}")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)

    def start_node(self, name: str, timeout_s: float = 30.0, *, poll_s: float = 0.3) -> None:
        """Start a killed node's slurmd again and wait until Slurm shows the node idle (a node
        set DOWN returns on registering: `ReturnToService=2`), asking every `poll_s`."""
        slurmd = program("slurmd") or "slurmd"
        self._spawn(f"slurmd-{name}", [slurmd, "-D", "-N", name, "-f", str(self.conf)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.run("sinfo", "-h", "-n", name, "-N", "-o", "%t", check=False).stdout
            if set(state.split()) == {"idle"}:
                return
            time.sleep(poll_s)
        raise RuntimeError(f"node {name} not idle after {timeout_s} s: {self.logs_tail()}")

    def _check_alive(self) -> None:
        for key, pid in self.pids.items():
            try:
                finished, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if finished:
                raise RuntimeError(f"{key} exited with {status}: {self.logs_tail()}")

    def logs_tail(self, lines: int = 15) -> str:
        out = []
        for path in sorted((self.root / "log").glob("*")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(out)

    def cancel_all(self) -> None:
        """Cancel every job, and wait until none is left running."""
        self.run("scancel", "--user", "root", check=False)
        for _ in range(100):
            jobs = json.loads(self.run("squeue", "--json").stdout)["jobs"]
            if not any(j["job_state"] in ("RUNNING", "COMPLETING", "PENDING") for j in jobs):
                return
            time.sleep(0.2)

    def stop(self) -> None:
        """Cancel every job (so no job step outlives the daemons), then stop the daemons by the
        pids recorded at start: SIGTERM, then SIGKILL."""
        if "slurmctld" in self.pids:
            with contextlib.suppress(subprocess.SubprocessError, OSError, ValueError, KeyError):
                self.cancel_all()
        for pid in self.pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for pid in self.pids.values():
            while time.monotonic() < deadline:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        break
                except ChildProcessError:
                    break
                time.sleep(0.1)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass
        self.pids.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="folder for the config, state and logs")
    parser.add_argument("--nodes", type=int, default=len(NODES), help="nodes (even; default 4)")
    args = parser.parse_args()
    cluster = LocalSlurm(Path(args.dir).resolve(), nodes=sized_nodes(args.nodes))

    def stop_on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop_on_signal)
    try:
        cluster.start()
        print(f"Slurm is up. In another shell:\n  export SLURM_CONF={cluster.conf}\n  sinfo")
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
