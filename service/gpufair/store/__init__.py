"""PostgreSQL: tables, repositories, migrations runner and report SQL."""
