"""All of gpufair's tables in one MetaData: what Alembic compares the database against."""

from gpufair.store import auth_tables, ledger_tables, tables
from gpufair.store.tables import metadata

__all__ = ["auth_tables", "ledger_tables", "metadata", "tables"]
