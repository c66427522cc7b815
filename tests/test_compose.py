"""Docker does not run here: check that the compose file and Dockerfile agree with the CLI."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpufair.cli import build_parser
from gpufair.store.database import DATABASE_URL_ENV, normalise_url

ROOT = Path(__file__).resolve().parents[1]


def test_compose_file_runs_the_service_against_its_postgres() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "gpufair"} <= set(services)  # and the monitoring of test_deploy.py
    app = services["gpufair"]
    assert app["image"] == "gpufair:latest" and app["build"] == "."
    url = app["environment"][DATABASE_URL_ENV]
    assert normalise_url(url).startswith("postgresql+psycopg://gpufair:gpufair@postgres:5432/")
    pg_env = services["postgres"]["environment"]
    assert url.endswith(f"@postgres:5432/{pg_env['POSTGRES_DB']}")
    assert app["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "healthcheck" in app and "healthcheck" in services["postgres"]
    assert "pgdata" in compose["volumes"]
    # The command is one the CLI accepts.
    args = build_parser().parse_args(app["command"])
    assert args.command == "serve" and args.address == "0.0.0.0:50051"


def test_dockerfile_installs_the_project_and_serves() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY migrations ./migrations" in dockerfile
    assert 'ENTRYPOINT ["gpufair"]' in dockerfile
    assert "EXPOSE 50051" in dockerfile
    args = build_parser().parse_args(["serve", "--address", "0.0.0.0:50051"])
    assert args.database_url is None  # the URL comes from the environment
