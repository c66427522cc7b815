"""What the in-memory read caches (`api/read_cache.py`) compare to know they are current.

A key names the latest committed row that a read depends on, by its id and the id of the
transaction that wrote it (`xmin`): ids restart after a TRUNCATE or a restore, transaction ids do
not, so a key never matches an older state by chance. Each key is read by one indexed lookup.
"""

from __future__ import annotations

from sqlalchemy import Connection, text


def fair_share_key(conn: Connection, pool: str) -> tuple[str | None, str | None]:
    """The latest fair-share run of `pool` (in the order `fairshare_repo.latest_run` reads) and
    the latest config version; None where there is none."""
    row = conn.execute(
        text(
            """
            SELECT
              (SELECT id::text || '@' || xmin::text FROM fair_share_runs
                WHERE pool = :pool ORDER BY computed_at DESC, id DESC LIMIT 1) AS run,
              (SELECT version::text || '@' || xmin::text FROM config_versions
                ORDER BY version DESC LIMIT 1) AS config
            """
        ),
        {"pool": pool},
    ).one()
    return row.run, row.config


def config_key(conn: Connection) -> str | None:
    """The latest config version; None before the first apply."""
    value = conn.execute(
        text(
            "SELECT version::text || '@' || xmin::text FROM config_versions "
            "ORDER BY version DESC LIMIT 1"
        )
    ).scalar_one_or_none()
    return None if value is None else str(value)
