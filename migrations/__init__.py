"""Alembic migrations of gpufair's schema, installed as `gpufair.migrations`."""
