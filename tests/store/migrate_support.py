"""What the migration tests share: a statement run on a scratch database by its URL."""

from __future__ import annotations

from sqlalchemy import create_engine, text

from gpufair.store.database import normalise_url


def sql_rows(url: str, sql: str, **params: object) -> list[tuple[object, ...]]:
    """Run `sql` on its own connection, committed; its rows as tuples (none for a write)."""
    engine = create_engine(normalise_url(url))
    try:
        with engine.begin() as conn:
            result = conn.execute(text(sql), params)
            return [tuple(r) for r in result] if result.returns_rows else []
    finally:
        engine.dispose()
