"""An embedded PostgreSQL that a test owns, run from a small process of its own and stopped and
started on command.

Why a process of its own: run as root, the embedded server's tools run as another user, so
Python starts them with a plain fork() (the only way to switch users), and gRPC's fork handlers
then run in the child. In a test process with gRPC calls in flight that child can crash (seen:
`pg_ctl stop` dying of SIGSEGV). This process has no gRPC in it; the test starts it with no user
switch, which Python does without those handlers.

    python own_postgres.py DATA_DIR   # prints the URL, then answers "stop", "start" and "quit"
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


class OwnPostgres:
    """The test's side: the URL, and stop/start/close of that one server."""

    def __init__(self, data_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(data_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.url = self._reply()

    def _reply(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line or line.startswith("error"):
            raise RuntimeError(f"embedded PostgreSQL: {line or 'exited'}")
        return line

    def _command(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        assert self._reply() == "ok"

    def stop(self) -> None:
        self._command("stop")

    def start(self) -> None:
        self._command("start")

    def close(self) -> None:
        """Stop the server for good (also when the test failed halfway)."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # end of commands: the process stops the server and exits
            self.proc.wait(timeout=60)


def serve(data_dir: Path) -> None:
    from gpufair.store.database import start_embedded

    database = start_embedded(data_dir)
    handle = database.embedded
    assert handle is not None
    try:
        print(database.url, flush=True)
        for line in sys.stdin:
            command = line.strip()
            try:
                if command == "stop":
                    handle.stop()
                elif command == "start":
                    handle.start()
                else:
                    print(f"error: unknown command {command!r}", flush=True)
                    continue
            except Exception as exc:
                print(f"error: {command}: {exc}", flush=True)
                continue
            print("ok", flush=True)
    finally:
        database.close()


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
