"""Recompute cost must not grow with the ledger: one pool with a small vs a large ledger.

    python bench/bench_recompute.py [--small 10000] [--large 10000000] [--repeat 15]
                                    [--first-rollup-days DAYS] [--drain-hours H]

Two scratch databases hold the same cluster (100 nodes x 8 GPUs, 20 leaf queues in 4
departments, a 7-day sliding window with a 1-day half-life) and the same present (200 running
runs of 2 GPUs, 500 pending workloads). They differ only in how far back their history goes:
past runs start one every 6 minutes (10 an hour) in both, counted back from two hours before
now, so `--small` vs `--large` ledger events (5 per run: start, 3 heartbeats, stop) hold the
same recent runs and the large one older ones too: at 10,000 events the history reaches 8.4
days back, just past the window; at 500,000 about 1.1 years, at 10,000,000 about 23 years. The
window and its edges, where a recompute reads raw runs, hold the same runs in both; what grows
is the older history, the rollups that cover it and the tables' indexes. (Until round 22 both
histories spanned one year, so the large one packed 1,000 x as many runs into every hour,
edges included, and kept about 1,070 of the 800 GPUs busy on average: `results/recompute.md`.)

A past run takes 1-8 GPUs for 300 to 7,199 s; no more than 20 of them overlap at any instant
(starts 6 minutes apart, each over before 2 h), so history holds at most 160 GPUs, and with the
present's 400 the pool's 800 are never exceeded: the peak is computed from the stored runs and
reported (`peak_gpus_busy`), with the average over the history (`mean_gpus_busy`). Each run's
events agree with its interval: started at its start (the interval's start event), heartbeats
at a quarter, half and three quarters of it, stopped at its end. `--small` must reach past the
window's old edge by the longest run, so that edge meets as many runs in both databases.

History is written with SQL (the ingest path has its own benchmark), then rolled up once, untimed
but reported. What is timed is `recompute_pool` — the periodic job: rollups brought up to date,
decayed usage from rollups plus the window's edges, demand, the fair-share division — inside a
transaction that is rolled back, so every repetition sees the same state.

`--drain-hours H` drains node n000 (a config apply, ready=false) H hours before now, while four
of the present's runs hold its 8 GPUs: the usage window's capacity then counts them
(`capacity_repo.usage_capacity`), which reads the node's config history, reports and runs in
the spans a recompute integrates. Without it no node was ever drained. Each recompute's CPU
time in this process (`time.process_time`; PostgreSQL's not counted) is reported beside its
wall time.

`--first-rollup-days DAYS` brings the rollups up that many days at a time, each step in a
transaction of its own, as a periodic job would have over the years; the rollups the recomputes
then read are the same. (Before round 22's spans, one rollup of 23 years failed: over a minute
of Python between two statements, past the engine's idle limit, and more rows than one jsonb
value may hold; `results/recompute.md`.)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable

from sqlalchemy import Connection, Engine, text

from gpufair.api.convert_cluster import config_from_proto
from gpufair.config_file import parse_config
from gpufair.domain.config_diff import diff_configs
from gpufair.services.recompute import recompute_pool
from gpufair.store import capacity_repo, config_repo, migrate, node_history_repo, rollup_repo
from gpufair.store.database import make_engine
from gpufair.store.scratch import scratch_database, test_server

WINDOW_S = 7 * 86400.0  # the pool's `window_s` below
STEP_S = 360.0  # a past run starts every 6 minutes, in both databases
LONGEST_S = 7200.0  # past runs last 300 to 7,199 s; the present's started in the last 2 h
EVENTS_PER_RUN = 5
CAPACITY_GPUS = 100 * 8


def min_events() -> int:
    """The fewest events whose history reaches back past the window's old edge by the longest
    run (so that edge meets the same runs whatever the history's length)."""
    return EVENTS_PER_RUN * math.ceil(WINDOW_S / STEP_S)


def cluster() -> dict[str, object]:
    queues: list[dict[str, object]] = [
        {
            "name": f"dept{d}",
            "quotas": [{"pool": "main", "deserved_cu": 160, "over_quota_weight": 1 + d}],
        }
        for d in range(4)
    ]
    queues += [
        {
            "name": f"team{d}-{t}",
            "parent": f"dept{d}",
            "quotas": [{"pool": "main", "deserved_cu": 30, "over_quota_weight": 1 + t % 3}],
        }
        for d in range(4)
        for t in range(5)
    ]
    return {
        "gpu_types": [{"name": "a100", "memory_gib": 80, "compute_weight": 1}],
        "pools": [{"name": "main", "policy": {"window_s": WINDOW_S, "half_life_s": "1d", "k": 1}}],
        "nodes": [
            {
                "name": f"n{i:03d}",
                "pool": "main",
                "gpu_type": "a100",
                "gpu_count": 8,
                "cpu_millicores": 64000,
                "memory_mib": 524288,
            }
            for i in range(100)
        ],
        "queues": queues,
    }


def history_start_s(events: int, now_s: float) -> float:
    """When the pool's capacity is recorded: a day before the first past run starts."""
    return now_s - LONGEST_S - max(1, events // EVENTS_PER_RUN) * STEP_S - 86400


# Past run i (1 = the latest) starts LONGEST_S + i x STEP_S before now and lasts d seconds.
_PAST_RUNS = """
    WITH runs AS (
        SELECT i, :now - :longest - i * :step AS s, 300 + (i::bigint * 7919) % 6900 AS d
        FROM generate_series(1, :runs) AS i
    )
"""


def apply(conn: Connection, spec: dict[str, object], at_s: float) -> None:
    """A config apply at `at_s`, as `api.config_write.write` makes one (node history too)."""
    config, problems = config_from_proto(parse_config(spec))
    assert not problems
    changes = diff_configs(config_repo.load_config(conn), config)
    node_history_repo.seed_config(conn)
    config_repo.apply_changes(conn, config, changes)
    config_repo.record_version(conn, changes)
    capacity_repo.lock_changes(conn)
    node_history_repo.record_config(conn, at_s)
    capacity_repo.record_if_changed(conn, at_s, "config")


def populate(engine: Engine, events: int, now_s: float, drain_hours: float = 0.0) -> None:
    runs = max(1, events // EVENTS_PER_RUN)
    with engine.begin() as conn:
        apply(conn, cluster(), history_start_s(events, now_s))
        params = {"runs": runs, "now": now_s, "longest": LONGEST_S, "step": STEP_S}
        # Past runs: one every STEP_S, 1-8 GPUs, 5 min to 2 h, on leaf queues.
        conn.execute(
            text(
                _PAST_RUNS
                + """
                INSERT INTO workloads (uid, queue, pool, state, spec, spec_digest, submit_time)
                SELECT 'h' || i, 'team' || (i % 4) || '-' || (i % 5), 'main', 'finished', '{}',
                       md5(i::text), to_timestamp(s)
                FROM runs
                """
            ),
            params,
        )
        conn.execute(
            text(
                _PAST_RUNS
                + """
                INSERT INTO allocation_intervals (workload_uid, start_event_id, queue, pool,
                    gpu_type, gpus, cu, started_at, ended_at, end_kind, pods)
                SELECT 'h' || i, md5('e' || i || '-0')::uuid, 'team' || (i % 4) || '-' || (i % 5),
                       'main', 'a100', 1 + i % 8, 1 + i % 8, to_timestamp(s), to_timestamp(s + d),
                       'stopped', '[]'::jsonb
                FROM runs
                """
            ),
            params,
        )
        # Started at the interval's start, heartbeats at 1/4, 1/2 and 3/4, stopped at its end.
        conn.execute(
            text(
                _PAST_RUNS
                + """
                INSERT INTO ledger_events (event_id, workload_uid, kind, occurred_at, payload,
                                           payload_digest)
                SELECT md5('e' || i || '-' || k)::uuid, 'h' || i,
                       CASE k WHEN 0 THEN 'started' WHEN 4 THEN 'stopped' ELSE 'heartbeat' END,
                       to_timestamp(s + d * k / 4.0::float8), '{}'::jsonb, md5(i || '-' || k)
                FROM runs, generate_series(0, 4) AS k
                """
            ),
            params,
        )
        # The present, identical in both databases: 200 running runs and 500 pending workloads.
        conn.execute(
            text(
                """
                INSERT INTO workloads (uid, queue, pool, state, spec, spec_digest, submit_time)
                SELECT 'r' || i, 'team' || (i % 4) || '-' || (i % 5), 'main', 'running',
                       jsonb_build_object('uid', 'r' || i, 'queue', 'team' || (i % 4) || '-' || (i % 5),
                           'pool', 'main', 'pods', 1, 'gpus_per_pod', 2, 'submit_time_s', :now - 7200),
                       md5('r' || i), to_timestamp(:now - 7200)
                FROM generate_series(1, 200) AS i
                """
            ),
            params,
        )
        conn.execute(
            text(
                """
                INSERT INTO allocation_intervals (workload_uid, start_event_id, queue, pool,
                    gpu_type, gpus, cu, started_at, ended_at, end_kind, pods)
                SELECT 'r' || i, md5('r' || i)::uuid, 'team' || (i % 4) || '-' || (i % 5), 'main',
                       'a100', 2, 2, to_timestamp(:now - 7200 + i), NULL, NULL, '[]'::jsonb
                FROM generate_series(1, 200) AS i
                """
            ),
            params,
        )
        conn.execute(
            text(
                """
                INSERT INTO workloads (uid, queue, pool, state, spec, spec_digest, submit_time)
                SELECT 'p' || i, 'team' || (i % 4) || '-' || (i % 5), 'main', 'pending',
                       jsonb_build_object('uid', 'p' || i, 'queue', 'team' || (i % 4) || '-' || (i % 5),
                           'pool', 'main', 'pods', 1 + i % 4, 'gpus_per_pod', 1,
                           'submit_time_s', :now - 600),
                       md5('p' || i), to_timestamp(:now - 600)
                FROM generate_series(1, 500) AS i
                """
            ),
            params,
        )
        if drain_hours:
            # r1-r4 hold n000's 8 GPUs, 2 each; n000 is drained under them.
            conn.execute(
                text(
                    """
                    UPDATE allocation_intervals SET pods = jsonb_build_array(jsonb_build_object(
                        'node', 'n000', 'gpu_indices',
                        jsonb_build_array(2 * (i - 1), 2 * (i - 1) + 1), 'gpu_fraction', 1.0))
                    FROM generate_series(1, 4) AS i WHERE workload_uid = 'r' || i
                    """
                )
            )
            drained = cluster()
            nodes = drained["nodes"]
            assert isinstance(nodes, list)
            nodes[0] = {**nodes[0], "ready": False}
            apply(conn, drained, now_s - drain_hours * 3600)
    with engine.connect() as conn:
        conn.execute(text("ANALYZE"))
        conn.commit()


_BUSY_SQL = text(
    """
    WITH edges AS (
        SELECT started_at AS at, gpus AS change FROM allocation_intervals WHERE pool = 'main'
        UNION ALL
        SELECT ended_at, -gpus FROM allocation_intervals
        WHERE pool = 'main' AND ended_at IS NOT NULL
    )
    SELECT (SELECT max(busy) FROM (
                SELECT sum(change) OVER (ORDER BY at, change) AS busy FROM edges) AS b),
           (SELECT sum(gpus * extract(epoch FROM coalesce(ended_at, to_timestamp(:now))
                                                  - started_at))
                   / (:now - extract(epoch FROM min(started_at)))
            FROM allocation_intervals WHERE pool = 'main')
    """
)


def busy_gpus(engine: Engine, now_s: float) -> tuple[float, float]:
    """The most GPUs the stored runs ever held at once (runs end before an instant where others
    start: [start, end)), and how many on average from the first start to now."""
    with engine.connect() as conn:
        peak, mean = conn.execute(_BUSY_SQL, {"now": now_s}).one()
    return float(peak), float(mean)


def prepare(
    url: str, events: int, now_s: float, first_rollup_days: float = 0.0, drain_hours: float = 0.0
) -> tuple[Engine, dict[str, float]]:
    migrate.upgrade(url)
    engine = make_engine(url, pool_size=2, statement_timeout_ms=3_600_000)
    start = time.perf_counter()
    populate(engine, events, now_s, drain_hours)
    populate_s = time.perf_counter() - start
    peak, mean = busy_gpus(engine, now_s)
    if peak > CAPACITY_GPUS:
        raise RuntimeError(f"the history holds {peak} GPUs at once, over the {CAPACITY_GPUS}")
    start = time.perf_counter()
    with engine.connect() as conn:
        config = config_repo.load_config(conn)
        pool = config.pool("main")
        # In steps, when asked: each brings the rollups up to its end, as the periodic job does.
        step_s = first_rollup_days * 86400
        until_s = history_start_s(events, now_s) + step_s
        while step_s and until_s < now_s:
            rollup_repo.rollup_pool(conn, config, pool, until_s)
            conn.commit()
            until_s += step_s
        rollup_repo.rollup_pool(conn, config, pool, now_s)
        conn.commit()
    runs = max(1, events // EVENTS_PER_RUN)
    return engine, {
        "events": events,
        "history_days": round((LONGEST_S + runs * STEP_S) / 86400, 1),
        "peak_gpus_busy": peak,
        "mean_gpus_busy": round(mean, 1),
        "populate_s": round(populate_s, 1),
        "first_rollup_s": round(time.perf_counter() - start, 1),
    }


def recompute_s(
    engine: Engine, now_s: float, before: Callable[[Connection], None] | None = None
) -> float:
    """One `recompute_pool` timed, after `before` (untimed) in the same transaction, which is
    rolled back."""
    return recompute_times(engine, now_s, before)[0]


def recompute_times(
    engine: Engine, now_s: float, before: Callable[[Connection], None] | None = None
) -> tuple[float, float]:
    """`recompute_s`'s wall time, and this process's CPU time over the same recompute."""
    with engine.connect() as conn:
        if before is not None:
            before(conn)
        start, cpu = time.perf_counter(), time.process_time()
        recompute_pool(conn, "main", now_s)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        conn.rollback()
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--large", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument(
        "--first-rollup-days",
        type=float,
        default=0.0,
        help="the first rollup in steps of this many days of history (default: one rollup)",
    )
    parser.add_argument(
        "--drain-hours",
        type=float,
        default=0.0,
        help="drain node n000 this many hours before now, under 8 GPUs of running work",
    )
    args = parser.parse_args()
    if min(args.small, args.large) < min_events():
        parser.error(f"a ledger of fewer than {min_events()} events does not cover the window")
    now_s = time.time()
    with (
        test_server() as server,
        scratch_database(server.url, prefix="gpufair_bench") as small_url,
        scratch_database(server.url, prefix="gpufair_bench") as large_url,
    ):
        small, small_info = prepare(
            small_url, args.small, now_s, args.first_rollup_days, args.drain_hours
        )
        large, large_info = prepare(
            large_url, args.large, now_s, args.first_rollup_days, args.drain_hours
        )
        try:
            for engine in (small, large):  # warm caches and connections alike
                recompute_s(engine, now_s)
            times: dict[str, list[float]] = {"small": [], "large": []}
            cpu: dict[str, list[float]] = {"small": [], "large": []}
            # Interleaved, so that whatever else the machine does hits both alike.
            for _ in range(args.repeat):
                for key, engine in (("small", small), ("large", large)):
                    wall_s, cpu_s = recompute_times(engine, now_s)
                    times[key].append(wall_s)
                    cpu[key].append(cpu_s)
        finally:
            small.dispose()
            large.dispose()
    for info, key in ((small_info, "small"), (large_info, "large")):
        info["drain_hours"] = args.drain_hours
        info["recompute_median_ms"] = round(1000 * statistics.median(times[key]), 1)
        info["recompute_p90_ms"] = round(
            1000 * sorted(times[key])[int(0.9 * (len(times[key]) - 1))], 1
        )
        info["recompute_cpu_median_ms"] = round(1000 * statistics.median(cpu[key]), 2)
        print(json.dumps(info))
    ratio = statistics.median(times["large"]) / statistics.median(times["small"])
    print(json.dumps({"ratio_large_to_small": round(ratio, 3), "target": 1.5}))


if __name__ == "__main__":
    main()
