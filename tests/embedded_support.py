"""Data directories for the embedded PostgreSQL that tests start: never under pytest's tmp_path.

Run as root, the embedded server's tools (initdb, pg_ctl, postgres) run as another system user,
and its package opens the way to the data directory by giving others read and search permission
on each of the directory's parents, once, as it starts the server. Every pytest run that uses
a temporary directory takes that permission back from its per-user root (pytest-of-<user>, set
to mode 0700 as the run starts; an `-n` run's controller always asks for one), and other runs
go on beside the tests on a shared machine. A data directory under tmp_path is then
cut off from the server's own user at any moment: a CI run's `pg_ctl start` exited 1 with
"could not access directory ...: Permission denied" before the server wrote its log, and initdb
failed the same way.

So a test's data directory is a directory of its own in the system's temporary directory, which
no pytest run touches, removed afterwards (a server still running there stopped first)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from gpufair.store.database import stop_postmaster

STOP_TIMEOUT_S = 30.0


@contextlib.contextmanager
def embedded_data_dir(prefix: str = "gpufair-test-") -> Iterator[Path]:
    """A data directory, `pgdata` in a new temporary directory (its set-up log lands beside
    it), not created: the embedded server creates and initialises it."""
    with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as tmp:
        data_dir = Path(tmp) / "pgdata"
        try:
            yield data_dir
        finally:
            # A test that failed halfway may have left its server running: stop it rather than
            # leave a postmaster behind whose data directory is gone.
            stop_postmaster(data_dir, STOP_TIMEOUT_S)
