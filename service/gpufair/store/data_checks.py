"""What stored history of a pool is not finite, said in words.

Values the API refuses today (domain/limits.py) may have been stored by an earlier version: a
GPU type of compute_weight 1e308 gave its pool an infinite capacity row and its runs an infinite
CU. The fair-share reads skip such rows (`capacity_repo.capacity_timeline`,
`rollup_repo.intervals_between`), so the pool stays schedulable; this module finds them, so that
the recompute logs it and the replies of Schedule and GetFairShare carry a warning, until the
rows fall out of the usage window or an operator deletes them.
"""

from __future__ import annotations

from sqlalchemy import Connection, text

from gpufair.store.ledger_tables import NOT_FINITE_RUN

# The runs' count goes through the partial index of the runs that are not finite
# (`ledger_tables.allocation_intervals`), whose predicate it repeats: a lookup in an index that
# is normally empty, whatever the length of the history.
HISTORY_SQL = text(
    f"""
    SELECT
      (SELECT count(*) FROM pool_capacity_changes
        WHERE pool = :pool AND NOT (capacity_cu < 'Infinity'::float8)) AS capacity,
      (SELECT count(*) FROM allocation_intervals
        WHERE pool = :pool
          AND {NOT_FINITE_RUN}
          AND (ended_at IS NULL OR ended_at >= to_timestamp(:since))) AS runs
    """
)


def nonfinite_history(conn: Connection, pool: str, since_s: float) -> list[str]:
    """Warnings about the pool's capacity rows and its runs since `since_s` whose numbers are
    not finite (infinite or NaN); empty when all are."""
    row = conn.execute(HISTORY_SQL, {"pool": pool, "since": max(since_s, 0.0)}).one()
    warnings = []
    if row.capacity:
        warnings.append(
            f"pool {pool!r}: {row.capacity} stored capacity row(s) are not finite (from a GPU "
            "type's compute_weight stored before the input limits); they are skipped as no "
            "capacity"
        )
    if row.runs:
        warnings.append(
            f"pool {pool!r}: {row.runs} stored run(s) in the usage window have a GPU or CU "
            "amount that is not finite; they are skipped as no usage"
        )
    return warnings
