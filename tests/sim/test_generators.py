"""Workload generators: reproducible streams, Poisson arrivals, backlogs that stay full."""

from __future__ import annotations

from sim_support import run, scenario_from, unit_cluster

from gpufair.sim.distributions import constant, parse_distribution
from gpufair.sim.generators import GeneratorSpec, GeneratorStream


def spec(**overrides: object) -> GeneratorSpec:
    fields: dict[str, object] = {
        "name": "g",
        "queue": "team",
        "pool": "default",
        "rate_per_h": 10.0,
        "backlog": None,
        "start_s": 0.0,
        "stop_s": 100 * 3600.0,
        "max_jobs": None,
        "pods": parse_distribution({"choice": [1, 2, 4]}, integer=True),
        "gpus_per_pod": constant(1),
        "duration": parse_distribution({"lognormal": {"median": 3600, "sigma": 1}}),
    }
    fields.update(overrides)
    return GeneratorSpec(**fields)  # type: ignore[arg-type]


def drain(stream: GeneratorStream) -> list[tuple[float, int, float]]:
    jobs = []
    while True:
        at_s = stream.next_arrival_s
        job = stream.poisson_arrival()
        if job is None:
            return jobs
        assert job.workload.submit_time_s == at_s
        jobs.append((at_s, job.workload.pods, job.duration_s))


def test_a_stream_is_the_same_for_the_same_seed_and_differs_for_another() -> None:
    assert drain(GeneratorStream(spec(), seed=1)) == drain(GeneratorStream(spec(), seed=1))
    assert drain(GeneratorStream(spec(), seed=1)) != drain(GeneratorStream(spec(), seed=2))


def test_poisson_arrivals_come_at_the_configured_rate_until_stop() -> None:
    jobs = drain(GeneratorStream(spec(), seed=3))
    # 10 per hour for 100 hours: 1,000 expected, a standard deviation of about 32.
    assert 900 < len(jobs) < 1100
    assert all(at_s < 100 * 3600 for at_s, _, _ in jobs)
    assert {pods for _, pods, _ in jobs} == {1, 2, 4}
    assert len(drain(GeneratorStream(spec(max_jobs=5), seed=3))) == 5


def test_a_backlog_keeps_its_jobs_waiting_as_they_start() -> None:
    data = {
        "name": "backlog",
        "duration_s": "6h",
        "cycle_s": 60,
        "cluster": unit_cluster([("n1", 4)], [{"name": "team"}]),
        "generators": [{"queue": "team", "backlog": 3, "duration_s": "1h"}],
    }
    result, _ = run(scenario_from(data))
    # 4 GPUs, one-GPU jobs of an hour: 4 run at a time, 6 rounds, 3 always waiting.
    started = [j for j in result.jobs if j.first_start_s is not None]
    assert len(started) == 24
    waiting = [j for j in result.jobs if j.pending_since_s is not None]
    assert len(waiting) == 3
