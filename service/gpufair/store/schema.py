"""All of gpufair's tables in one MetaData: what Alembic compares the database against."""

from gpufair.store.tables import metadata

__all__ = ["metadata"]
