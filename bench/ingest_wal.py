"""WAL written per event, by relation: the stream's (`Ingest.stream`, as `gpufair serve` runs it)
beside the raw COPY of the same rows, as `bench_ingest.py` makes both.

    python bench/ingest_wal.py [--mix steady|churn] [--events 50000]

A scratch database is set up as `bench_ingest.py` sets up a round (cluster, workloads, the
steady mix's earlier starts through a stream, the raw COPY's table holding them too); then the
raw COPY of the timed events and the stream of the same events run one after the other, each
between two reads of the WAL insert position, and `pg_walinspect` (a contrib extension, created
in the scratch database only) reads the records written in between. Records are attributed to a
relation of the scratch database by their block references (a record that touches several
blocks counts once, for its first); a commit record counts as the scratch database's when its
transaction wrote a block of it; other records are counted apart (another database's on a shared
server, or none's). Full-page images (a page's first change after a checkpoint, wherever the
server's checkpoints fall) are shown apart: compare the bytes without them. Needs a server on
which `CREATE EXTENSION pg_walinspect` works (PostgreSQL 15 or later, superuser)."""

from __future__ import annotations

import argparse
import re
import time
from collections import defaultdict
from typing import Any

import bench_ingest
import psycopg
from bench_ingest import RAW_COPY_SQL, RAW_COPY_TABLE, libpq_url, raw_row

from gpufair.api.convert_cluster import config_from_proto
from gpufair.api.ingest import Ingest
from gpufair.config_file import parse_config
from gpufair.domain.config_diff import diff_configs
from gpufair.gc_tuning import tune_for_serving
from gpufair.store import config_repo, migrate
from gpufair.store.database import make_engine
from gpufair.store.scratch import scratch_database, test_server
from gpufair.v1 import ledger_pb2 as pb

BATCH = 2000
_BLOCK = re.compile(r"rel (\d+)/(\d+)/(\d+)")


def wal_by_relation(
    conn: psycopg.Connection[Any], start: str, end: str, dboid: int
) -> dict[str, tuple[int, int, int]]:
    """relation name (or what a record is) -> (records, bytes, of which full-page images)."""
    names = dict(
        conn.execute("SELECT pg_relation_filenode(oid)::bigint, relname FROM pg_class").fetchall()
    )
    found: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    rows = conn.execute(
        "SELECT resource_manager, record_type, record_length, fpi_length, block_ref, xid "
        "FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn)",
        (start, end),
    ).fetchall()
    ours: set[int] = set()  # transactions that wrote a block of the scratch database
    for *_, blocks, xid in rows:
        match = _BLOCK.search(blocks or "")
        if match and int(match.group(2)) == dboid and xid:
            ours.add(int(xid))
    for rmgr, rtype, length, fpi, blocks, xid in rows:
        match = _BLOCK.search(blocks or "")
        if match and int(match.group(2)) == dboid:
            key = names.get(int(match.group(3)), f"filenode {match.group(3)}")
        elif match or (rmgr == "Transaction" and int(xid or 0) not in ours):
            key = "(another database)"
        elif rmgr == "Transaction":
            key = f"(transaction {rtype.lower()})"
        else:
            key = f"({rmgr} {rtype}, no block: not attributed)"
        entry = found[key]
        entry[0] += 1
        entry[1] += length
        entry[2] += fpi
    return {k: (v[0], v[1], v[2]) for k, v in found.items()}


def insert_lsn(pg: psycopg.Connection[Any]) -> str:
    row = pg.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mix", choices=["steady", "churn"], default="steady")
    parser.add_argument("--events", type=int, default=50_000)
    args = parser.parse_args()
    with test_server() as server, scratch_database(server.url, prefix="gpufair_bench") as url:
        migrate.upgrade(url)
        engine = make_engine(url)
        try:
            t0 = time.time() - 3 * 86400
            before, events, n_workloads = bench_ingest.mix_events(args.mix, args.events, t0)
            config, problems = config_from_proto(parse_config(bench_ingest.cluster()))
            assert not problems, problems
            with engine.connect() as conn:
                changes = diff_configs(config_repo.load_config(conn), config)
                config_repo.apply_changes(conn, config, changes)
                config_repo.record_version(conn, changes)
                conn.commit()
            bench_ingest.submit_workloads(engine, n_workloads, t0)
            ingest = Ingest(engine)
            if before:
                reply = ingest.stream(iter(bench_ingest.messages(before, BATCH)))
                bench_ingest.assert_all_stored(
                    [pb.ReportEventsResponse.FromString(reply)], len(before)
                )
            raw = [m.SerializeToString() for m in bench_ingest.messages(events, BATCH)]
            tune_for_serving()
            with psycopg.connect(libpq_url(url), autocommit=True) as pg:
                pg.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
                row = pg.execute(
                    "SELECT oid FROM pg_database WHERE datname = current_database()"
                ).fetchone()
                dboid = int(row[0]) if row else 0
                pg.execute(f"CREATE TABLE {RAW_COPY_TABLE} (LIKE ledger_events INCLUDING ALL)")
                with pg.cursor() as cur, cur.copy(RAW_COPY_SQL.format(table=RAW_COPY_TABLE)) as c:
                    for e in before:
                        c.write_row(raw_row(e))
                rows = [raw_row(e) for e in events]
                a = insert_lsn(pg)
                with (
                    pg.transaction(),
                    pg.cursor() as cur,
                    cur.copy(RAW_COPY_SQL.format(table=RAW_COPY_TABLE)) as c,
                ):
                    for values in rows:
                        c.write_row(values)
                b = insert_lsn(pg)
                c0 = insert_lsn(pg)
                reply = ingest.stream(pb.ReportEventsRequest.FromString(m) for m in raw)
                d = insert_lsn(pg)
                bench_ingest.assert_all_stored(
                    [pb.ReportEventsResponse.FromString(reply)], len(events)
                )
                n = len(events)
                for title, (since, until) in (("raw COPY", (a, b)), ("stream", (c0, d))):
                    found = wal_by_relation(pg, since, until, dboid)
                    total = sum(v[1] for k, v in found.items() if not k.startswith("(another"))
                    print(
                        f"{args.mix}, {title}: {n} events, {total / n:.1f} WAL bytes per event "
                        "(other databases' records left out)"
                    )
                    for k, (count, size, fpi) in sorted(found.items(), key=lambda kv: -kv[1][1]):
                        print(
                            f"  {k:48s} {count / n:8.4f} records/event {size / n:8.1f} B/event"
                            f" (full pages {fpi / n:.1f})"
                        )
        finally:
            engine.dispose()


if __name__ == "__main__":
    main()
