"""`alembic check` on a scratch database: fails when the tables in code and the migrations differ."""

from __future__ import annotations

import sys

from gpufair.store import migrate
from gpufair.store.scratch import scratch_database, test_server


def main() -> int:
    with test_server() as server, scratch_database(server.url, prefix="gpufair_check") as url:
        migrate.upgrade(url)
        migrate.check(url)
        print(f"migrations at {migrate.current_revision(url)}: tables and migrations agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
