"""A server process started the way `gpufair serve` starts one with the cli_auth helpers (listen
check, TLS credentials, auth interceptor, in that order), for process tests of the listen rule.

    python tests/auth_serve_support.py --address A --database-url U [serve auth options]

Exit code 2 with `error: ...` on stderr when the options are refused, as the CLI does.
"""

from __future__ import annotations

import argparse
import logging
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import FrameType

from gpufair.api.auth import auth_interceptor
from gpufair.api.server import build_server
from gpufair.cli_auth import (
    AuthSetupError,
    add_serve_auth_options,
    check_listen,
    server_credentials,
)
from gpufair.store.database import make_engine


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--database-url", required=True)
    add_serve_auth_options(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        check_listen(args)
        credentials = server_credentials(args)
    except AuthSetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    engine = make_engine(args.database_url, pool_size=2)
    auth = auth_interceptor(engine, args.require_tokens)
    running = build_server(
        engine,
        args.address,
        max_workers=2,
        interceptors_extra=[auth] if auth else [],
        credentials=credentials,
    )
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    stop.wait()
    running.stop(1.0)
    engine.dispose()
    return 0


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, str(Path(__file__)), *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
